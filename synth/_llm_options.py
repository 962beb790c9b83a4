"""The LLM endpoint options of every ``envfarm synth`` command that calls the LLM: declared once
here, spliced into each command's signature (``with_llm_options``) and read back into one
``envfarm.llm.LLMConfig`` (``llm_config``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from envfarm.errors import EnvfarmError


def _declared(
    llm_base_url: str = typer.Option(None, help="OpenAI-compatible base URL [env ENVFARM_LLM_BASE_URL]"),
    llm_model: str = typer.Option(None, help="default model [env ENVFARM_LLM_MODEL]"),
    llm_api_key: str = typer.Option(None, help="API key [env ENVFARM_LLM_API_KEY]"),
    stage_model: list[str] = typer.Option([], help="STAGE=MODEL, repeatable (e.g. env=gpt-5)"),
    price: list[str] = typer.Option([], help="MODEL=IN/OUT USD per 1M tokens, repeatable"),
    llm_concurrency: int = typer.Option(32, help="LLM calls in flight"),
    llm_replay: Path = typer.Option(None, help="serve LLM answers from this recording (offline)"),
    llm_record: Path = typer.Option(None, help="append every live LLM call to this recording"),
    cache_dir: Path = typer.Option(None, help="response cache folder [default: OUT/llm_cache]"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not cache LLM responses"),
) -> None:
    """Only the signature: the options' declarations."""


#: The LLM endpoint options (``llm_config``'s keywords), shared by every command that calls the LLM.
LLM_OPTIONS = tuple(inspect.signature(_declared).parameters)


def llm_option_parameters() -> list[inspect.Parameter]:
    """The ``LLM_OPTIONS`` parameters (typer options), for other commands' signatures."""
    sig = inspect.signature(_declared, eval_str=True)
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()]


def with_llm_options(command: Callable[..., Any], at: int | None = None) -> Callable[..., Any]:
    """``command`` (which takes ``**llm_options``) as typer sees it: its own options with the LLM
    options inserted at position ``at`` (None: after them all)."""
    own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
           for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind != p.VAR_KEYWORD]
    at = len(own) if at is None else at

    def with_options(**kwargs: Any) -> Any:
        return command(**kwargs)

    with_options.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*own[:at], *llm_option_parameters(), *own[at:]])
    with_options.__doc__ = command.__doc__
    with_options.__name__ = command.__name__
    return with_options


def _parse_pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key or not val:
            raise EnvfarmError(f"{what} must look like KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def llm_config(out: Path, *, llm_base_url: str | None, llm_model: str | None, llm_api_key: str | None,
               stage_model: list[str], price: list[str], llm_concurrency: int, llm_replay: Path | None,
               llm_record: Path | None, cache_dir: Path | None, no_cache: bool) -> Any:
    """The ``envfarm.llm.LLMConfig`` of the LLM options every LLM-using command takes."""
    from envfarm.llm import LLMConfig, Price

    prices = {}
    for model, spec in _parse_pairs(price, "--price").items():
        inp, _, outp = spec.partition("/")
        prices[model] = Price(input_per_mtok=float(inp), output_per_mtok=float(outp or 0))
    cfg = LLMConfig.from_env(
        base_url=llm_base_url, model=llm_model, api_key=llm_api_key,
        stage_models=_parse_pairs(stage_model, "--stage-model") or None,
        max_concurrency=llm_concurrency, replay_path=llm_replay, record_path=llm_record,
        cache_dir=None if no_cache else (cache_dir or out / "llm_cache"),
    )
    cfg.prices.update(prices)
    return cfg
