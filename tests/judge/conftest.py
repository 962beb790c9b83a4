"""Fixtures of the judge tests: real AWM e_commerce_33 databases and verifiers, a sandbox."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from judge import ToolSchema, Trajectory, VerifierSandbox

from tests.conftest import AWM_SAMPLES as SAMPLES
SCENARIO = "e_commerce_33"


def _record(name: str, scenario: str = SCENARIO) -> dict[str, Any]:
    for line in (SAMPLES / name).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("scenario") == scenario:
            return rec
    raise LookupError(f"{scenario} not in {name}")


def build_initial_db() -> bytes:
    """e_commerce_33's template database, built with plain sqlite3 from gen_db + gen_sample."""
    conn = sqlite3.connect(":memory:")
    for table in _record("gen_db.jsonl")["db_schema"]["tables"]:
        conn.execute(table["ddl"])
        for index in table.get("indexes") or []:
            conn.execute(index)
    for table in _record("gen_sample.jsonl")["sample_data"]["tables"]:
        for stmt in table["insert_statements"]:
            conn.execute(stmt)
    conn.commit()
    data = conn.serialize()
    conn.close()
    return data


def _mutate(initial: bytes, statements: list[str]) -> bytes:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(initial)
    for stmt in statements:
        conn.execute(stmt)
    conn.commit()
    data = conn.serialize()
    conn.close()
    return data


# The reference solution of tasks 0-2, written as the rows a correct agent leaves behind.
SOLUTIONS: dict[int, list[str]] = {
    # top-rated wireless noise-cancelling headphones under $200: offer 1, quantity 1
    0: ["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 1, 1)"],
    # reorder of the latest paper-towel order: offer 8, quantity 1
    1: ["INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 8, 1)"],
    # wishlist with the three best-selling air fryers under $150
    2: [
        ("INSERT INTO wishlists (id, user_id, name, is_default) "
         "VALUES (100, 1, 'Kitchen Upgrades 2025', 0)"),
        """INSERT INTO wishlist_items (wishlist_id, product_id)
           SELECT 100, p.id FROM products p
           JOIN product_categories c ON c.id = p.category_id AND c.name = 'Air Fryers'
           JOIN product_aggregates a ON a.product_id = p.id
           WHERE EXISTS (SELECT 1 FROM product_offers o
                         WHERE o.product_id = p.id AND o.is_active = 1 AND o.price < 150)
           ORDER BY a.sales_rank, p.id LIMIT 3""",
    ],
}


class AwmCase:
    """One real task: its verifiers and the initial / solved / wrong databases."""

    def __init__(self, idx: int, initial: bytes) -> None:
        self.idx = idx
        self.task = _record("gen_tasks.jsonl")["tasks"][idx]
        sql = [json.loads(x) for x in (SAMPLES / "gen_verifier.jsonl").read_text().splitlines()]
        code = [json.loads(x) for x in
                (SAMPLES / "gen_verifier.pure_code.jsonl").read_text().splitlines()]
        self.sql = next(r["verification"] for r in sql if r["task_idx"] == idx)
        self.code = next(r["verification"] for r in code if r["task_idx"] == idx)
        self.initial = initial
        self.solved = _mutate(initial, SOLUTIONS[idx])
        # A wrong action: the cheapest item in the catalog added to the cart.
        self.wrong = _mutate(initial, [
            "INSERT INTO cart_items (cart_id, product_offer_id, quantity) VALUES (1, 3, 2)"])


@pytest.fixture(scope="session")
def awm_initial_db(awm_samples: Path) -> bytes:
    # awm_samples (tests/conftest.py) skips, with the path it looked at, when ../shared is absent.
    return build_initial_db()


@pytest.fixture(scope="session")
def awm_cases(awm_initial_db: bytes) -> dict[int, AwmCase]:
    return {i: AwmCase(i, awm_initial_db) for i in SOLUTIONS}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[VerifierSandbox]:
    with VerifierSandbox(workers=2, timeout_s=5.0, memory_mb=512) as sb:
        yield sb


@pytest.fixture
def small_dbs(tmp_path: Path) -> tuple[Path, Path]:
    """Two tiny database files: ``t`` holds one row before and two rows after."""
    paths = []
    for name, rows in (("before.db", [1]), ("after.db", [1, 2])):
        conn = sqlite3.connect(tmp_path / name)
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(r,) for r in rows])
        conn.commit()
        conn.close()
        paths.append(tmp_path / name)
    return paths[0], paths[1]


# -- trajectories ----------------------------------------------------------------------------

SHOP_TOOLS = [
    {"name": "search_products", "description": "Full-text product search",
     "input_schema": {"type": "object", "properties": {
         "query": {"type": "string"}, "category_id": {"type": "integer"}},
         "required": ["query"], "additionalProperties": False}},
    {"name": "add_item_to_cart", "description": "Add an offer to the active cart",
     "input_schema": {"type": "object", "properties": {
         "product_offer_id": {"type": "integer"}, "quantity": {"type": "integer", "minimum": 1}},
         "required": ["product_offer_id", "quantity"]}},
]


class TrajBuilder:
    """Writes Qwen3-format trajectories against two e-commerce tools, one step at a time."""

    def __init__(self, task: str) -> None:
        self.task = task
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful shopping agent."},
            {"role": "user", "content": task},
        ]

    def say(self, content: str) -> TrajBuilder:
        self.messages.append({"role": "assistant", "content": content})
        return self

    def tool(self, payload: Any) -> TrajBuilder:
        content = payload if isinstance(payload, str) else json.dumps(payload)
        self.messages.append({"role": "tool", "content": content})
        return self

    def call(self, name: str, arguments: Any, think: str = "I should use a tool.") -> TrajBuilder:
        body = json.dumps({"name": name, "arguments": arguments})
        return self.say(f"<think>{think}</think>\n<tool_call>{body}</tool_call>")

    def list_tools(self) -> TrajBuilder:
        self.call("list_tools", {}, think="First, which tools exist?")
        return self.tool({"ok": True, "result": SHOP_TOOLS})

    def use(self, tool: str, args: dict[str, Any], result: Any = None, *,
            ok: bool = True, kind: str = "agent_error") -> TrajBuilder:
        self.call("call_tool", {"tool_name": tool, "arguments": json.dumps(args)},
                  think=f"Now {tool}.")
        if ok:
            return self.tool({"ok": True, "result": result if result is not None else {}})
        return self.tool({"ok": False, "error": {"kind": kind, "message": "it failed"}})

    def final(self, text: str = "Done: added to your cart.") -> TrajBuilder:
        return self.say(f"<think>The task is finished.</think>\n{text}")

    def build(self) -> Trajectory:
        return Trajectory.model_validate({"task": self.task, "messages": self.messages})


def good_trajectory(task: str = "Add the top-rated headphones under $200 to my cart.") -> TrajBuilder:
    return (TrajBuilder(task).list_tools()
            .use("search_products", {"query": "wireless noise cancelling headphones"},
                 [{"product_id": 1, "offer_id": 1, "price": 149.99, "rating": 4.5}])
            .use("add_item_to_cart", {"product_offer_id": 1, "quantity": 1}, {"cart_item_id": 4})
            .final())


@pytest.fixture
def shop_tools() -> list[ToolSchema]:
    return [ToolSchema.model_validate(t) for t in SHOP_TOOLS]


@pytest.fixture
def traj() -> type[TrajBuilder]:
    return TrajBuilder


@pytest.fixture
def good_traj() -> TrajBuilder:
    return good_trajectory()
