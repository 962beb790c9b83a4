"""Many episodes' turns generated together by one local model, deterministically.

``HFPolicy`` generates one turn at a time; a small model on CPU then spends its time in Python
per token, not in arithmetic. ``BatchedPolicy`` gathers the turns of every live episode and
generates them in one batch (left-padded, KV cache), so N episodes cost about one:

    policy = BatchedPolicy(model, tokenizer, max_new_tokens=96, temperature=1.0, seed=3)
    results = await run_lockstep(farm, policy, jobs, config=episode_cfg)

Deterministic under ``seed``: a batch is formed only when every live episode waits for its next
turn (lockstep), in a fixed order (the job's index), so the batches' shapes do not depend on
timing; and each row samples from its own generator, seeded by (seed, episode key, turn), so a
row's draw does not depend on what else is in its batch.

A row may sample at its own temperature (``policy.episode(key, temperature=...)``): a GRPO group
can mix temperatures in one lockstep batch.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from judge import Message
from trainer.hf import encode_prompt, end_token_id
from trainer.policy import FINISH_LENGTH, FINISH_STOP, Generation, TurnContext


@dataclass
class _Ask:
    key: tuple[Any, ...]
    prompt_ids: list[int]
    future: asyncio.Future[Generation]
    temperature: float


def generate_batch(model: Any, prompts: list[list[int]], *, max_new_tokens: int,
                   temperature: float | Sequence[float], eos: int, pad: int,
                   generators: list[Any] | None = None) -> list[tuple[list[int], list[float]]]:
    """(completion ids, their log-probs under the sampling policy softmax(logits / T), greedy:
    the raw logits) of each prompt; a completion ends with ``eos`` when it stopped, or has
    ``max_new_tokens`` ids when it did not. ``temperature``: one for all rows, or one per row."""
    import torch
    from transformers import DynamicCache

    rows = len(prompts)
    temps = torch.tensor([float(temperature)] * rows if isinstance(temperature, (int, float))
                         else [float(t) for t in temperature])
    if temps.shape[0] != rows:
        raise ValueError(f"{temps.shape[0]} temperatures for {rows} prompts")
    width = max(len(p) for p in prompts)
    ids = torch.full((rows, width), pad, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out: list[list[int]] = [[] for _ in range(rows)]
    logps: list[list[float]] = [[] for _ in range(rows)]
    live = list(range(rows))  # original row of each row still in the batch
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()
        last = position[:, -1]
        for _ in range(max_new_tokens):
            t_live = temps[live]
            scaled = logits / torch.where(t_live > 0, t_live, 1.0)[:, None]
            logp = torch.log_softmax(scaled, dim=-1)
            tokens = _choose(scaled, t_live > 0, [generators[r] for r in live] if generators else None)
            keep = []
            for k, r in enumerate(live):
                t = int(tokens[k])
                out[r].append(t)
                logps[r].append(float(logp[k, t]))
                if t != eos:
                    keep.append(k)
            if not keep or len(out[live[0]]) >= max_new_tokens:
                break
            if len(keep) < len(live):  # finished rows leave the batch (and the cache)
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                tokens, mask, last = tokens[index], mask[index], last[index]
                live = [live[k] for k in keep]
            mask = torch.cat([mask, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
            last = last + 1
            logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=last[:, None],
                           past_key_values=cache, use_cache=True).logits[:, -1].float()
    return list(zip(out, logps, strict=True))


def _choose(scaled: Any, sampled: Any, generators: list[Any] | None) -> Any:
    """Each row's next token: drawn from softmax(``scaled``) where ``sampled``, else argmax."""
    import torch

    tokens = scaled.argmax(dim=-1)
    if not bool(sampled.any()):
        return tokens
    probs = torch.softmax(scaled, dim=-1)
    if generators is None and bool(sampled.all()):
        return torch.multinomial(probs, 1)[:, 0]
    for k in torch.nonzero(sampled)[:, 0].tolist():
        g = generators[k] if generators else None
        tokens[k] = torch.multinomial(probs[k], 1, generator=g)[0]
    return tokens


