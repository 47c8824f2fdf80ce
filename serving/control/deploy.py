"""Shipping candidates: promotion, canaries, the live-regression watch and automatic rollback.

- `promote` applies a candidate's patch to the tenant's current composite and stores it as the
  next version (the store's put; the gateway serves it from the tenant's next call).
- `start_canary` stores it the same way but serves it to a share of sessions only
  (`canary.py`); `finish_canary` keeps it (everyone gets it) or drops it (a rollback to the
  baseline).
- `watch` compares live success of the serving version with the closest earlier version live
  traffic measured (its parent, or further back when the parent was replaced before it served
  `min_sessions` labelled sessions; during a canary, the canary's baseline), on the tenant's
  traffic attributed by `composite_version`. When the drop exceeds the interval (the upper
  bound of current - previous is below 0, both with at least `min_sessions` labelled
  sessions), it rolls back to that measured version: a new version with its content, as the
  store does (the last content live traffic showed to be better).

Governance: a candidate learned from one tenant's trajectories reaches another tenant only if
the source tenant's composite allows it (`governance.allow_cross_tenant`, default false);
otherwise `CrossTenantRefused`. Every action and every refusal is written to the decision log;
a refused action changes nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from atdp_io import AtdpStore
from serving.control.analysis import success_by_version
from serving.control.audit import DecisionLog
from serving.control.canary import Canary, CanaryBook, CanaryError
from serving.control.candidates import Candidate
from serving.control.composite import CompositeError, CompositePolicy
from serving.control.facts import facts
from serving.control.stats import Estimate, rate_difference, wilson
from serving.control.store import CompositeStore, ControlError
from serving.control.window import UnknownTenant, WindowSpec, read_window


class CrossTenantRefused(ControlError):
    """A candidate learned from another tenant whose governance keeps its updates to itself."""


def check_scope(store: CompositeStore, candidate: Candidate, tenant: str) -> None:
    """Refuse (`CrossTenantRefused`) a candidate learned from another tenant unless that
    tenant's composite allows cross-tenant updates."""
    source = candidate.provenance.tenant
    if source == tenant:
        return
    if not source:
        raise CrossTenantRefused(
            f"candidate {candidate.id} names no source tenant; it cannot be promoted to "
            f"{tenant!r} (governance needs to know whose data it was learned from)"
        )
    if not store.current(source).spec.governance.allow_cross_tenant:
        raise CrossTenantRefused(
            f"candidate {candidate.id} was learned from tenant {source!r}'s trajectories, and "
            f"{source!r}'s governance keeps its updates to itself (allow_cross_tenant is "
            f"false): it cannot be promoted to tenant {tenant!r}"
        )


def _refusing(audit: DecisionLog | None, tenant: str, action: str, candidate: Candidate):
    """Context: a ControlError / CompositeError inside is logged as refused and re-raised."""

    class _Refusal:
        def __enter__(self):
            return self

        def __exit__(self, kind, error, tb):
            if audit is not None and isinstance(error, ControlError | CompositeError):
                audit.record(
                    "refused", tenant, action=action, candidate=candidate.to_json(),
                    error=f"{type(error).__name__}: {error}",
                )  # fmt: skip
            return False

    return _Refusal()


def _reason(candidate: Candidate, reason: str) -> str:
    return reason or f"{candidate.surface} {candidate.id}: {candidate.rationale}".strip()


def promote(
    store: CompositeStore,
    tenant: str,
    candidate: Candidate,
    *,
    audit: DecisionLog | None = None,
    canaries: CanaryBook | None = None,
    reason: str = "",
    expected_version: int | None = None,
) -> CompositePolicy:
    """Store the candidate applied to the tenant's current composite as its next version."""
    with _refusing(audit, tenant, "promote", candidate):
        if candidate.surface == "noop":
            raise ControlError("the no-op changes nothing: there is nothing to promote")
        check_scope(store, candidate, tenant)
        if canaries is not None and canaries.get(tenant) is not None:
            raise CanaryError(
                f"a canary is running for {tenant!r}; finish it (keep or drop) before promoting"
            )
        current = store.current(tenant)
        spec = candidate.apply_to(current.spec)
        expected = current.version if expected_version is None else expected_version
        made = store.put(tenant, spec, reason=_reason(candidate, reason), expected_version=expected)
    if audit is not None:
        audit.record(
            "promote", tenant, version=made.version, parent=made.parent,
            candidate=candidate.to_json(), fingerprints=made.fingerprints,
        )  # fmt: skip
    return made


def start_canary(
    store: CompositeStore,
    canaries: CanaryBook,
    tenant: str,
    candidate: Candidate,
    *,
    share: float,
    audit: DecisionLog | None = None,
    reason: str = "",
    salt: str | None = None,
) -> Canary:
    """Store the candidate as the next version and serve it to `share` of the sessions."""
    with _refusing(audit, tenant, "canary_start", candidate):
        if candidate.surface == "noop":
            raise ControlError("the no-op changes nothing: there is nothing to canary")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share < 1:
            raise CanaryError(f"canary share must be in (0, 1), got {share!r}")
        check_scope(store, candidate, tenant)
        if canaries.get(tenant) is not None:
            raise CanaryError(f"a canary is already running for {tenant!r}; finish it first")
        current = store.current(tenant)
        spec = candidate.apply_to(current.spec)
        made = store.put(
            tenant,
            spec,
            reason="canary: " + _reason(candidate, reason),
            expected_version=current.version,
        )
        canary = canaries.start(
            tenant, share=share, version=made.version, baseline=current.version, salt=salt
        )
    if audit is not None:
        audit.record("canary_start", tenant, canary=canary.to_json(), candidate=candidate.to_json())
    return canary


