"""Approximate replay: recorded tasks played again under a composite, by an agent function.

A trajectory whose `header.task` names a registered env, its split and task index (as the
online agent and the rollout record it) can be reset to the same task
(`env_from_task_spec`). `play` runs an episode of it with `atdp_io.replay.rerun_episode`: each
turn the env's prompt (its harness, the recorded prompt options: history length, think,
style) is sent as one user message, the composite is applied to it (`apply_chat`: harness,
memory, as the gateway would) and `agent(messages, policy)` answers with the reply text. The
episode is won as the env says.

The agent is the model under test: `agent(messages the model sees, the composite's PolicyRef,
the replies it must choose from or None) -> reply` (the choices are the harness's
`reply_choices` for that prompt, which the gateway would send as the request's choice list). In an experiment it calls the policy behind the gateway's worker directly (not
through the gateway, which would apply the tenant's composite a second time).

`replay_evidence` plays the same episodes under the current composite and the candidate and
compares their success (paired per episode, bootstrap interval over episodes). Past failures
come first in the replay set, then known successes (`replay_set`), one episode per task.
Only the windowed layout (each turn one fresh prompt) is replayed.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from atdp_io import Trajectory
from atdp_io.replay import rerun_episode
from sao_jax.envs.base import PromptOptions
from sao_jax.envs.prompted import PromptedEnv
from sao_jax.envs.registry import env_from_task_spec
from serving.control.apply import apply_chat
from serving.control.composite import CompositePolicy, CompositeSpec, PolicyRef, fingerprint
from serving.control.evidence import Evidence, judge, skipped
from serving.control.facts import facts
from serving.control.stats import bootstrap_mean, wilson

ReplayAgent = Callable[[Sequence[Mapping[str, Any]], PolicyRef, tuple[str, ...] | None], str]


def replayable(trajectory: Trajectory) -> bool:
    """Whether the trajectory's task can be reset and played again (windowed layout)."""
    f = facts(trajectory)
    return f.resettable and f.task.get("layout", "windowed") == "windowed"


class _PromptedTask:
    """The recorded task as `rerun_episode`'s env: prompts in, replies out, reward 1 on a win."""

    def __init__(self, task: Mapping[str, Any]):
        defaults = PromptOptions()
        options = PromptOptions(
            history_length=int(task.get("history_length", defaults.history_length)),
            think=bool(task.get("think", False)),
            memory_line=bool(task.get("memory_line", False)),
            style=str(task.get("prompt_style", defaults.style)),
        )
        self.prompted = PromptedEnv(env_from_task_spec(task), options)
        self.index = int(task["index"])

    def reset(self) -> tuple[str, dict]:
        return self.prompted.reset(self.index)

    def step(self, reply: str) -> tuple[str, float, bool, dict]:
        prompt, _, done, info = self.prompted.step(reply)
        return prompt, float(bool(info["won"])), done, info


def play(trajectory: Trajectory, spec: CompositeSpec, agent: ReplayAgent) -> bool:
    """Whether `agent` wins the trajectory's task under composite `spec`."""
    composite = CompositePolicy(tenant="replay", version=1, spec=spec)

    def policy(prompts: Sequence[str]) -> str:
        shown = apply_chat(composite, [{"role": "user", "content": prompts[-1]}], None)
        return agent(shown.messages, spec.policy, shown.reply_choices)

    max_steps = int(trajectory.header.task.get("max_steps", 50))
    return rerun_episode(trajectory, _PromptedTask, policy, max_steps=max_steps).total_reward > 0


def replay_set(trajectories: Sequence[Trajectory], max_episodes: int) -> list[Trajectory]:
    """Up to `max_episodes` replayable trajectories, one per task: failures first (up to half,
    more if there are too few successes), then successes; in recorded order."""
    seen: set[str] = set()
    groups: dict[bool, list[Trajectory]] = collections.defaultdict(list)
    for t in trajectories:
        f = facts(t)
        if f.success is None or f.task_id in seen or not replayable(t):
            continue
        seen.add(f.task_id)
        groups[bool(f.success)].append(t)
    failures, successes = groups[False], groups[True]
    n_fail = min(len(failures), max(max_episodes // 2, max_episodes - len(successes)))
    return failures[:n_fail] + successes[: max_episodes - n_fail]


def _won(
    trajectory: Trajectory,
    spec: CompositeSpec,
    agent: ReplayAgent,
    cache: MutableMapping[tuple[str, str], bool] | None,
) -> bool:
    key = (trajectory.trajectory_id, fingerprint(spec.to_json()))
    if cache is not None and key in cache:
        return cache[key]
    won = play(trajectory, spec, agent)
    if cache is not None:
        cache[key] = won
    return won


def replay_evidence(
    base: CompositeSpec,
    candidate: CompositeSpec,
    episodes: Sequence[Trajectory],
    agent: ReplayAgent,
    *,
    min_gain: float = 0.0,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    cache: MutableMapping[tuple[str, str], bool] | None = None,
) -> Evidence:
    """Success of `episodes` replayed under `candidate` vs `base`: "better" when the paired
    gain's interval lies above `min_gain`, "worse" when it lies below 0. `cache` keeps each
    (episode, composite) result, so the current composite is played once per gate round."""
    metric = "replay_success_rate"
    if not episodes:
        return skipped("replay", metric, "no recorded episode with a resettable task spec")
    before = [_won(t, base, agent, cache) for t in episodes]
    after = [_won(t, candidate, agent, cache) for t in episodes]
    diffs = [float(a) - float(b) for a, b in zip(after, before, strict=True)]
    delta = bootstrap_mean(diffs, confidence, resamples=resamples, seed=seed)
    return Evidence(
        "replay",
        metric,
        judge(delta, better_above=min_gain, worse_below=0.0),
        baseline=wilson(sum(before), len(before), confidence),
        candidate=wilson(sum(after), len(after), confidence),
        delta=delta,
        detail={
            "episodes": [
                {"trajectory_id": t.trajectory_id, "task": facts(t).task_id,
                 "baseline": b, "candidate": a}
                for t, b, a in zip(episodes, before, after, strict=True)
            ],
            "min_gain": min_gain,
        },
    )  # fmt: skip
