"""What an evolution run records and reports: one entry per round and tenant, the governance
and attribution checks, summary.json, the round table and evolution.png."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from atdp_io import EventKind
from sao_jax.metrics import plot_learning_curves, read_metrics, save_summary, summary_table
from serving.control.candidates import Candidate
from serving.control.deploy import CrossTenantRefused, WatchResult, promote
from serving.control.gate import GateResult
from serving.control.plane import ControlPlane, RoundResult
from serving.control.window import UnknownTenant, WindowSpec, read_window


def _delta(result: GateResult, method: str) -> float | None:
    for evidence in result.evidence:
        if evidence.method == method and evidence.delta is not None:
            return round(evidence.delta.value, 4)
    return None


def candidate_entry(result: GateResult, planted: bool) -> dict[str, Any]:
    return {
        "id": result.candidate.id,
        "surface": result.candidate.surface,
        "source": result.candidate.provenance.analyzer,
        "planted": planted,
        "verdict": result.verdict,
        "replay": _delta(result, "replay"),
        "rescore": _delta(result, "rescore"),
        "reasons": list(result.reasons),
    }


def _modes(result: RoundResult, tenant: str) -> list[str]:
    """The dominant failure modes of the round's analysis (all tenants' windows), without
    the other tenants' own `tenant:` modes."""
    return [m.id for m in result.analysis.dominant() if m.kind != "tenant" or m.key == tenant]


def round_entry(
    index: int,
    window,
    watched: WatchResult,
    result: RoundResult | None,
    is_planted: Callable[[Candidate], bool],
    injected: dict[str, Any] | None,
) -> dict[str, Any]:
    """One tenant's round: its live window, the watch, and the control plane's round."""
    candidates = [] if result is None else [
        candidate_entry(r, is_planted(r.candidate)) for r in result.results
    ]  # fmt: skip
    if watched.rolled_back_to is not None:
        action = "rollback"
    elif result is None:
        action = "measure"
    else:
        action = result.decision.surface
    return {
        "round": index,
        "tenant": window.tenant,
        "served_version": watched.current_version,
        "live_success": window.success,
        "episodes": len(window.records),
        "won": sum(r["won"] for r in window.records),
        "window_seconds": round(window.seconds, 1),
        "injected": injected,
        "watch": watched.status,
        "rolled_back_to": watched.rolled_back_to,
        "failure_modes": [] if result is None else _modes(result, window.tenant),
        "recommended": {} if result is None else dict(result.decision.recommended),
        "candidates": candidates,
        "refused": [c["id"] for c in candidates if c["verdict"] == "refuse"],
        "passed": [c["id"] for c in candidates if c["verdict"] == "pass"],
        "action": action,
        "chosen": None if result is None or result.decision.chosen is None
        else result.decision.chosen.candidate.id,
        "reason": "" if result is None else result.decision.reason,
        "shipped": None if result is None or result.shipped is None else result.shipped.version,
    }  # fmt: skip


def cross_tenant_check(
    plane: ControlPlane, candidate: Candidate | None, target: str
) -> dict[str, Any]:
    """Offer `candidate` (learned from another tenant) to `target`: governance must refuse it
    and leave `target`'s composite as it was."""
    if candidate is None:
        return {"checked": False, "reason": "no candidate was proposed to offer"}
    before = plane.store.current(target)
    error = ""
    try:
        promote(plane.store, target, candidate, audit=plane.audit, canaries=plane.canaries)
    except CrossTenantRefused as refused:
        error = str(refused)
    after = plane.store.current(target)
    return {
        "checked": True,
        "candidate": candidate.id,
        "surface": candidate.surface,
        "source_tenant": candidate.provenance.tenant,
        "target_tenant": target,
        "refused": bool(error),
        "error": error,
        "target_version_before": before.version,
        "target_version_after": after.version,
        "target_unchanged": before.fingerprints == after.fingerprints,
    }


def audit_checks(plane: ControlPlane, book, tenants: Sequence[str]) -> dict[str, Any]:
    """Per tenant, over every call its agent made: calls not attributed to a composite version,
    calls sampled by other weights than their composite's `PolicyRef` names, and calls sampled
    by weights learned from another tenant's data."""
    out = {}
    for tenant in tenants:
        try:
            trajectories = read_window(plane.atdp, WindowSpec(tenant))
        except UnknownTenant:
            trajectories = []
        calls = unattributed = wrong_weights = foreign = 0
        for trajectory in trajectories:
            for event in trajectory.events:
                if event.kind != EventKind.LLM_CALL:
                    continue
                calls += 1
                meta = event.metadata
                unattributed += meta.composite_version is None
                label = meta.policy_version
                wrong_weights += book.ids.get(label) != event.llm.policy_version
                foreign += bool(book.sources.get(label, frozenset()) - {tenant})
        out[tenant] = {
            "trajectories": len(trajectories),
            "calls": calls,
            "unattributed_calls": unattributed,
            "calls_not_by_their_policy": wrong_weights,
            "calls_by_other_tenants_policy": foreign,
            "composite_versions": plane.store.current(tenant).version,
        }
    return out


