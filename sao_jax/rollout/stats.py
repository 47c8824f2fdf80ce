"""Thread-safe counters of what rollouts produced: episodes, steps, tokens, drops, success."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from sao_jax.rollout.episode import Episode


class RolloutStats:
    """Accumulates finished episodes and named counters from any number of threads.

    `snapshot()` returns plain numbers: episodes, won, success_rate, env_steps, llm_calls,
    generated_tokens, prompt_tokens, invalid_replies, invalid_reply_rate, inadmissible_commands,
    inadmissible_rate (well-formed commands the room does not admit, per env step),
    repeated_observations, repeat_rate (admitted commands whose answer the episode had already
    seen, per env step: `Turn.repeated_observation`), avg_steps,
    truncated_context, truncated_step_limit, dropped_stale, weight_syncs, rollout_seconds
    (0 until counted), every other counter given to `add`, and `by_task_type` = {task type:
    {episodes, won, success_rate}} over `task_types` (the env's `TextEnv.task_types`: listed
    even before an episode of theirs) and every type seen.
    """

    def __init__(self, task_types: Sequence[str] = ()):
        self._lock = threading.Lock()
        self._counts: Counter = Counter()
        self._by_type = {t: [0, 0] for t in task_types}  # [episodes, won]

    def add(self, key: str, value: float = 1) -> None:
        with self._lock:
            self._counts[key] += value

    def add_episodes(self, episodes: Iterable[Episode]) -> None:
        for episode in episodes:
            turns = episode.turns
            with self._lock:
                c = self._counts
                c["episodes"] += 1
                c["won"] += int(episode.won)
                c["env_steps"] += len(turns)
                c["llm_calls"] += len(turns)
                c["generated_tokens"] += episode.generated_tokens
                c["prompt_tokens"] += sum(int(t.input_ids.shape[0]) for t in turns)
                c["invalid_replies"] += episode.invalid_replies
                c["inadmissible_commands"] += episode.inadmissible_commands
                c["repeated_observations"] += episode.repeated_observations
                c["truncated_context"] += int(episode.truncated_by == "context")
                c["truncated_step_limit"] += int(episode.truncated_by == "step_limit")
                c["reward_sum"] += episode.total_reward
                counts = self._by_type.setdefault(episode.task_type, [0, 0])
                counts[0] += 1
                counts[1] += int(episode.won)

    def snapshot(self) -> dict:
        with self._lock:
            counts = dict(self._counts)
            by_type = {t: list(v) for t, v in self._by_type.items()}
        return _finish(counts, by_type)


# rate name -> (numerator counter, denominator counter) of `RolloutStats.snapshot()`: the
# snapshot's rates over every counted episode / step, `interval_rates` over those in between
COUNTER_RATES = {
    "success_rate": ("won", "episodes"),
    "avg_steps": ("env_steps", "episodes"),
    "invalid_reply_rate": ("invalid_replies", "env_steps"),
    "inadmissible_rate": ("inadmissible_commands", "env_steps"),
    "repeat_rate": ("repeated_observations", "env_steps"),
}
_RATES = (*COUNTER_RATES, "avg_reward")
_LEVELS = ("policy_version",)  # the same clock on every engine: combined by max, not summed


def combine_snapshots(snapshots: Sequence[Mapping]) -> dict:
    """One `RolloutStats.snapshot()` over the episodes of several (e.g. every process's engine):
    counters add up, rates are recomputed from the sums, `policy_version` is the newest.
    Non-numeric entries are dropped."""
    counts: Counter = Counter()
    by_type: dict[str, list[int]] = {}
    for snapshot in snapshots:
        for key, value in snapshot.items():
            if key in _RATES or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if key in _LEVELS:
                counts[key] = max(counts.get(key, value), value)
            else:
                counts[key] += value
        counts["reward_sum"] += snapshot.get("avg_reward", 0.0) * snapshot.get("episodes", 0)
        for task_type, row in snapshot.get("by_task_type", {}).items():
            totals = by_type.setdefault(task_type, [0, 0])
            totals[0] += row["episodes"]
            totals[1] += row["won"]
    return _finish(dict(counts), by_type)


def interval_rates(earlier: Mapping | None, later: Mapping) -> dict[str, float]:
    """The snapshot rates over what happened between two snapshots of the same counters
    (`earlier` None: since they started): the `success_rate` of the episodes finished in
    between, their `avg_steps`, and the per-step rates of the steps counted in between. A rate
    whose denominator did not move is left out (nothing to measure), never 0.

    The snapshot's own rates are cumulative; these show what the latest episodes do."""
    earlier = earlier or {}
    rates = {}
    for name, (numerator, denominator) in COUNTER_RATES.items():
        total = later.get(denominator, 0) - earlier.get(denominator, 0)
        if total < 0:
            raise ValueError(
                f"{denominator} went down ({earlier[denominator]} -> {later[denominator]})"
            )
        if total:
            rates[name] = (later.get(numerator, 0) - earlier.get(numerator, 0)) / total
    return rates


def _finish(counts: dict, by_type: Mapping[str, Sequence[int]]) -> dict:
    """Counters with every standard key, the rates and `by_task_type` filled in."""
    for key in (
        "episodes",
        "won",
        "env_steps",
        "llm_calls",
        "generated_tokens",
        "prompt_tokens",
        "invalid_replies",
        "inadmissible_commands",
        "repeated_observations",
        "truncated_context",
        "truncated_step_limit",
        "dropped_stale",
        "weight_syncs",
    ):
        counts.setdefault(key, 0)
    counts.setdefault("rollout_seconds", 0.0)
    for name, (numerator, denominator) in COUNTER_RATES.items():
        total = counts[denominator]
        counts[name] = counts[numerator] / total if total else 0.0
    episodes = counts["episodes"]
    counts["avg_reward"] = counts.pop("reward_sum", 0.0) / episodes if episodes else 0.0
    counts["by_task_type"] = {
        t: {"episodes": n, "won": w, "success_rate": w / n if n else 0.0}
        for t, (n, w) in by_type.items()
    }
    return counts
