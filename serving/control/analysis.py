"""Failure analysis over a window of trajectories: failures grouped into modes (pure).

`analyse(trajectories)` reads each trajectory's facts (`facts.py`) and groups the failed ones
into failure modes, one per (kind, key):

| kind | key | a failed trajectory shows it when |
|---|---|---|
| `task` | task id | it played that task (ALFWorld game) |
| `task_type` | task type | its task is of that type |
| `tenant` | tenant | it is that tenant's |
| `format` | parse error | a reply could not be parsed (no `<action>` block, ...) |
| `refused_action` | env feedback | the env refused a command ("Nothing happens.") |
| `tool` | tool name | a call of that tool failed (validation, tool error) |
| `error` | error class | an event carries another error class (generation_error, ...) |
| `final_state` | how it ended | step_limit, truncated, ended |

For each mode: `count` (failed trajectories showing it), `total` (all trajectories showing it,
successes included), `share` (count / failures of the window), `failure_rate` (count / total
with its Wilson interval: a symptom that is as common in successes is not what fails), the
spread of its failures (tenants, task types, tasks) and example trajectory ids. Trajectories
without an outcome (open, or closed without a success flag) are counted but never failures.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from atdp_io import Trajectory
from serving.control.facts import TrajectoryFacts, facts, normalized
from serving.control.stats import Estimate, wilson
from serving.control.store import ControlError

MODE_KINDS = (
    "task",
    "task_type",
    "tenant",
    "format",
    "refused_action",
    "tool",
    "error",
    "final_state",
)


class EmptyWindow(ControlError):
    """A window that holds no trajectory to analyse."""


@dataclasses.dataclass(frozen=True)
class FailureMode:
    """One failure mode of a window (see the module docstring for the fields)."""

    kind: str
    key: str
    count: int
    total: int
    share: float
    failure_rate: Estimate
    examples: tuple[str, ...]
    tenants: tuple[str, ...]
    task_types: tuple[str, ...]
    tasks: tuple[str, ...]
    detail: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.key}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "key": self.key,
            "count": self.count,
            "total": self.total,
            "share": self.share,
            "failure_rate": self.failure_rate.to_json(),
            "examples": list(self.examples),
            "tenants": list(self.tenants),
            "task_types": list(self.task_types),
            "tasks": len(self.tasks),
            "detail": dict(self.detail),
        }


@dataclasses.dataclass(frozen=True)
class Analysis:
    """The failure modes of a window, most frequent first, and its success rates.

    by_version: composite version -> success rate of the trajectories it served alone
    (None: trajectories recorded without a version, or served by several).
    """

    window: Mapping[str, Any]
    n: int
    successes: int
    failures: int
    success_rate: Estimate
    by_version: Mapping[int | None, Estimate]
    modes: tuple[FailureMode, ...]
    facts: tuple[TrajectoryFacts, ...]

    @property
    def tenants(self) -> tuple[str, ...]:
        return tuple(sorted({f.tenant for f in self.facts}))

    def mode(self, mode_id: str) -> FailureMode:
        for mode in self.modes:
            if mode.id == mode_id:
                return mode
        raise KeyError(f"no failure mode {mode_id!r}; modes: {[m.id for m in self.modes]}")

    def dominant(self, *, min_share: float = 0.25, min_count: int = 2) -> list[FailureMode]:
        """Modes shown by at least `min_count` failures and `min_share` of all failures."""
        return [m for m in self.modes if m.count >= min_count and m.share >= min_share]

    def to_json(self, *, with_facts: bool = False) -> dict[str, Any]:
        out = {
            "window": dict(self.window),
            "trajectories": self.n,
            "successes": self.successes,
            "failures": self.failures,
            "success_rate": self.success_rate.to_json(),
            "by_version": {
                ("none" if v is None else str(v)): e.to_json() for v, e in self.by_version.items()
            },
            "modes": [m.to_json() for m in self.modes],
        }
        if with_facts:
            out["trajectory_facts"] = [dataclasses.asdict(f) for f in self.facts]
        return out


def mode_keys(f: TrajectoryFacts) -> dict[tuple[str, str], list[str]]:
    """(kind, key) -> details (commands, errors) of every mode the trajectory shows."""
    keys: dict[tuple[str, str], list[str]] = {}

    def add(kind: str, key: str, detail: str = "") -> None:
        keys.setdefault((kind, key), []).append(detail)

    if f.task_id:
        add("task", f.task_id, f.task_text)
    if f.task_type:
        add("task_type", f.task_type)
    add("tenant", f.tenant)
    if f.final_state not in ("success", "open", "unlabelled"):
        add("final_state", f.final_state)
    for error in f.format_errors:
        add("format", normalized(error), error)
    for command, feedback in f.refused:
        add("refused_action", normalized(feedback), command)
    for tool, error in f.tool_errors:
        add("tool", tool, normalized(error))
    for error in f.errors:
        add("error", error)
    return keys


def analyse(
    trajectories: Iterable[Trajectory | TrajectoryFacts],
    *,
    window: Mapping[str, Any] | None = None,
    max_examples: int = 5,
    confidence: float = 0.95,
) -> Analysis:
    """The `Analysis` of trajectories (decoded ones or their facts); `window` describes where
    they came from (kept in the result). An empty window is an `EmptyWindow` error."""
    all_facts = tuple(t if isinstance(t, TrajectoryFacts) else facts(t) for t in trajectories)
    if not all_facts:
        raise EmptyWindow(
            f"the window {dict(window or {})} holds no trajectory: widen it (time range, "
            "versions) or wait for traffic"
        )
    labelled = [f for f in all_facts if f.success is not None]
    failed = [f for f in labelled if not f.success]
    totals: collections.Counter = collections.Counter()
    for f in all_facts:
        totals.update(mode_keys(f).keys())
    groups: dict[tuple[str, str], list[tuple[TrajectoryFacts, list[str]]]] = (
        collections.defaultdict(list)
    )
    for f in failed:
        for key, details in mode_keys(f).items():
            groups[key].append((f, details))
    modes = [_mode(key, members, totals[key], len(failed), max_examples, confidence)
             for key, members in groups.items()]  # fmt: skip
    modes.sort(key=lambda m: (-m.count, MODE_KINDS.index(m.kind), m.key))
    return Analysis(
        window=dict(window or {}),
        n=len(all_facts),
        successes=len(labelled) - len(failed),
        failures=len(failed),
        success_rate=wilson(len(labelled) - len(failed), len(labelled), confidence),
        by_version=success_by_version(all_facts, confidence),
        modes=tuple(modes),
        facts=all_facts,
    )


def success_by_version(
    all_facts: Sequence[TrajectoryFacts], confidence: float = 0.95
) -> dict[int | None, Estimate]:
    """Composite version -> success rate of its labelled trajectories (Wilson)."""
    counts: dict[int | None, list[int]] = collections.defaultdict(lambda: [0, 0])
    for f in all_facts:
        if f.success is not None:
            counts[f.version][0] += int(f.success)
            counts[f.version][1] += 1
    ordered = sorted(counts, key=lambda v: (v is None, v or 0))
    return {v: wilson(counts[v][0], counts[v][1], confidence) for v in ordered}


def _mode(key, members, total, failures, max_examples, confidence) -> FailureMode:
    kind, name = key
    count = len(members)
    detail = collections.Counter(d for _, details in members for d in details if d)
    return FailureMode(
        kind=kind,
        key=name,
        count=count,
        total=total,
        share=count / failures,
        failure_rate=wilson(count, total, confidence),
        examples=tuple(f.trajectory_id for f, _ in members[:max_examples]),
        tenants=tuple(sorted({f.tenant for f, _ in members})),
        task_types=tuple(sorted({f.task_type for f, _ in members if f.task_type})),
        tasks=tuple(sorted({f.task_id for f, _ in members if f.task_id})),
        detail=dict(detail.most_common(5)),
    )
