"""Candidate edges of the tool graph: an output field of A that could feed a required parameter of B.

Two sources: the embedding similarity of (name + description) of A's field and B's parameter, and
exact name matches (``hotel_id`` -> ``hotel_id``; the ``id`` of a hotel -> ``hotel_id``). Per
(A, B, parameter) only the best-matching field is kept: the LLM judges one edge, not forty.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from synth.embed import cosine_matrix
from synth.factory.model import Edge, Field_, Node, Param

DEFAULT_THRESHOLD = 0.6
#: Parameter names a user states rather than an earlier tool returns (and ``id``-ish ones do not end so).
_IDENTIFIER = re.compile(r"(^|_)(id|code|number|key|slug|uuid|token|username|handle)$")
_NUMERIC = {"integer", "number"}


def is_identifier(name: str) -> bool:
    """An identifier-like name (``hotel_id``, ``confirmation_code``): its value comes from data."""
    return bool(_IDENTIFIER.search(name.lower()))


def leaf(path: str) -> str:
    """The last key of a dotted field path (``hotels[].id`` -> ``id``)."""
    return path.replace("[]", "").rstrip(".").rsplit(".", 1)[-1]


def singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def owner(node: Node, path: str) -> str:
    """The entity a field belongs to: its parent key, singular (``room_types[].id`` -> ``room_type``),
    or for a top-level field the tool's name (``get_hotel_details`` -> ``get_hotel_detail``)."""
    parts = [p for p in path.replace("[]", "").split(".") if p]
    if len(parts) > 1:
        return singular(parts[-2])
    return "_".join(singular(t) for t in node.tool.lower().split("_"))


def name_match(node: Node, f: Field_, p: Param) -> bool:
    """Exact name/type match: same identifier name, or an entity's ``id`` for ``<entity>_id``."""
    if not types_fit(f.type, p.type):
        return False
    name, key = p.name.lower(), leaf(f.path).lower()
    if key == name:
        return is_identifier(name)
    if key == "id" and name.endswith("_id") and len(name) > 3:
        entity = name[:-3]
        return re.search(rf"(^|_){re.escape(entity)}($|_)", owner(node, f.path)) is not None
    return False


def types_fit(field_type: str, param_type: str) -> bool:
    """Can a value of ``field_type`` be passed as ``param_type`` (probe fields may be "null")."""
    if field_type in ("null", param_type) or (field_type in _NUMERIC and param_type in _NUMERIC):
        return True
    return param_type == "string" and field_type in _NUMERIC  # ids often travel as strings


def field_text(node: Node, f: Field_) -> str:
    words = f"{owner(node, f.path)} {leaf(f.path)}".replace("_", " ")
    return f"{words}: {f.description}" if f.description else words


def param_text(p: Param) -> str:
    words = p.name.replace("_", " ")
    return f"{words}: {p.description}" if p.description else words


async def candidate_edges(nodes: list[Node], embedder: Any, threshold: float, *,
                          use_names: bool = True) -> list[Edge]:
    """Every (A, field, B, param) above ``threshold`` or matching by name, best field per (A, B, param).

    ``embedder`` may be None: then only name matches are candidates (``use_names=False``: none are).
    """
    fields = [(n, f) for n in nodes for f in n.fields if f.type != "boolean"]
    params = [(n, p) for n in nodes for p in n.params if p.required]
    if not fields or not params:
        return []
    sims = await _similarities([field_text(n, f) for n, f in fields], [param_text(p) for _, p in params], embedder)
    best: dict[tuple[str, str, str], Edge] = {}
    for j, (dst, p) in enumerate(params):
        for i, (src, f) in enumerate(fields):
            if src.tool == dst.tool or not types_fit(f.type, p.type):
                continue  # a tool feeding itself is no chain step
            by_name = use_names and name_match(src, f, p)
            score = float(sims[i, j])
            if not by_name and score < threshold:
                continue
            edge = Edge(src=src.tool, field=f.path, dst=dst.tool, param=p.name, score=round(score, 4),
                        source="name" if by_name else "embedding", kept=True)
            key = (src.tool, dst.tool, p.name)
            old = best.get(key)
            if old is None or _rank(edge) > _rank(old):
                best[key] = edge
    return sorted(best.values(), key=lambda e: (e.dst, e.param, -e.score, e.src))


def _rank(edge: Edge) -> tuple[int, int, float]:
    # name matches first, then top-level fields over list items (one record, not a pick), then score
    return (edge.source == "name", "[]" not in edge.field, edge.score)


async def _similarities(left: list[str], right: list[str], embedder: Any) -> np.ndarray:
    if embedder is None:
        return np.zeros((len(left), len(right)), dtype=np.float32)
    unique = sorted(set(left) | set(right))
    vecs = await embedder.embed(unique)
    row = {t: i for i, t in enumerate(unique)}
    a = vecs[[row[t] for t in left]]
    b = vecs[[row[t] for t in right]]
    return cosine_matrix(a, b)
