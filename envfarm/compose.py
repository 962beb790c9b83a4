"""Where the farm meets the judge: a ``FarmCore`` built with the judge as its verifier.

The farm knows only the ``EpisodeVerifier`` protocol (``envfarm.verdict``); this module is the
one place that picks the implementation, for the CLI, Serve replicas, tests and benchmarks.
"""

from __future__ import annotations

import threading
import time
from typing import Self

from envfarm.catalog import Catalog
from envfarm.errors import JudgeError
from envfarm.farm import FarmConfig, FarmCore, VerifierFactory, free_port, make_server
from envfarm.llm import LLMClient, LLMConfig
from envfarm.runtime import EnvRuntime
from envfarm.verdict import RewardConfig

__all__ = [
    "LocalFarm",
    "code_judge",
    "compose_core",
    "judge_for",
]


#: LLM judgments in flight at once per farm process.
_LLM_CONCURRENCY = 256


def code_judge(config: FarmConfig) -> VerifierFactory:
    """The judge in code-only mode (verifier code in its sandbox, no LLM), sized by ``config``."""

    def make() -> object:
        # Imported here: a farm that never verifies never loads the judge.
        from judge import Judge, JudgeConfig, SandboxConfig

        sandbox = SandboxConfig(workers=config.verifier_workers,
                                timeout_s=config.verifier_timeout_s)
        return Judge(JudgeConfig(use_llm="never", check_format=False, sandbox=sandbox))

    return make


def judge_for(config: FarmConfig, reward: RewardConfig | None = None) -> VerifierFactory:
    """The judge on the farm's reward path: ``code`` (:func:`code_judge`) or ``llm`` (the
    paper's: the task's sql-mode verifier output and the episode's trajectory, sent with
    ``verify``, go to an LLM judge over any OpenAI-compatible endpoint; a task without an
    sql-mode verifier falls back to its code-mode one). ``reward`` defaults to
    ``RewardConfig.from_env()`` (``ENVFARM_REWARD_PATH``, ``ENVFARM_JUDGE_BASE_URL`` ...)."""
    reward = reward or RewardConfig.from_env()
    if reward.path == "code":
        return code_judge(config)
    llm = LLMConfig.from_env(max_concurrency=_LLM_CONCURRENCY, **reward.llm_overrides())
    if not llm.base_url:  # say so at start-up, not at the first verification
        raise JudgeError("the llm reward path needs the judge's OpenAI-compatible endpoint: "
                         "set ENVFARM_JUDGE_BASE_URL (or ENVFARM_LLM_BASE_URL) and a model")

    def make() -> object:
        from judge import Judge, JudgeConfig, SandboxConfig

        sandbox = SandboxConfig(workers=config.verifier_workers,
                                timeout_s=config.verifier_timeout_s)
        # Format rules are the trainer's (it ends an episode at the first violation).
        client = LLMClient(llm)
        return Judge(JudgeConfig(use_llm="always", check_format=False, sandbox=sandbox),
                     llm_client=client)

    return make


def compose_core(config: FarmConfig, owner: str | None = None, catalog: Catalog | None = None,
                 runtimes: dict[str, EnvRuntime] | None = None,
                 reward: RewardConfig | None = None) -> FarmCore:
    """A farm core that verifies leases with the judge on ``reward``'s path (see
    :func:`judge_for`)."""
    reward = reward or RewardConfig.from_env()
    # Verifications at once, as many as the judge runs at once: the verifier sandbox's
    # workers (code path) or the LLM client's calls; beyond that, tenants take turns.
    slots = 2 * config.verifier_workers if reward.path == "code" else _LLM_CONCURRENCY
    return FarmCore(config, owner=owner, catalog=catalog, runtimes=runtimes,
                    verifier=judge_for(config, reward), verify_slots=slots)


class LocalFarm:
    """A ``--no-ray`` farm on a background thread (demo, tests, benchmarks)."""

    def __init__(self, config: FarmConfig, host: str = "127.0.0.1", port: int = 0,
                 catalog: Catalog | None = None, reward: RewardConfig | None = None,
                 runtimes: dict[str, EnvRuntime] | None = None) -> None:
        """``runtimes``: envs compiled already in this process (served in-process)."""
        self.core = compose_core(config, catalog=catalog, reward=reward, runtimes=runtimes)
        self.host = host
        self.port = port or free_port(host)
        self.server = make_server(self.core, host, self.port)
        self._thread = threading.Thread(target=self.server.run, name="envfarm-local",
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> Self:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"local farm did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
