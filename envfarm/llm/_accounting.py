"""Token and cost accounting per stage and per scenario."""

from __future__ import annotations

from collections import defaultdict

from envfarm.llm._types import Usage


class UsageLedger:
    """Sums :class:`Usage` by stage, by scenario and by (stage, scenario)."""

    def __init__(self) -> None:
        self.total = Usage()
        self.by_stage: dict[str, Usage] = defaultdict(Usage)
        self.by_scenario: dict[str, Usage] = defaultdict(Usage)
        self.by_stage_scenario: dict[tuple[str, str], Usage] = defaultdict(Usage)

    def add(self, usage: Usage, *, stage: str | None, scenario: str | None) -> None:
        """Record one call."""
        stage_key = stage or "-"
        scenario_key = scenario or "-"
        self.total.add(usage)
        self.by_stage[stage_key].add(usage)
        self.by_scenario[scenario_key].add(usage)
        self.by_stage_scenario[(stage_key, scenario_key)].add(usage)

    def snapshot(self) -> dict[str, object]:
        """A JSON-ready copy of every sum."""
        return {
            "total": self.total.model_dump(),
            "by_stage": {k: v.model_dump() for k, v in self.by_stage.items()},
            "by_scenario": {k: v.model_dump() for k, v in self.by_scenario.items()},
        }
