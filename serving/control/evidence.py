"""One piece of gate evidence: a candidate's score against the current composite's.

Each method (re-scoring, replay, canary) measures one metric for the current composite
(`baseline`) and for the candidate, and the difference `delta` = candidate - baseline with its
confidence interval. The verdict reads the interval, never the point estimate alone:

- "better": the interval lies above `better_above` (the candidate beats the current composite
  by more than its confidence bound);
- "worse": the interval lies below `worse_below`;
- "no_difference": anything else (the data cannot tell them apart);
- "skipped": the method had nothing to measure (`detail["reason"]` says why).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from serving.control.stats import Estimate

METHODS = ("rescore", "replay", "canary")
VERDICTS = ("better", "worse", "no_difference", "skipped")


@dataclasses.dataclass(frozen=True)
class Evidence:
    """method: rescore | replay | canary; metric: what was measured (e.g. "success_rate");
    baseline / candidate: the metric under each; delta: candidate - baseline; detail: counts
    and per-item values for the audit log."""

    method: str
    metric: str
    verdict: str
    baseline: Estimate | None = None
    candidate: Estimate | None = None
    delta: Estimate | None = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"evidence method must be one of {METHODS}, got {self.method!r}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"evidence verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_json(self) -> dict[str, Any]:
        def est(e: Estimate | None):
            return None if e is None else e.to_json()

        return {
            "method": self.method,
            "metric": self.metric,
            "verdict": self.verdict,
            "baseline": est(self.baseline),
            "candidate": est(self.candidate),
            "delta": est(self.delta),
            "detail": dict(self.detail),
        }


def judge(delta: Estimate, *, better_above: float, worse_below: float) -> str:
    """The verdict of a difference's interval (module docstring)."""
    if delta.n == 0:
        return "no_difference"
    if delta.low > better_above:
        return "better"
    if delta.high < worse_below:
        return "worse"
    return "no_difference"


def skipped(method: str, metric: str, reason: str) -> Evidence:
    return Evidence(method, metric, "skipped", detail={"reason": reason})
