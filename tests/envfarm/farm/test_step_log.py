"""A lease's record of its episode's calls: what it keeps, and that a long-held lease's record
stays small (a dict per call grew a 1,024-lease soak's replicas by ~175 KB a lease)."""

from __future__ import annotations

import tracemalloc

from envfarm.farm._lease import StepLog


def test_it_keeps_each_call_in_order_up_to_its_limit():
    log = StepLog()
    log.append("search_hotels", "ok")
    log.append("book", "invalid_arguments")
    log.append("search_hotels", "env_error")
    assert list(log) == [{"tool": "search_hotels", "ok": True, "outcome": "ok"},
                         {"tool": "book", "ok": False, "outcome": "invalid_arguments"},
                         {"tool": "search_hotels", "ok": False, "outcome": "env_error"}]
    for k in range(2 * StepLog.LIMIT):
        log.append(f"made_up_{k}", "unknown_tool")  # every name new: the table stays bounded
    assert len(log) == StepLog.LIMIT and len(log._names) <= 2 * StepLog.LIMIT
    assert list(log)[-1]["tool"] == f"made_up_{StepLog.LIMIT - 4}"
    log.clear()
    assert len(log) == 0 and list(log) == []


def test_a_copy_goes_its_own_way_and_names_are_cut():
    log = StepLog()
    log.append("x" * 10_000, "unknown_tool")
    twin = log.copy()
    twin.append("list_wishlists", "ok")
    assert len(log) == 1 and len(twin) == 2
    assert list(log)[0]["tool"] == "x" * 128


def test_a_thousand_calls_cost_a_few_kilobytes():
    tools = ["search_hotels", "get_hotel", "book_room", "list_wishlists"]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = StepLog()
        for k in range(StepLog.LIMIT):
            log.append(tools[k % 4], "ok")
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(log) == StepLog.LIMIT
    assert kept < 12_000, kept  # a dict per call: ~190,000
