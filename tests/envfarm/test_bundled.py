"""The bundled starter catalog: realistic sizes, and every task proven solvable."""

from __future__ import annotations

import pytest

from envfarm.check import check_env

BUNDLED = ["hotel_booking_1", "personal_banking_1", "project_management_1"]


def test_bundled_catalog_has_three_complete_envs(bundled_catalog):
    assert bundled_catalog.names == BUNDLED
    assert bundled_catalog.problems == []
    for name in BUNDLED:
        b = bundled_catalog[name]
        assert b.problems == [], (name, b.problems)
        assert len(b.db_schema.tables) >= 12
        assert sum(len(t.insert_statements) for t in b.sample_data.tables) >= 100
        assert len(b.tasks) == 10
        assert sorted(b.verifiers) == sorted(b.code_verifiers) == sorted(b.solutions) == list(range(10))
        for v in b.verifiers.values():
            assert {"success_criteria", "failure_criteria"} <= set(v.criteria)


@pytest.fixture(scope="module")
def sandbox():
    from judge import VerifierSandbox

    with VerifierSandbox(workers=2) as sb:
        yield sb


@pytest.mark.parametrize("name", BUNDLED)
async def test_every_reference_solution_passes_and_every_noop_fails(bundled_catalog, sandbox, name):
    report = await check_env(bundled_catalog[name], sandbox, probe=True)
    assert report.loaded and report.problems == []
    assert report.tables >= 12 and report.rows >= 100 and report.tools >= 25
    assert [t.task_idx for t in report.task_checks] == list(range(10))
    for task in report.task_checks:
        assert task.solution_result == "complete", task
        assert task.noop_result != "complete", task
        assert task.solvable
    assert report.solvable == 10
