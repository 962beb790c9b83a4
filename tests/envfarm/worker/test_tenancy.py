"""Tenant-aware placement (issue 34 §3), through the farm's HTTP API.

Env code one tenant's calls set off reached the runtime through ``sys.modules`` and patched it
in the worker it shared with another tenant's leases (placement was first-fit, blind to
tenants): the other tenant's untouched lease then listed and snapshotted forged rows (its
verification read them). A worker now holds the leases of one tenant for life (keyless
loopback use is a tenant of its own): within a tenant, leases of one env type trust that env's
code; across tenants, never.
"""

from __future__ import annotations

import pytest

from tests.envfarm.worker.conftest import start_farm
from tests.envfarm.worker.farm_api import KEYS, lease, two_tenants
from tests.envfarm.worker.tenancy_env import CODE

pytestmark = pytest.mark.slow
FORGED = "forged-by-a-neighbour"


@pytest.fixture(scope="module")
def farm():
    tenants = two_tenants()
    farm = start_farm({"tenancy": CODE, "shared": CODE}, call_timeout_s=2.0,
                      leases_per_worker=8, check_module_state=False, tenants=tenants)
    yield farm
    farm.stop()



async def test_a_worker_holds_the_leases_of_one_tenant_only(http, farm):
    by_tenant = {}
    for name in ("alpha", "beta", None):  # None: keyless, a tenant of its own
        leases = [await lease(http, "tenancy", KEYS.get(name)) for _ in range(3)]
        by_tenant[name] = {await held.pid() for held in leases}
    assert all(len(pids) == 1 for pids in by_tenant.values()), by_tenant  # packed within
    assert len(set().union(*by_tenant.values())) == 3, by_tenant  # never across
    served = farm.core.envs["tenancy"]
    assert all(len({h.tenant for h in w.held}) <= 1 for w in served.workers)


async def test_env_code_set_off_by_one_tenant_cannot_forge_anothers_state(http):
    victim = await lease(http, "shared", KEYS["beta"])
    attacker = await lease(http, "shared", KEYS["alpha"])
    teammate = await lease(http, "shared", KEYS["alpha"])  # the attacker's own tenant
    initial = await http.get(victim.path + "/snapshot", headers=victim.auth,
                             params={"which": "initial"})
    r = await attacker.call("poison")
    assert r.json()["ok"] and r.json()["result"]["poisoned"], r.text
    # the poison took where it ran: within a tenant, leases of one type trust its code
    assert FORGED in await teammate.titles()
    # another tenant's lease, made before the attack and after, sees none of it
    later = await lease(http, "shared", KEYS["beta"])
    for held in (victim, later):
        assert FORGED not in await held.titles()
    current = await http.get(victim.path + "/snapshot", headers=victim.auth)
    assert current.status_code == 200 and current.content == initial.content
    keyless = await lease(http, "shared")
    assert FORGED not in await keyless.titles()
