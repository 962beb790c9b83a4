"""EnvFactory's values drawn consistently: ids that belong together and to the acting user."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from envfarm import EnvRuntime
from synth.factory.consistent import Draw, relations
from synth.factory.dbvalues import db_columns
from synth.factory.execute import execute_chain, execute_drawing
from synth.factory.model import Binding, Chain, Step

_DDL = """
CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE hotels (id INTEGER PRIMARY KEY, city TEXT);
CREATE TABLE room_types (id INTEGER PRIMARY KEY, hotel_id INTEGER REFERENCES hotels(id), name TEXT);
CREATE TABLE bookings (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id),
                       room_type_id INTEGER REFERENCES room_types(id));
INSERT INTO users VALUES (1, 'Ann'), (2, 'Bo');
INSERT INTO hotels VALUES (1, 'Lisbon'), (2, 'Porto'), (3, 'Faro');
INSERT INTO room_types VALUES (10, 1, 'single'), (11, 1, 'double'), (20, 2, 'suite'), (30, 3, 'loft');
INSERT INTO bookings VALUES (100, 1, 10), (101, 2, 20), (102, 2, 30), (103, 1, 11);
CREATE TABLE transfers (id INTEGER PRIMARY KEY, sender_id INTEGER REFERENCES users(id),
                        recipient_id INTEGER REFERENCES users(id));
INSERT INTO transfers VALUES (200, 1, 2), (201, 2, 1), (202, 1, 1);
"""


@pytest.fixture(scope="module")
def data() -> bytes:
    conn = sqlite3.connect(":memory:")
    conn.executescript(_DDL)
    return conn.serialize()


def test_ids_belong_to_the_acting_user_and_to_each_other(data) -> None:
    draw = Draw(relations(data, "CURRENT_USER_ID = 2\n"))
    assert draw.column("bookings", "id") == [101, 102]                # Bo's bookings only
    assert draw.column("transfers", "id") == [200, 201]               # sent or received by Bo
    draw.took("bookings", "id", 102)
    assert draw.column("room_types", "id") == [30]                     # the booked room ...
    assert draw.column("hotels", "id") == [3] and draw.column("hotels", "city") == ["Faro"]  # ... of its hotel
    assert draw.prefer("hotels", "id", [1, 2, 3]) == [3]               # an earlier call's hotels, narrowed
    assert draw.prefer("hotels", "id", [1, 2]) == [1, 2] and draw.unpinned == 1  # none agrees: all, counted


def test_without_an_acting_user_the_first_id_pins_the_rest(data) -> None:
    draw = Draw(relations(data))
    assert draw.column("bookings", "id") == [100, 101, 102, 103]
    draw.took("room_types", "id", 11)                                  # a double room in Lisbon
    assert draw.column("bookings", "id") == [103] and draw.column("users", "name") == ["Ann", "Bo"]
    draw.took("bookings", "id", 103)                                   # the booking of that room: its user
    assert draw.column("users", "name") == ["Ann"] and draw.column("room_types", "id") == [11]
    assert draw.column("transfers", "id") == [200, 201, 202] and draw.unpinned == 0  # each involves Ann
    other = Draw(relations(data))
    other.took("transfers", "id", 200)                                  # Ann to Bo: neither is "the" user
    assert "users" not in other.pins and other.column("bookings", "id") == [100, 101, 102, 103]


@pytest.fixture(scope="module")
def hotel(bundled_catalog) -> EnvRuntime:
    return EnvRuntime(bundled_catalog["hotel_booking_1"])


def _chain(*steps: Step) -> Chain:
    return Chain(env="hotel_booking_1", chain_id="values", steps=list(steps))


def test_a_chain_draws_the_users_reservation_and_its_hotel(hotel) -> None:
    columns = db_columns(hotel.template.data)
    chain = _chain(Step(tool="get_reservation", bindings={"reservation_id": Binding(kind="db", table="reservations", column="id")}),
                   Step(tool="get_hotel_details", bindings={"hotel_id": Binding(kind="db", table="hotels", column="id")}))

    rows = {r["id"]: r for r in relations(hotel.template.data).rows["reservations"]}

    def drawn(consistent: bool) -> list[tuple[dict, int]]:
        out = []
        for seed in range(8):
            ex = asyncio.run(execute_chain(hotel, chain, columns, seed, consistent=consistent))
            out.append((rows[ex.calls[0].arguments["reservation_id"]], ex.calls[1].arguments["hotel_id"] if
                        len(ex.calls) > 1 else None))
        return out

    for reservation, hotel_id in drawn(True):                          # the user's (1) own, and its hotel
        assert reservation["user_id"] == 1 and hotel_id == reservation["hotel_id"]
    independent = drawn(False)
    assert any(r["user_id"] != 1 or hotel_id != r["hotel_id"] for r, hotel_id in independent)


def test_a_refused_step_is_drawn_again_with_other_values(hotel) -> None:
    """Cancelling: 4 of the user's 10 reservations are completed or cancelled (409). A step the env
    refuses is called again with a value it has not tried; a failed call changes nothing, so only
    the accepted call is recorded. Across runs, each redraw avoids the values that failed."""
    columns = db_columns(hotel.template.data)
    chain = _chain(Step(tool="cancel_reservation", bindings={
        "reservation_id": Binding(kind="db", table="reservations", column="id"), "reason": Binding(kind="task")}))
    once = [asyncio.run(execute_chain(hotel, chain, columns, seed, step_tries=1)) for seed in range(8)]
    assert any(ex.drop == "call_failed" for ex in once)
    for seed in range(8):                                               # 5 calls: past the 4 refused values
        ex = asyncio.run(execute_chain(hotel, chain, columns, seed, step_tries=5))
        assert not ex.drop and len(ex.calls) == 1 and ex.calls[0].ok and ex.changed
    redraws = 0
    for seed in range(4):
        drawn = asyncio.run(execute_drawing(hotel, chain, columns, seed, step_tries=1))
        failed = [d.executed.calls[-1].arguments["reservation_id"] for d in drawn[:-1]]
        assert drawn[-1].executed.drop == "" and len(failed) == len(set(failed)) <= 4
        for k, d in enumerate(drawn):                                   # each redraw is told every failed value
            assert {(0, "reservation_id", repr(v)) for v in failed[:k]} <= d.kwargs["avoid"]
        redraws += len(failed)
    assert redraws >= 2
    others = frozenset((0, "reservation_id", repr(v)) for v in range(1, 11) if v != 4)
    for seed in range(4):                                               # an avoided value is not drawn while another is left
        ex = asyncio.run(execute_chain(hotel, chain, columns, seed, step_tries=1, avoid=others))
        assert ex.calls[0].arguments["reservation_id"] == 4 and not ex.drop
