"""The Grafana dashboard (k8s/grafana/) queries only metrics the farm really exports, and every
family it exports is on the dashboard. Metric names come from each PromQL expression; the
exposition comes from a real farm app's /metrics after calls, a verification and a release."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from envfarm.asgi import call_asgi
from envfarm.farm import FarmConfig, FarmCore, PoolConfig, build_app

DASHBOARD = Path(__file__).resolve().parents[2] / "k8s" / "grafana" / "envfarm-dashboard.json"
ENV = "hotel_booking_1"

# PromQL words that look like metric names: aggregation modifiers, set operators, literals.
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "and", "or", "unless", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric (sample) names a PromQL expression selects."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery selectors
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\b\d+(ms|[smhdwy])\b", "", expr)  # durations (offset 5m)
    expr = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?\b", "", expr)  # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if m.group() in _KEYWORDS or expr[m.end():].lstrip().startswith("("):
            continue  # a keyword or a function
        names.add(m.group())
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every panel target's expr (rows' nested panels too) and each variable's metric."""
    out = []
    stack = list(dashboard["panels"])
    while stack:
        panel = stack.pop()
        stack.extend(panel.get("panels", []))
        out.extend(t["expr"] for t in panel.get("targets", []))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            # Grafana's label_values(metric, label) is no PromQL: keep the selector only.
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", var["definition"])
            assert m, var["definition"]
            out.append(m.group(1))
    return out


async def farm_exposition() -> str:
    """/metrics of a farm app after ok and failed calls, a verification and a release."""
    app = build_app(FarmCore(FarmConfig(envs=[ENV], pool=PoolConfig(warm=1))))

    async def request(method: str, path: str, body: dict | None = None,
                      token: str | None = None) -> bytes:
        headers = [(b"content-type", b"application/json")]
        if token:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        status, _, out = await call_asgi(app, method, path, b"", headers,
                                         json.dumps(body or {}).encode())
        assert status < 300, out
        return out

    info = json.loads(await request("POST", f"/envs/{ENV}/leases", {"task_idx": 0}))
    lease, token = f"/envs/{ENV}/leases/{info['lease_id']}", info["token"]
    await request("POST", lease + "/call", {"tool": "list_wishlists"}, token)
    await request("POST", lease + "/call", {"tool": "no_such_tool"}, token)
    await request("POST", lease + "/verify", {}, token)
    await request("DELETE", lease, None, token)
    return (await request("GET", "/metrics")).decode()


def test_metric_names_are_read_from_promql():
    expr = ('histogram_quantile(0.99, sum by (le, env) (rate(a_seconds_bucket{env=~"$env",'
            'x="sum(b)"}[$__rate_interval]))) / ignoring(outcome) group_left '
            'sum without (owner) (c_total offset 5m) * 1e3 + on(env) d')
    assert metric_names(expr) == {"a_seconds_bucket", "c_total", "d"}


async def test_every_dashboard_query_names_an_exported_metric():
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    wanted = set().union(*(metric_names(q) for q in queries))
    families = list(text_string_to_metric_families(await farm_exposition()))
    samples = {s.name for f in families for s in f.samples}
    assert wanted and not wanted - samples, f"not in /metrics: {sorted(wanted - samples)}"
    # ... and the dashboard shows every family the farm exports.
    shown = {f.name for f in families if any(s.name in wanted for s in f.samples)}
    exported = {f.name for f in families
                if f.name.startswith("envfarm_") and not f.name.endswith("_created")}
    assert shown == exported


def test_dashboard_is_a_grafana_model_over_a_prometheus_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))


@pytest.mark.parametrize("expr", ["rate(envfarm_calls[5m])", "envfarm_call_latency_seconds"])
async def test_a_name_without_its_exposition_suffix_is_caught(expr):
    # prometheus_client exposes counters as <name>_total and histograms as _bucket/_sum/_count.
    samples = {s.name for f in text_string_to_metric_families(await farm_exposition())
               for s in f.samples}
    assert metric_names(expr) - samples