def row_seed(seed: int, key: tuple[Any, ...]) -> int:
    """A row's sampling seed: the run's seed and the turn's key (episode and turn)."""
    digest = hashlib.sha256(repr((seed, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class BatchedPolicy:
    """A local causal LM answering every live episode's turn in one batch (module doc).

    Episodes take part through :meth:`episode` (``run_lockstep`` does it): a batch starts when
    every live episode is waiting for a turn. ``generate`` outside an episode waits ``wait_s``
    for company instead."""

    name = "hf-batched"

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 96, temperature: float = 1.0,
                 seed: int = 0, max_batch: int = 64, wait_s: float = 0.01) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.max_batch, self.wait_s = max_batch, wait_s
        self.eos, self.pad = end_token_id(tokenizer), tokenizer.pad_token_id
        self._asks: list[_Ask] = []
        self._live: dict[Any, tuple[Any, ...]] = {}  # episode task -> its key
        self._temps: dict[Any, float] = {}  # episode task -> its own temperature
        self._running: asyncio.Task[None] | None = None

    def episode(self, key: tuple[Any, ...], temperature: float | None = None) -> _Membership:
        """``async with policy.episode(key):`` around one episode (``key``: unique, orderable);
        ``temperature``: this episode's, instead of the policy's."""
        if temperature is not None and temperature < 0:
            raise ValueError(f"temperature must be >= 0, not {temperature}")
        return _Membership(self, key, temperature)

    async def generate(self, messages: Sequence[Message], ctx: TurnContext) -> Generation:
        task = asyncio.current_task()
        base = self._live.get(task, ("solo", ctx.env, ctx.task_idx, id(task)))
        temperature = self._temps.get(task, self.temperature)
        ask = _Ask((*base, ctx.turn), encode_prompt(self.tokenizer, list(messages)),
                   asyncio.get_running_loop().create_future(), temperature)
        self._asks.append(ask)
        self._kick()
        return await ask.future

    def _kick(self) -> None:
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while self._asks:
            if len(self._asks) < len(self._live) or not self._live:
                await asyncio.sleep(self.wait_s)  # lockstep: wait for the others (or, solo, company)
                if len(self._asks) < len(self._live):
                    continue
            asks, self._asks = sorted(self._asks, key=lambda a: a.key), []
            try:
                results = await asyncio.to_thread(self._run_all, asks)
            except Exception as exc:  # noqa: BLE001 - the waiting episodes get it
                results = [exc] * len(asks)
            for a, gen in zip(asks, results, strict=True):
                if a.future.done():
                    continue
                if isinstance(gen, Exception):
                    a.future.set_exception(gen)
                else:
                    a.future.set_result(gen)

    def _run_all(self, asks: list[_Ask]) -> list[Generation]:
        out: list[Generation] = []
        for i in range(0, len(asks), self.max_batch):
            out += self._run(asks[i:i + self.max_batch])
        return out

    def _run(self, asks: list[_Ask]) -> list[Generation]:
        import torch

        was_training = self.model.training
        self.model.eval()
        try:
            gens = [torch.Generator().manual_seed(row_seed(self.seed, a.key)) for a in asks]
            done = generate_batch(self.model, [a.prompt_ids for a in asks], max_new_tokens=self.max_new_tokens,
                                  temperature=[a.temperature for a in asks], eos=self.eos, pad=self.pad,
                                  generators=gens)
        finally:
            self.model.train(was_training)
        out = []
        for a, (ids, logps) in zip(asks, done, strict=True):
            finished = bool(ids) and ids[-1] == self.eos
            text = self.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
            out.append(Generation(text=text, finish_reason=FINISH_STOP if finished else FINISH_LENGTH,
                                  prompt_ids=a.prompt_ids, completion_ids=ids, logprobs=logps,
                                  policy=self.name, temperature=a.temperature))
        return out


class _Membership:
    def __init__(self, policy: BatchedPolicy, key: tuple[Any, ...], temperature: float | None) -> None:
        self.policy, self.key, self.temperature = policy, key, temperature

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        self.policy._live[task] = self.key
        if self.temperature is not None:
            self.policy._temps[task] = self.temperature

    async def __aexit__(self, *exc: object) -> None:
        task = asyncio.current_task()
        self.policy._live.pop(task, None)
        self.policy._temps.pop(task, None)
        if self.policy._asks:
            self.policy._kick()  # the others may all be waiting now


async def run_lockstep(farm: Any, policy: Any, jobs: Sequence[tuple[str, int]], *, config: Any,
                       tag: Any = 0, leases: Sequence[Any] | None = None) -> list[Any]:
    """One episode per job, all at once, their turns batched in lockstep; job ``i``'s episode
    key is (tag, i), so reruns with the same jobs, tag and seed sample the same tokens."""
    from trainer.episode import run_episode

    async def one(i: int, env: str, idx: int) -> Any:
        lease = leases[i] if leases is not None else None
        if isinstance(policy, BatchedPolicy):
            async with policy.episode((tag, i)):
                return await run_episode(farm, policy, env, idx, lease=lease, config=config)
        return await run_episode(farm, policy, env, idx, lease=lease, config=config)

    return list(await asyncio.gather(*(one(i, env, idx) for i, (env, idx) in enumerate(jobs))))
