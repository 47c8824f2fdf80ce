"""The replay-first gate: every candidate is scored before it ships, with confidence bounds.

`gate(candidate, current, ...)` applies the candidate's patch to the current composite and
gathers up to three pieces of evidence (`evidence.py`), each the candidate against the current
composite:

1. rescore (`rescoring.py`): the recorded known-good actions' log-probs under the candidate's
   context and policy (a veto: "worse" when they become clearly less likely);
2. replay (`replaying.py`): recorded tasks with a resettable task spec played again by an
   agent under each composite (paired success difference);
3. canary (`canary_evidence`): live sessions the gateway served under the candidate's version
   vs the baseline version during a canary (`canary.py`), attributed by `composite_version`.

Verdict: "refuse" if any evidence is "worse" (or the patch is invalid); "pass" if none is worse
and at least one is "better" (the candidate beats the current composite by its confidence
bound); otherwise "inconclusive" (nothing shows a gain: not shipped). The no-op is the baseline
and is not gated. Each result is written to the decision log when one is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from atdp_io import Trajectory
from serving.common.errors import ApiError
from serving.control.analysis import success_by_version
from serving.control.audit import DecisionLog
from serving.control.candidates import Candidate
from serving.control.composite import CompositeError, CompositePolicy, CompositeSpec
from serving.control.evidence import Evidence, judge
from serving.control.facts import TrajectoryFacts, served_version
from serving.control.replaying import ReplayAgent, replay_evidence, replay_set
from serving.control.rescoring import ContextScorer, recorded_calls, rescore_evidence
from serving.control.stats import Estimate, rate_difference, wilson

VERDICTS = ("pass", "refuse", "inconclusive", "baseline")


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """How strict the gate is.

    confidence: of every interval (two-sided).
    rescore_tolerance: nats per token the known-good actions may lose before a veto.
    replay_episodes: recorded episodes replayed per candidate (failures first).
    min_gain: the lower bound of a success gain (replay, canary) must exceed this.
    canary_min_sessions: labelled sessions each arm of a canary needs before it is judged.
    resamples, seed: of the bootstrap intervals.
    """

    confidence: float = 0.95
    rescore_tolerance: float = 0.05
    replay_episodes: int = 16
    min_gain: float = 0.0
    canary_min_sessions: int = 10
    resamples: int = 2000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class GateResult:
    """A candidate's verdict and its evidence. spec: the composite it would serve (None when
    its patch is invalid); base_version: the current composite it was compared to."""

    candidate: Candidate
    base_version: int
    verdict: str
    evidence: tuple[Evidence, ...] = ()
    reasons: tuple[str, ...] = ()
    spec: CompositeSpec | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def gain(self) -> Estimate | None:
        """The strongest success gain shown ("better" replay or canary evidence), if any."""
        gains = [e.delta for e in self.evidence if e.verdict == "better" and e.delta is not None]
        return max(gains, key=lambda d: d.low) if gains else None

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.to_json(),
            "base_version": self.base_version,
            "verdict": self.verdict,
            "reasons": list(self.reasons),
            "evidence": [e.to_json() for e in self.evidence],
        }


def canary_evidence(
    window: Sequence[TrajectoryFacts],
    candidate_version: int,
    baseline_version: int,
    config: GateConfig = GateConfig(),
) -> Evidence:
    """Live success of the sessions served by `candidate_version` vs `baseline_version`
    (Newcombe interval of the difference); "skipped" until each arm has
    `canary_min_sessions` labelled sessions."""
    by_version = success_by_version(window, config.confidence)
    empty = wilson(0, 0, config.confidence)
    after = by_version.get(candidate_version, empty)
    before = by_version.get(baseline_version, empty)
    delta = rate_difference(after, before)
    detail = {"candidate_version": candidate_version, "baseline_version": baseline_version}
    if min(after.n, before.n) < config.canary_min_sessions:
        verdict = "skipped"
        detail["reason"] = (
            f"the canary has {after.n} candidate and {before.n} baseline sessions; each arm "
            f"needs {config.canary_min_sessions}"
        )
    else:
        verdict = judge(delta, better_above=config.min_gain, worse_below=0.0)
    return Evidence("canary", "live_success_rate", verdict, before, after, delta, detail)


def _verdict(evidence: Sequence[Evidence]) -> tuple[str, tuple[str, ...]]:
    worse = [e for e in evidence if e.verdict == "worse"]
    if worse:
        return "refuse", tuple(
            f"{e.method}: {e.metric} worse, delta {e.delta.value:+.3f} "
            f"[{e.delta.low:+.3f}, {e.delta.high:+.3f}]"
            for e in worse
        )
    better = [e for e in evidence if e.verdict == "better"]
    if better:
        return "pass", tuple(
            f"{e.method}: {e.metric} better, delta {e.delta.value:+.3f} "
            f"[{e.delta.low:+.3f}, {e.delta.high:+.3f}]"
            for e in better
        )
    measured = [e.method for e in evidence if e.verdict != "skipped"]
    if not measured:
        return "inconclusive", ("no evidence could be gathered (no scorer, agent or canary)",)
    return "inconclusive", (f"no gain beyond the confidence bound ({', '.join(measured)})",)


def gate(
    candidate: Candidate,
    current: CompositePolicy,
    *,
    trajectories: Sequence[Trajectory] = (),
    scorer: ContextScorer | None = None,
    agent: ReplayAgent | None = None,
    served: Callable[[int], CompositeSpec | None] | None = None,
    canary: tuple[Sequence[TrajectoryFacts], int] | None = None,
    config: GateConfig = GateConfig(),
    cache: MutableMapping[tuple[str, str], bool] | None = None,
    audit: DecisionLog | None = None,
) -> GateResult:
    """Score `candidate` against the `current` composite (module docstring).

    trajectories: the window (recorded calls to re-score, tasks to replay); scorer: re-scores
    recorded tokens; agent: plays replayed tasks; served: composite version -> the spec that
    served it (to rebuild the client's messages; default: `current` for its own version);
    canary: (facts of the live window, the version the candidate runs as) during a canary,
    compared to `current`'s version; cache: replay results shared across candidates.
    """
    try:
        spec = candidate.apply_to(current.spec)
    except CompositeError as error:
        result = GateResult(
            candidate, current.version, "refuse", (), (f"invalid patch: {error}",), None
        )
        return _logged(result, current, audit)
    if candidate.surface == "noop":
        result = GateResult(candidate, current.version, "baseline", (), ("the baseline",), spec)
        return _logged(result, current, audit)

    def served_spec(version: int | None) -> CompositeSpec | None:
        if served is not None and version is not None:
            return served(version)
        return current.spec if version == current.version else None

    evidence: list[Evidence] = []
    common = {"confidence": config.confidence, "resamples": config.resamples, "seed": config.seed}
    if scorer is not None:
        calls = [
            call for t in trajectories for call in recorded_calls(t, served_spec(served_version(t)))
        ]
        evidence.append(
            rescore_evidence(
                current.spec, spec, calls, scorer, tolerance=config.rescore_tolerance, **common
            )
        )
    if agent is not None:
        episodes = replay_set(trajectories, config.replay_episodes)
        try:
            evidence.append(
                replay_evidence(
                    current.spec,
                    spec,
                    episodes,
                    agent,
                    min_gain=config.min_gain,
                    cache=cache,
                    **common,
                )
            )
        except ApiError as error:  # what the model would be asked cannot be served
            reason = f"cannot be served: {error.message}"
            result = GateResult(candidate, current.version, "refuse", (), (reason,), None)
            return _logged(result, current, audit)
    if canary is not None:
        window, version = canary
        evidence.append(canary_evidence(window, version, current.version, config))
    verdict, reasons = _verdict(evidence)
    result = GateResult(candidate, current.version, verdict, tuple(evidence), reasons, spec)
    return _logged(result, current, audit)


def _logged(result: GateResult, current: CompositePolicy, audit: DecisionLog | None):
    if audit is not None:
        audit.record("gate", current.tenant, **result.to_json())
    return result


def summary(results: Sequence[GateResult]) -> list[Mapping[str, Any]]:
    """One row per result (candidate, surface, verdict, evidence deltas), for tables."""
    rows = []
    for r in results:
        row: dict[str, Any] = {"candidate": r.candidate.id, "surface": r.candidate.surface,
                               "verdict": r.verdict}  # fmt: skip
        for e in r.evidence:
            row[e.method] = (
                e.verdict
                if e.delta is None
                else f"{e.verdict} {e.delta.value:+.3f} [{e.delta.low:+.3f}, {e.delta.high:+.3f}]"
            )
        rows.append(row)
    return rows