def finish_canary(
    store: CompositeStore,
    canaries: CanaryBook,
    tenant: str,
    *,
    keep: bool,
    audit: DecisionLog | None = None,
    reason: str = "",
) -> CompositePolicy:
    """End the tenant's canary: keep the candidate for everyone, or drop it (a rollback to
    the baseline's content as the next version). Returns the composite now serving."""
    canary = canaries.get(tenant)
    if canary is None:
        raise CanaryError(f"tenant {tenant!r} has no canary running")
    canaries.stop(tenant)
    if keep:
        serving = store.current(tenant)
    else:
        serving = store.rollback(
            tenant, canary.baseline, reason=reason or f"canary of version {canary.version} dropped"
        )
    if audit is not None:
        audit.record("canary_stop", tenant, canary=canary.to_json(), kept=keep,
                     serving=serving.version, reason=reason)  # fmt: skip
        if not keep:
            audit.record("rollback", tenant, version=serving.version,
                         rollback_of=canary.baseline, reason=reason or "canary dropped")  # fmt: skip
    return serving


@dataclasses.dataclass(frozen=True)
class WatchResult:
    """status: "regressed" (rolled back when asked), "ok", "insufficient" (too few labelled
    sessions on either side) or "no_previous" (nothing to compare with). current / previous:
    live success of the two versions; delta: current - previous (Newcombe interval);
    rolled_back_to: the version the rollback made, if any."""

    tenant: str
    status: str
    current_version: int
    previous_version: int | None
    current: Estimate | None = None
    previous: Estimate | None = None
    delta: Estimate | None = None
    rolled_back_to: int | None = None
    canary: bool = False

    def to_json(self) -> dict[str, Any]:
        def est(e):
            return None if e is None else e.to_json()

        return {
            "tenant": self.tenant,
            "status": self.status,
            "current_version": self.current_version,
            "previous_version": self.previous_version,
            "current": est(self.current),
            "previous": est(self.previous),
            "delta": est(self.delta),
            "rolled_back_to": self.rolled_back_to,
            "canary": self.canary,
        }


def watch(
    store: CompositeStore,
    atdp: AtdpStore,
    tenant: str,
    *,
    audit: DecisionLog | None = None,
    canaries: CanaryBook | None = None,
    since: float | None = None,
    confidence: float = 0.95,
    min_sessions: int = 10,
    rollback: bool = True,
) -> WatchResult:
    """Compare live success of the serving version with the previous one (module docstring)
    and roll back on a regression beyond the interval (unless `rollback` is False)."""
    current = store.current(tenant)
    canary = canaries.get(tenant) if canaries is not None else None
    in_canary = canary is not None and canary.version == current.version
    # outside a canary: the closest earlier version live traffic measured (a version promoted
    # and replaced before any session ran it is skipped), else the parent
    earlier = [canary.baseline] if in_canary else _ancestors(store, tenant, current)
    if current.version == 0 or not earlier:
        previous = earlier[0] if earlier else None
        result = WatchResult(tenant, "no_previous", current.version, previous)
        return _watched(result, audit)
    try:
        window = read_window(atdp, WindowSpec(tenant, since=since,
                                              versions=(*earlier, current.version)))  # fmt: skip
    except UnknownTenant:
        window = []
    by_version = success_by_version([facts(t) for t in window], confidence)
    measured = [v for v in earlier if v in by_version and by_version[v].n >= min_sessions]
    previous = measured[0] if measured else earlier[0]
    empty = wilson(0, 0, confidence)
    now, before = by_version.get(current.version, empty), by_version.get(previous, empty)
    delta = rate_difference(now, before)
    if min(now.n, before.n) < min_sessions:
        status = "insufficient"
    else:
        status = "regressed" if delta.high < 0 else "ok"
    rolled = None
    if status == "regressed" and rollback:
        reason = (
            f"live success fell from {before.value:.2f} (version {previous}, n={before.n}) to "
            f"{now.value:.2f} (version {current.version}, n={now.n}); "
            f"difference {delta.value:+.2f} [{delta.low:+.2f}, {delta.high:+.2f}]"
        )
        if in_canary:
            made = finish_canary(store, canaries, tenant, keep=False, audit=audit, reason=reason)
        else:
            made = store.rollback(tenant, previous, reason=reason)
            if audit is not None:
                audit.record("rollback", tenant, version=made.version, rollback_of=previous,
                             reason=reason)  # fmt: skip
        rolled = made.version
    result = WatchResult(
        tenant, status, current.version, previous, now, before, delta, rolled, in_canary
    )
    return _watched(result, audit)


def _ancestors(
    store: CompositeStore, tenant: str, current: CompositePolicy, limit: int = 64
) -> list[int]:
    """The versions `current` was made from, nearest first (parent, its parent, ... 0)."""
    out, version = [], current.parent
    while version is not None and len(out) < limit:
        out.append(version)
        version = store.get(tenant, version).parent if version > 0 else None
    return out


def _watched(result: WatchResult, audit: DecisionLog | None) -> WatchResult:
    if audit is not None:
        entry = result.to_json()
        audit.record("watch", entry.pop("tenant"), **entry)
    return result
