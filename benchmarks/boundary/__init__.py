"""The trust boundary: the kernel jail's cost, the front-to-worker channel, jailed workers against env code in process."""
