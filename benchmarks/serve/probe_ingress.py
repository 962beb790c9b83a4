"""Trivial FastAPI ingress under Serve: default Python proxy vs HAProxy ingress (issue 9 probe).

Run inside a private network namespace; the env vars pick the mode (set before Ray starts):
  unshare --net sh -c 'ip link set lo up && exec python benchmarks/serve/probe_ingress.py [--haproxy]'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

if "--haproxy" in sys.argv:
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"

import ray  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from ray import serve  # noqa: E402

api = FastAPI()


@serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class Echo:
    @api.post("/echo")
    async def echo(self, body: dict) -> dict:
        return body


LUA = 'wrk.method="POST"\nwrk.body=\'{"a":1}\'\nwrk.headers["Content-Type"]="application/json"\n'


def wrk(conns: int, secs: int = 5) -> dict:
    with open("/tmp/probe.lua", "w") as f:
        f.write(LUA)
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency", "-s",
                          "/tmp/probe.lua", "http://127.0.0.1:8000/echo"],
                         capture_output=True, text=True, check=True).stdout
    rps = float(next(l for l in out.splitlines() if l.startswith("Requests/sec")).split()[1])
    p50 = next(l for l in out.splitlines() if l.strip().startswith("50%")).split()[1]
    errs = [l.strip() for l in out.splitlines() if "Non-2xx" in l or "Socket errors" in l]
    return {"conns": conns, "req_s": rps, "p50": p50, "errors": errs}


ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": 8000})
serve.run(Echo.bind(), route_prefix="/")
for _ in range(50):
    try:
        req = urllib.request.Request("http://127.0.0.1:8000/echo", data=b'{"a":1}',
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=2).read()
        break
    except Exception:
        time.sleep(0.5)
res = {"mode": "haproxy" if "--haproxy" in sys.argv else "python-proxy",
       "runs": [wrk(1), wrk(32)]}
print(json.dumps(res))
serve.shutdown()
ray.shutdown()
