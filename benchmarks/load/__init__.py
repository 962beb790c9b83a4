"""Load over time: the soak (1,024 leases, RSS per process group), locust, and the HTTP load generators the other benchmarks share."""
