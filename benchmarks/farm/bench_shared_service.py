"""What the shared-service checks add to one request, in-process (no server): the hostile-JSON
check every body goes through (``envfarm.farm._json_guard.hostile``) against the plain
``json.loads`` the routes do anyway, and a tenant's call admission with and without a quota.

    python benchmarks/farm/bench_shared_service.py [--rounds 7] [--number 20000]

Prints JSON: per case the median over rounds of the best microseconds per operation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from envfarm.farm import Tenant, Tenants, TenantsConfig, hash_key
from envfarm.farm._json_guard import hostile

CALL = json.dumps({"tool": "search_hotels", "arguments": {
    "city": "Lisbon", "check_in_date": "2027-03-14", "check_out_date": "2027-03-17",
    "guests": 2, "min_stars": 4.5}}).encode()
MCP = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
    "name": "search_hotels", "arguments": {"city": "Lisbon", "guests": 2}}}).encode()


def per_op_us(fn, number: int, rounds: int) -> float:
    best = [min(timeit.repeat(fn, number=number, repeat=3)) / number * 1e6
            for _ in range(rounds)]
    return round(statistics.median(best), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args()
    quota = Tenants(TenantsConfig(tenants=[
        Tenant(name="t", key_sha256=hash_key("k"), calls_per_s=1e12)]))
    open_farm = Tenants(TenantsConfig())
    cases = {
        "json.loads /call body": lambda: json.loads(CALL),
        "hostile() /call body": lambda: hostile(CALL),
        "json.loads MCP tools/call": lambda: json.loads(MCP),
        "hostile() MCP tools/call": lambda: hostile(MCP),
        "admit_call, tenant with calls_per_s": lambda: quota.admit_call("t"),
        "admit_call, open farm (no quota)": lambda: open_farm.admit_call("anonymous"),
    }
    out = {"machine": platform.platform(), "cpus": os.cpu_count(),
           "load_1min_start": os.getloadavg()[0], "started": time.strftime("%Y-%m-%dT%H:%M%z"),
           "us_per_op": {name: per_op_us(fn, args.number, args.rounds)
                         for name, fn in cases.items()}}
    out["load_1min_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