def _by_tenant(entries: Sequence[dict], key: str, tenants: Sequence[str]) -> dict[str, list]:
    return {t: [e[key] for e in entries if e["tenant"] == t] for t in tenants}


def _candidates_where(entries: Sequence[dict], keep: Callable[[dict], bool]) -> list[dict]:
    """The candidates of every round `keep` accepts, each with its round and tenant."""
    return [
        {"round": e["round"], "tenant": e["tenant"], **c}
        for e in entries for c in e["candidates"] if keep(c)
    ]  # fmt: skip


def summarize(
    config, entries: Sequence[dict], cross: dict, checks: dict, *, seconds: dict[str, float]
) -> dict:
    """summary.json: the rounds, actions, live success, rollbacks, refusals and checks."""
    tenants = config.evolve.tenants
    success = _by_tenant(entries, "live_success", tenants)
    rounds = len(next(iter(success.values())))
    success["mean"] = [sum(success[t][i] for t in tenants) / len(tenants) for i in range(rounds)]
    refused = _candidates_where(entries, lambda c: c["verdict"] == "refuse")
    planted = _candidates_where(entries, lambda c: c["planted"])
    rollbacks = [
        {"round": e["round"], "tenant": e["tenant"], "from_version": e["served_version"],
         "to_version": e["rolled_back_to"], "injected_round": _injected_round(entries, e)}
        for e in entries if e["rolled_back_to"] is not None
    ]  # fmt: skip
    injected = [{"round": e["round"], "tenant": e["tenant"], **e["injected"]}
                for e in entries if e["injected"]]  # fmt: skip
    actions = _by_tenant([e for e in entries if e["round"] <= config.evolve.rounds], "action",
                         tenants)  # fmt: skip
    chosen = sorted({a for acts in actions.values() for a in acts} - {"noop", "rollback"})
    return {
        "tenants": list(tenants),
        "rounds": list(entries),
        "actions": actions,
        "surfaces_chosen": chosen,
        "success_by_round": success,
        "live_gain_points": round(100 * (success["mean"][-1] - success["mean"][0]), 1),
        "rollbacks": rollbacks,
        "injected_regressions": injected,
        "refused_candidates": refused,
        "planted_candidates": planted,
        "planted_refused": bool(planted) and all(c["verdict"] == "refuse" for c in planted),
        "cross_tenant": cross,
        "attribution": checks,
        "from_run": config.warm_start.from_run,
        "wall_seconds": round(seconds["total"], 1),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }


def _injected_round(entries: Sequence[dict], rollback: dict) -> int | None:
    for e in entries:
        same = e["tenant"] == rollback["tenant"] and e["round"] <= rollback["round"]
        if same and e["injected"] and e["injected"]["version"] == rollback["served_version"]:
            return e["round"]
    return None


def _described(candidate: dict) -> str:
    """Planted mark, surface, verdict, deltas: "*policy refuse replay -0.25 rescore -1.30"."""
    text = f"{'*' if candidate['planted'] else ''}{candidate['surface']} {candidate['verdict']}"
    for method in ("replay", "rescore"):
        if candidate[method] is not None:
            text += f" {method} {candidate[method]:+.2f}"
    return text


def table_rows(summary: dict) -> list[dict[str, Any]]:
    """The round table: round, tenant, live success, failure modes, candidates with their gate
    verdict and replay / re-score deltas, the action."""
    rows = []
    for e in summary["rounds"]:
        candidates = "; ".join(_described(c) for c in e["candidates"] if c["surface"] != "noop")
        action = e["action"] if e["shipped"] is None else f"{e['action']} -> v{e['shipped']}"
        if e["rolled_back_to"] is not None:
            action = f"rollback -> v{e['rolled_back_to']}"
        rows.append(
            {
                "round": e["round"],
                "tenant": e["tenant"],
                "version": e["served_version"],
                "live success": e["live_success"],
                "failure modes": ", ".join(e["failure_modes"][:3]),
                "candidates (* planted)": candidates,
                "action": action,
            }
        )
    return rows


def write_report(out: Path, summary: dict) -> None:
    """DIR/summary.json, DIR/evolution.png and the round table on the terminal."""
    save_summary(out, summary)
    records = read_metrics(out)
    keys = [k for k in (*(f"live/{t}/success" for t in summary["tenants"]), "live/mean_success",
                        "gate/refused", "rollbacks") if any(k in r for r in records)]  # fmt: skip
    plot_learning_curves(records, out / "evolution.png", keys=keys, title=str(out))
    print(summary_table(table_rows(summary), floatfmt=".2f"))
    figures = {k: v for k, v in summary.items() if not isinstance(v, dict | list)}
    figures["surfaces_chosen"] = ", ".join(summary["surfaces_chosen"]) or "none"
    figures["rollbacks"] = len(summary["rollbacks"])
    figures["refused_candidates"] = len(summary["refused_candidates"])
    print(summary_table(figures))
