"""`ControlPlane`: one round of the evolution loop over a gateway's stores, for an experiment
or an operator's script.

    plane = ControlPlane(gateway.composites, atdp_store, canaries=gateway.canaries)
    watched = plane.watch("acme")                       # roll back a regression first
    result = plane.run_round("acme", [WindowSpec("acme", since=t0)],
                             analyzer=RuleBasedAlfworldAnalyzer(), agent=agent, scorer=scorer)
    result.decision.surface, result.shipped            # what shipped, if anything

A round: read the windows -> `analyse` (failure modes) -> `propose` candidates per surface
(plus any given ones) -> `gate` each (re-scoring, replay, canary evidence) -> `choose` the
cheapest passed candidate on a surface the dominant modes name -> promote it (or start a
canary with it). Every step is written to the decision log. Each step is also a method of its
own, so a loop can stop between them (e.g. to let canary traffic accumulate).

Use the gateway's own `CompositeStore` and `CanaryBook` objects when the gateway runs in the
same process (`app[GATEWAY].composites`, `.canaries`): the gateway caches each tenant's
current version and canary, so a second store object on the same directory is not seen by it
until it restarts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from atdp_io import AtdpStore, Trajectory
from serving.control.analysis import Analysis, analyse
from serving.control.audit import DecisionLog
from serving.control.canary import Canary, CanaryBook
from serving.control.candidates import Candidate
from serving.control.choice import Decision, choose
from serving.control.composite import CompositePolicy, CompositeSpec
from serving.control.deploy import WatchResult, promote, start_canary, watch
from serving.control.facts import facts
from serving.control.gate import GateConfig, GateResult, gate
from serving.control.proposers import Analyzer, TrainFn, propose
from serving.control.replaying import ReplayAgent
from serving.control.rescoring import ContextScorer
from serving.control.store import CompositeStore, ControlError, UnknownVersion
from serving.control.window import WindowSpec, read_window


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """One round: its analysis, candidates, gate results, decision and what shipped
    (`shipped`: the promoted version; `canary`: the canary started instead)."""

    tenant: str
    analysis: Analysis
    candidates: tuple[Candidate, ...]
    results: tuple[GateResult, ...]
    decision: Decision
    shipped: CompositePolicy | None = None
    canary: Canary | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "analysis": self.analysis.to_json(),
            "results": [r.to_json() for r in self.results],
            "decision": self.decision.to_json(),
            "shipped": None if self.shipped is None else self.shipped.version,
            "canary": None if self.canary is None else self.canary.to_json(),
        }


class ControlPlane:
    """The loop's steps over a composite store, an ATDP store, canaries and a decision log
    (default: `<store root>/decisions.jsonl`)."""

    def __init__(
        self,
        store: CompositeStore,
        atdp: AtdpStore,
        *,
        canaries: CanaryBook | None = None,
        audit: DecisionLog | None = None,
        gate_config: GateConfig | None = None,
    ):
        self.store, self.atdp, self.canaries = store, atdp, canaries
        self.audit = audit if audit is not None else DecisionLog(store.root)
        self.gate_config = gate_config or GateConfig()

    def read(self, windows: Sequence[WindowSpec]) -> list[Trajectory]:
        """The trajectories of every window, in order."""
        if not windows:
            raise ControlError("give at least one window to read")
        return [t for spec in windows for t in read_window(self.atdp, spec)]

    def analyse(self, tenant: str, windows: Sequence[WindowSpec]) -> tuple[Analysis, list]:
        """(the failure analysis of the windows, their trajectories); logged for `tenant`."""
        trajectories = self.read(windows)
        described = {"windows": [w.to_json() for w in windows]}
        analysis = analyse(trajectories, window=described, confidence=self.gate_config.confidence)
        self.audit.record("analysis", tenant, **analysis.to_json())
        return analysis, trajectories

    def propose(
        self,
        tenant: str,
        analysis: Analysis,
        trajectories: Sequence[Trajectory],
        *,
        analyzer: Analyzer | None = None,
        train_fn: TrainFn | None = None,
    ) -> list[Candidate]:
        """The candidates for `tenant`'s current composite (`proposers.propose`)."""
        return propose(
            analysis,
            self.store.current(tenant),
            trajectories=trajectories,
            analyzer=analyzer,
            train_fn=train_fn,
        )

    def _served(self, tenant: str):
        def served(version: int) -> CompositeSpec | None:
            try:
                return self.store.get(tenant, version).spec
            except UnknownVersion:
                return None

        return served

    def gate(
        self,
        tenant: str,
        candidates: Sequence[Candidate],
        trajectories: Sequence[Trajectory],
        *,
        scorer: ContextScorer | None = None,
        agent: ReplayAgent | None = None,
    ) -> list[GateResult]:
        """Gate each candidate against the tenant's current composite on the tenant's own
        trajectories of the window (another tenant's are never used to judge it)."""
        current = self.store.current(tenant)
        own = [t for t in trajectories if t.header.governance.tenant == tenant]
        cache: dict = {}
        return [
            gate(c, current, trajectories=own, scorer=scorer, agent=agent,
                 served=self._served(tenant), config=self.gate_config, cache=cache,
                 audit=self.audit)
            for c in candidates
        ]  # fmt: skip

    def judge_canary(self, tenant: str, candidate: Candidate, *, since: float | None = None):
        """Canary evidence for the running canary of `tenant` (gate result on live traffic)."""
        if self.canaries is None or self.canaries.get(tenant) is None:
            raise ControlError(f"tenant {tenant!r} has no canary running")
        canary = self.canaries.get(tenant)
        window = read_window(
            self.atdp,
            WindowSpec(tenant, since=since, versions=(canary.baseline, canary.version)),
        )
        baseline = self.store.get(tenant, canary.baseline)
        return gate(candidate, baseline, canary=([facts(t) for t in window], canary.version),
                    config=self.gate_config, audit=self.audit)  # fmt: skip

    def choose(self, tenant: str, analysis: Analysis, results: Sequence[GateResult]) -> Decision:
        return choose(analysis, results, tenant=tenant, audit=self.audit)

    def ship(
        self, tenant: str, decision: Decision, *, canary_share: float | None = None
    ) -> CompositePolicy | Canary | None:
        """Promote the decision's candidate (or start a canary of it); None for a no-op."""
        if decision.chosen is None:
            return None
        candidate = decision.chosen.candidate
        if canary_share is not None:
            if self.canaries is None:
                raise ControlError("a canary needs the gateway's CanaryBook (canaries=...)")
            return start_canary(self.store, self.canaries, tenant, candidate,
                                share=canary_share, audit=self.audit)  # fmt: skip
        return promote(self.store, tenant, candidate, audit=self.audit, canaries=self.canaries)

    def watch(self, tenant: str, **kwargs) -> WatchResult:
        """`deploy.watch` on this plane's stores (rolls back a live regression)."""
        return watch(
            self.store, self.atdp, tenant, audit=self.audit, canaries=self.canaries, **kwargs
        )

    def run_round(
        self,
        tenant: str,
        windows: Sequence[WindowSpec],
        *,
        analyzer: Analyzer | None = None,
        train_fn: TrainFn | None = None,
        scorer: ContextScorer | None = None,
        agent: ReplayAgent | None = None,
        extra: Sequence[Candidate] = (),
        canary_share: float | None = None,
    ) -> RoundResult:
        """analyse -> propose (+ `extra`, e.g. planted ones) -> gate -> choose -> ship."""
        analysis, trajectories = self.analyse(tenant, windows)
        candidates = self.propose(
            tenant, analysis, trajectories, analyzer=analyzer, train_fn=train_fn
        )
        known = {c.id for c in candidates}
        candidates += [c for c in extra if c.id not in known]
        results = self.gate(tenant, candidates, trajectories, scorer=scorer, agent=agent)
        decision = self.choose(tenant, analysis, results)
        shipped = self.ship(tenant, decision, canary_share=canary_share)
        return RoundResult(
            tenant,
            analysis,
            tuple(candidates),
            tuple(results),
            decision,
            shipped if isinstance(shipped, CompositePolicy) else None,
            shipped if isinstance(shipped, Canary) else None,
        )
