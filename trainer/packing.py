"""Turn samples packed into shared rows, and their log-probabilities in one forward pass.

An episode's turn ``k + 1`` sees turn ``k``'s prompt and completion as the start of its own
prompt (until the history window drops a turn), so one row holding the episode so far scores
every packed turn exactly as its own sample would: attention is causal, and each row starts at
position 0. SFT and the GRPO update both score their samples this way; GRPO's turns per episode
(~3.6 in the learning runs) made its update score ~2x the tokens it needed.

    rows = pack(samples)                       # consecutive turns of one episode share a row
    logp = packed_logprobs(model, rows, pad)   # every target token's, flat, in row order

Rows are right-padded and run without an attention mask: under causal attention no real token
sees a pad to its right, so the mask changes nothing but makes the kernel take the slower path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Packed:
    """One token sequence holding one or more turn samples. ``targets``: the positions of the
    samples' completion tokens, sample after sample; ``members``: which samples (their indices
    in what :func:`pack` was given), in order; ``spans``: each member's number of targets."""

    ids: list[int]
    targets: list[int]
    members: list[int] = field(default_factory=list)
    spans: list[int] = field(default_factory=list)


def pack(samples: Sequence[Any], members: Sequence[int] | None = None) -> list[Packed]:
    """Samples (with ``prompt_ids``, ``completion_ids``) merged into rows: a sample joins the row
    before it when its prompt extends that row token for token (the same episode, no turn
    dropped by the window, nothing re-tokenized differently); otherwise it starts a row.
    ``members``: the index to record for each sample (default: its position)."""
    out: list[Packed] = []
    for k, s in enumerate(samples):
        cur = out[-1] if out else None
        if not (cur is not None and len(s.prompt_ids) >= len(cur.ids)
                and s.prompt_ids[:len(cur.ids)] == cur.ids):
            cur = Packed([], [])
            out.append(cur)
        start = len(s.prompt_ids)
        cur.ids = list(s.prompt_ids) + list(s.completion_ids)
        cur.targets += range(start, start + len(s.completion_ids))
        cur.members.append(members[k] if members is not None else k)
        cur.spans.append(len(s.completion_ids))
    return out


def unpacked(samples: Sequence[Any], members: Sequence[int] | None = None) -> list[Packed]:
    """One row per sample (nothing shared): the reference :func:`pack` must agree with."""
    return [Packed(list(s.prompt_ids) + list(s.completion_ids),
                   list(range(len(s.prompt_ids), len(s.prompt_ids) + len(s.completion_ids))),
                   [members[k] if members is not None else k], [len(s.completion_ids)])
            for k, s in enumerate(samples)]


def packed_logprobs(model: Any, rows: Sequence[Packed], pad_id: int, *, chunk: int | None = None,
                    autocast: str | None = None, temperature: float | Sequence[float] = 1.0) -> Any:
    """Log-probabilities of every target token of ``rows``, flat, in row order, under
    softmax(logits / T). ``temperature``: one for all, or one per member index (a sample's own).

    The decoder runs once over the right-padded rows; only the hidden states that predict a
    target reach the LM head. ``chunk``: the head then runs that many positions at a time, each
    chunk recomputed in the backward pass instead of keeping its (chunk, vocabulary) logits."""
    import torch
    from torch.utils.checkpoint import checkpoint

    device = next(model.parameters()).device
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    where_r: list[int] = []
    where_c: list[int] = []
    temps: list[float] = []
    for i, r in enumerate(rows):
        ids[i, :len(r.ids)] = torch.tensor(r.ids)
        where_r += [i] * len(r.targets)
        where_c += [t - 1 for t in r.targets]  # logits at t - 1 predict token t
        if not isinstance(temperature, (int, float)):
            for member, span in zip(r.members, r.spans, strict=True):
                temps += [float(temperature[member])] * span
    ids = ids.to(device)
    rr, cc = torch.tensor(where_r, device=device), torch.tensor(where_c, device=device)
    targets = ids[rr, cc + 1]
    temp: float | torch.Tensor = (float(temperature) if isinstance(temperature, (int, float))
                                  else torch.tensor(temps, device=device))
    dtype = getattr(torch, autocast) if autocast else None
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        hidden = getattr(model, model.base_model_prefix)(input_ids=ids).last_hidden_state
        picked = hidden[rr, cc]
        head = model.get_output_embeddings()
        step = chunk or max(1, picked.shape[0])
        parts = []
        for i in range(0, picked.shape[0], step):
            part = (picked[i:i + step], targets[i:i + step],
                    temp[i:i + step] if isinstance(temp, torch.Tensor) else temp)
            if chunk and torch.is_grad_enabled():
                parts.append(checkpoint(head_logprobs, head, *part, use_reentrant=False))
            else:
                parts.append(head_logprobs(head, *part))
    return torch.cat(parts) if parts else torch.zeros(0, device=device)


def head_logprobs(head: Any, hidden: Any, targets: Any, temperature: Any = 1.0) -> Any:
    """log softmax(head(hidden) / T) at ``targets``, in fp32 whatever the compute dtype;
    ``temperature``: a number, or one per position."""
    import torch

    logits = head(hidden).float()
    if isinstance(temperature, torch.Tensor):
        logits = logits / temperature[:, None]
    elif temperature != 1.0:
        logits = logits / temperature
    return logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def by_member(logp: Any, rows: Sequence[Packed]) -> dict[int, Any]:
    """Flat log-probs of ``rows`` (:func:`packed_logprobs`) cut back into each member's."""
    spans = [s for r in rows for s in r.spans]
    members = [m for r in rows for m in r.members]
    return dict(zip(members, logp.split(spans), strict=True))
