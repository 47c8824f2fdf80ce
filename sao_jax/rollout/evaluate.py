"""Batched greedy evaluation on a split of any registered env: success overall and per task
type (or, on request, success under sampling: the mean over several sampled plays a game).

Every game of the split (or the first `num_games`) is played exactly once with greedy
decoding over `num_envs` KV-cache slots. MoE routing in the sampler is dropless and each
row's result is independent of its batch neighbours, so the result is a pure function of the
weights, the games and the configs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from sao_jax.models import Transformer
from sao_jax.rollout.agent_loop import AgentLoop, EnvConfig, RolloutConfig
from sao_jax.rollout.episode import Episode
from sao_jax.rollout.sampler import Sampler
from sao_jax.rollout.stats import RolloutStats, combine_snapshots
from sao_jax.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """success_rate, avg_steps, invalid_reply_rate, inadmissible_rate and repeat_rate (malformed
    replies, well-formed commands the room does not admit, and admitted commands whose answer
    the episode had already seen, each per env step) and avg_reward over
    `episodes` games of `split`; by_task_type = {task type: {episodes, won, success_rate}}
    (types with no game in the evaluated subset have 0 episodes)."""

    split: str
    episodes: int
    success_rate: float
    by_task_type: dict[str, dict[str, float]]
    avg_steps: float
    invalid_reply_rate: float
    inadmissible_rate: float
    avg_reward: float
    truncated_context: int
    policy_version: int
    wall_seconds: float
    repeat_rate: float = 0.0

    def metrics(self, prefix: str | None = None) -> dict[str, float]:
        """Flat scalars for a metrics log: `{prefix}/success`, `{prefix}/success/<task type>`, ..."""
        prefix = prefix or f"eval/{self.split}"
        out = {
            f"{prefix}/success": self.success_rate,
            f"{prefix}/avg_steps": self.avg_steps,
            f"{prefix}/invalid_reply_rate": self.invalid_reply_rate,
            f"{prefix}/inadmissible_rate": self.inadmissible_rate,
            f"{prefix}/repeat_rate": self.repeat_rate,
            f"{prefix}/avg_reward": self.avg_reward,
        }
        for task_type, row in self.by_task_type.items():
            if row["episodes"]:
                out[f"{prefix}/success/{task_type}"] = row["success_rate"]
        return out

    @classmethod
    def combine(cls, parts: Sequence[EvalResult]) -> EvalResult:
        """One result over disjoint game sets of one split and policy version (the shards that
        the processes of a multi-host job evaluated, see `evaluate(shard=...)`)."""
        if not parts:
            raise ValueError("EvalResult.combine: no results to combine")
        if len({(p.split, p.policy_version) for p in parts}) != 1:
            raise ValueError(
                "EvalResult.combine: results of different splits or policy versions: "
                f"{sorted({(p.split, p.policy_version) for p in parts})}"
            )
        totals = combine_snapshots([part.counts() for part in parts])
        return cls(
            split=parts[0].split,
            episodes=totals["episodes"],
            success_rate=totals["success_rate"],
            by_task_type=totals["by_task_type"],
            avg_steps=totals["avg_steps"],
            invalid_reply_rate=totals["invalid_reply_rate"],
            inadmissible_rate=totals["inadmissible_rate"],
            repeat_rate=totals["repeat_rate"],
            avg_reward=totals["avg_reward"],
            truncated_context=totals["truncated_context"],
            policy_version=parts[0].policy_version,
            wall_seconds=max(p.wall_seconds for p in parts),
        )

    def counts(self) -> dict:
        """The result as the `RolloutStats.snapshot()` counters it came from (what
        `combine_snapshots` adds up)."""
        steps = self.avg_steps * self.episodes
        return {
            "episodes": self.episodes,
            "won": self.success_rate * self.episodes,
            "env_steps": steps,
            "invalid_replies": self.invalid_reply_rate * steps,
            "inadmissible_commands": self.inadmissible_rate * steps,
            "repeated_observations": self.repeat_rate * steps,
            "avg_reward": self.avg_reward,
            "truncated_context": self.truncated_context,
            "by_task_type": self.by_task_type,
        }


def evaluate(
    policy: Sampler | Transformer,
    tokenizer: Tokenizer,
    *,
    split: str = "valid_unseen",
    num_games: int | None = None,
    num_envs: int = 32,
    rollout: RolloutConfig | None = None,
    env: EnvConfig | None = None,
    shard: tuple[int, int] = (0, 1),
    on_episode: Callable[[Episode], None] | None = None,
    temperature: float = 0.0,
    samples_per_game: int = 1,
) -> EvalResult:
    """Greedy success of `policy` on games 0..num_games-1 of `split` (all by default).

    policy: a `Sampler` (reuse one across evaluations: it keeps its compiled kernels; set its
      weights with `update_weights` first) or a `Transformer` (a fresh sampler is built).
    rollout: prompt / layout / reward settings; its own decoding settings and group size are
      ignored (greedy and one play a game, unless the two arguments below say otherwise).
    temperature, samples_per_game: > 0 evaluates the policy RL samples from instead of its
      argmax: each game is played `samples_per_game` times at `temperature` (no top-k / top-p),
      and the rates are over all those episodes (`episodes` = games x samples). The samples
      are seeded by `rollout.seed`, so the result is still a pure function of its inputs.
    env: which env (`EnvConfig.name`, default ALFWorld) and its settings (max_steps, ALFWorld's
      size and phrasing); its split and seed are ignored.
    shard: (index, count): play only games index, index + count, ... of those (each process
      of a multi-host job plays its own; `EvalResult.combine` merges the results).
    on_episode: called with each finished episode, in the order they finish (to keep or
      inspect the games themselves, e.g. `sao_jax.rollout.inspection.game_record`).
    """
    env = env or EnvConfig()
    splits = env.env_class.splits
    if split not in splits:
        raise ValueError(
            f"unknown split {split!r} of {env.name!r}; expected one of {sorted(splits)}"
        )
    total = splits[split]
    n = total if num_games is None else num_games
    if not isinstance(n, int) or not 1 <= n <= total:
        raise ValueError(f"num_games must be in [1, {total}] for {split!r}, got {num_games!r}")
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    games = range(index, n, count)
    check_sampling(temperature, samples_per_game)
    rollout = dataclasses.replace(
        rollout or RolloutConfig(),
        temperature=float(temperature),
        top_k=0,
        top_p=1.0,
        group_size=samples_per_game,
    )
    env = dataclasses.replace(env, split=split)
    if isinstance(policy, Transformer):
        policy = Sampler(policy, pad_id=tokenizer.pad_id)
    start = time.perf_counter()
    stats = RolloutStats(env.env_class.task_types)
    if games:  # a shard may be empty when there are more processes than games
        envs = env.make_envs(min(num_envs, len(games)))
        loop = AgentLoop(policy, tokenizer, envs, rollout, run_id=f"eval-{split}")
        for group in loop.play(games):
            stats.add_episodes(group)
            if on_episode is not None:
                for episode in group:
                    on_episode(episode)
    s = stats.snapshot()
    return EvalResult(
        split=split,
        episodes=s["episodes"],
        success_rate=s["success_rate"],
        by_task_type=s["by_task_type"],
        avg_steps=s["avg_steps"],
        invalid_reply_rate=s["invalid_reply_rate"],
        inadmissible_rate=s["inadmissible_rate"],
        repeat_rate=s["repeat_rate"],
        avg_reward=s["avg_reward"],
        truncated_context=s["truncated_context"],
        policy_version=policy.policy_version,
        wall_seconds=time.perf_counter() - start,
    )


def check_sampling(temperature: float, samples_per_game: int) -> None:
    """Raise a ValueError unless (temperature, samples_per_game) is greedy with one play a
    game, or a positive temperature with >= 1 plays a game."""
    if isinstance(samples_per_game, bool) or not isinstance(samples_per_game, int):
        raise ValueError(f"samples_per_game must be an int >= 1, got {samples_per_game!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if temperature < 0 or samples_per_game < 1:
        raise ValueError(
            f"temperature must be >= 0 and samples_per_game >= 1, got {temperature!r} and "
            f"{samples_per_game!r}"
        )
    if temperature == 0 and samples_per_game != 1:
        raise ValueError(
            f"samples_per_game={samples_per_game} at temperature 0: greedy play repeats itself "
            "(set a temperature > 0 to evaluate under sampling)"
        )
