"""The farm core, the SDK and the CLI glue import and serve without Ray."""

from __future__ import annotations

import subprocess
import sys

_BLOCK = """
import sys
class _NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("ray is blocked in this test")
sys.meta_path.insert(0, _NoRay())
import envfarm.farm, envfarm.client, cluster.cli_farm
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app
core = FarmCore(FarmConfig(envs=["hotel_booking_1"], pool=PoolConfig(warm=1)))
build_app(core)
assert "ray" not in sys.modules
print("ok")
"""


def test_farm_runs_with_ray_blocked():
    out = subprocess.run([sys.executable, "-c", _BLOCK], check=False, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
