"""EnvFactory's lines of ``synth report``: per env edges, chains sampled / executable / accepted,
drops by reason, LLM tokens and cost (graph pass + QueryGen). Reads whatever files exist."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from synth._jsonl import read_jsonl
from synth.factory.execute import (
    DROP_CALL_FAILED,
    DROP_IDLE_WRITE,
    DROP_NO_EFFECT,
    DROP_NO_VALUE,
    DROP_UNKNOWN_TOOL,
)
from synth.factory.graph import GRAPH_FILE
from synth.factory.queries import EPISODES_FILE
from synth.factory.run import CHAINS_FILE

#: Reasons a chain did not execute as required (the rest executed and failed later).
NOT_EXECUTABLE = (DROP_UNKNOWN_TOOL, DROP_NO_VALUE, DROP_CALL_FAILED, DROP_NO_EFFECT, DROP_IDLE_WRITE)


def _graph_stats(folder: Path) -> dict[str, Any]:
    try:
        stats = json.loads((folder / GRAPH_FILE).read_text()).get("stats", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return stats if isinstance(stats, dict) else {}


def _num(value: Any) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def factory_rows(out_dir: Path) -> list[dict[str, Any]]:
    """One row per ``<out>/factory/<env>/`` folder."""
    root = Path(out_dir) / "factory"
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        graph = _graph_stats(folder)
        llm = graph.get("llm") if isinstance(graph.get("llm"), dict) else {}
        episodes = read_jsonl(folder / EPISODES_FILE)
        reasons = Counter(str(e.get("reason") or "") for e in episodes if not e.get("accepted"))
        usage = [e.get("usage") if isinstance(e.get("usage"), dict) else {} for e in episodes]
        tokens = sum(_num(u.get("prompt_tokens")) + _num(u.get("completion_tokens")) for u in usage)
        tokens += _num(llm.get("prompt_tokens")) + _num(llm.get("completion_tokens"))
        rows.append({
            "env": folder.name,
            "candidate_edges": _num(graph.get("candidates")),
            "kept_edges": _num(graph.get("kept")),
            "chains": len(read_jsonl(folder / CHAINS_FILE)),
            "processed": len(episodes),
            "executable": sum(bool(e.get("accepted")) or e.get("reason") not in NOT_EXECUTABLE
                              for e in episodes),
            "accepted": sum(bool(e.get("accepted")) for e in episodes),
            "drops": dict(sorted(reasons.items())),
            "tokens": int(tokens),
            "cost_usd": round(sum(_num(u.get("cost_usd")) for u in usage) + _num(llm.get("cost_usd")), 6),
        })
    return rows


def render_factory(rows: list[dict[str, Any]]) -> list[str]:
    """Table 3 as text lines ([] when the run has no EnvFactory output)."""
    if not rows:
        return []
    lines = ["", "Table 3 - EnvFactory per environment",
             (f"{'env':<28} {'edges':>11} {'chains':>6} {'run':>5} {'exec':>5} {'accepted':>8} {'tokens':>8} "
              f"{'cost $':>8}  drops")]
    for r in rows:
        drops = ", ".join(f"{k} {v}" for k, v in r["drops"].items()) or "-"
        lines.append(f"{r['env']:<28} {r['kept_edges']:>5}/{r['candidate_edges']:<5} {r['chains']:>6} "
                     f"{r['processed']:>5} {r['executable']:>5} {r['accepted']:>8} {r['tokens']:>8} "
                     f"{r['cost_usd']:>8.4f}  {drops}")
    return lines
