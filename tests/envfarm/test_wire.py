"""The lease-id format and the owner-grouped fan-out, written once for SDK, front and in-cluster
clients."""

from __future__ import annotations

import re

import pytest

from envfarm.wire import (
    LEASE_ID_PATTERN,
    OWNER_PATTERN,
    by_owner,
    new_lease_id,
    new_owner_tag,
    owner_of,
)


def test_lease_ids_name_their_owner():
    owner = new_owner_tag()
    lease_id = new_lease_id(owner)
    assert re.fullmatch(OWNER_PATTERN.strip("^$"), owner)
    assert re.fullmatch(LEASE_ID_PATTERN.strip("^$"), lease_id)
    assert owner_of(lease_id) == owner and owner_of("nodash") == ""


async def test_by_owner_sends_one_request_per_owner_and_keeps_the_order():
    items = [("a", "r1-01"), ("a", "r2-02"), ("b", "r1-03"), ("a", "r1-04")]
    sent = []

    async def send(env, owner, group):
        sent.append((env, owner, [lease for _, lease in group]))
        return [f"done {lease}" for _, lease in group]

    out = await by_owner(items, lambda item: item, send)
    assert out == [f"done {lease}" for _, lease in items]
    assert sorted(sent) == [("a", "r1", ["r1-01", "r1-04"]), ("a", "r2", ["r2-02"]),
                            ("b", "r1", ["r1-03"])]


async def test_by_owner_refuses_a_short_answer():
    async def send(env, owner, group):
        return []

    with pytest.raises(ValueError):
        await by_owner([("a", "r1-01")], lambda item: item, send)
