"""Replay of recorded trajectories, each event by its replay class.

- Deterministic replay (`rescore`): the recorded tokens of every LLM call are scored again under
  another policy: same tokens, new log-probs. Gives per-token log-ratios for off-policy
  correction and a per-trajectory KL estimate for evaluation.
- Approximate replay (`replay_episode`): an environment is reset to the recorded task and fed the
  recorded actions; each step reports whether the observation and reward match the record.
  `rerun_episode` instead lets a new policy act from the same reset, answering "would it have
  succeeded under a different prompt or model".
- Non-replayable events (human messages, tool calls with side effects) are listed with the
  reason, never re-executed or faked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from atdp_io.rows import Row, pack_batch
from atdp_io.schema import EventKind, ReplayClass, ToolCall, Trajectory

# tokens [B, T] int32 -> logp [B, T] float32, logp[b, t] = log p(tokens[b, t] | tokens[b, :t]).
ScoreFn = Callable[[np.ndarray], np.ndarray]


class ReplayEnv(Protocol):
    """The environment interface approximate replay needs (the ALFWorld env satisfies it)."""

    def reset(self) -> tuple[str, dict]: ...

    def step(self, command: str) -> tuple[str, float, bool, dict]: ...


@dataclasses.dataclass(frozen=True, eq=False)
class CallRescore:
    """One re-scored LLM call; arrays `[N]` over its output tokens."""

    event_index: int
    recorded_logp: np.ndarray
    new_logp: np.ndarray
    loss_mask: np.ndarray

    @property
    def log_ratio(self) -> np.ndarray:
        """`new - recorded` on trainable tokens, 0 elsewhere."""
        return np.where(self.loss_mask > 0, self.new_logp - self.recorded_logp, 0.0)


@dataclasses.dataclass(frozen=True)
class Skipped:
    event_index: int
    kind: str
    reason: str


@dataclasses.dataclass(frozen=True, eq=False)
class RescoreReport:
    trajectory_id: str
    calls: tuple[CallRescore, ...]
    skipped: tuple[Skipped, ...]

    def summary(self) -> dict[str, float]:
        """Token-level means over trainable tokens: |log-ratio|, k3 KL(recorded || new), ratio."""
        ratios = [c.log_ratio[c.loss_mask > 0] for c in self.calls]
        log_ratio = np.concatenate(ratios) if ratios else np.zeros(0)
        if not log_ratio.size:
            return {"tokens": 0, "mean_abs_log_ratio": 0.0, "kl_k3": 0.0, "mean_ratio": 1.0}
        ratio = np.exp(log_ratio)
        return {
            "tokens": int(log_ratio.size),
            "mean_abs_log_ratio": float(np.abs(log_ratio).mean()),
            "kl_k3": float((ratio - 1.0 - log_ratio).mean()),
            "mean_ratio": float(ratio.mean()),
        }


def rescore(
    trajectories: Sequence[Trajectory],
    score_fn: ScoreFn,
    *,
    batch_rows: int = 8,
    seq_bucket: int = 128,
    pad_id: int = 0,
) -> list[RescoreReport]:
    """Scores every replayable LLM call of `trajectories` under `score_fn`.

    Calls are batched `batch_rows` at a time, each padded to a multiple of `seq_bucket` tokens
    so a jitted `score_fn` compiles once per bucket. A call classed non-replayable is skipped
    and reported.
    """
    jobs, skipped = [], {t.trajectory_id: [] for t in trajectories}
    for traj in trajectories:
        for index, event in traj.llm_events():
            if event.replay == ReplayClass.NON_REPLAYABLE:
                skipped[traj.trajectory_id].append(
                    Skipped(index, event.kind.value, "recorded as non-replayable")
                )
            else:
                jobs.append((traj.trajectory_id, index, event.llm))
    rescored: dict[str, list[CallRescore]] = {t.trajectory_id: [] for t in trajectories}
    for start in range(0, len(jobs), batch_rows):
        chunk = jobs[start : start + batch_rows]
        longest = max(llm.input_ids.shape[0] + llm.output_ids.shape[0] for _, _, llm in chunk)
        seq_len = -(-longest // seq_bucket) * seq_bucket
        rows = [[_context_row(llm)] for _, _, llm in chunk]
        tokens = pack_batch(rows, batch_rows, seq_len, pad_id)["tokens"]
        logp = np.asarray(score_fn(tokens), np.float32)
        if logp.shape != tokens.shape:
            raise ValueError(f"score_fn returned shape {logp.shape}, expected {tokens.shape}")
        for b, (trajectory_id, index, llm) in enumerate(chunk):
            n_in, n_out = llm.input_ids.shape[0], llm.output_ids.shape[0]
            rescored[trajectory_id].append(
                CallRescore(index, llm.output_logprobs, logp[b, n_in : n_in + n_out], llm.loss_mask)
            )
    return [
        RescoreReport(
            t.trajectory_id, tuple(rescored[t.trajectory_id]), tuple(skipped[t.trajectory_id])
        )
        for t in trajectories
    ]


def _context_row(llm) -> Row:
    """A row holding a call's input + output; only its tokens matter for scoring."""
    n = llm.input_ids.shape[0] + llm.output_ids.shape[0]
    zeros = np.zeros(n, np.float32)
    ints = np.zeros(n, np.int32)
    return Row(llm.context_ids, ints, zeros, zeros, ints, 0)


@dataclasses.dataclass(frozen=True)
class StepReplay:
    """One environment step or tool call re-executed from the record."""

    event_index: int
    action: str
    matched: bool
    recorded: Any
    replayed: Any
    recorded_reward: float = 0.0
    replayed_reward: float = 0.0


@dataclasses.dataclass(frozen=True)
class EpisodeReplay:
    trajectory_id: str
    steps: tuple[StepReplay, ...]
    skipped: tuple[Skipped, ...]

    @property
    def first_divergence(self) -> int | None:
        """Event index of the first step whose observation or reward differs, else None."""
        return next((s.event_index for s in self.steps if not s.matched), None)

    @property
    def recorded_return(self) -> float:
        return float(sum(s.recorded_reward for s in self.steps))

    @property
    def replayed_return(self) -> float:
        return float(sum(s.replayed_reward for s in self.steps))


def replay_episode(
    trajectory: Trajectory,
    make_env: Callable[[Mapping[str, Any]], ReplayEnv],
    *,
    tool_runner: Callable[[ToolCall], Any] | None = None,
) -> EpisodeReplay:
    """Re-executes the recorded environment steps (and tool calls, given a `tool_runner`).

    `make_env(trajectory.header.task)` builds an environment for the recorded task. Steps are
    compared with the record on observation and reward; replay continues past a divergence so
    the report shows how far the episode drifted.
    """
    env = make_env(trajectory.header.task)
    env.reset()
    steps, skipped = [], []
    for index, event in enumerate(trajectory.events):
        if event.kind == EventKind.LLM_CALL:
            continue  # re-scored by `rescore`, not re-executed
        if event.replay == ReplayClass.NON_REPLAYABLE:
            skipped.append(Skipped(index, event.kind.value, "recorded as non-replayable"))
            continue
        recorded_reward = float(sum(r.value for r in event.rewards))
        if event.kind == EventKind.ENV_STEP:
            command = event.action.text if event.action else ""
            observation, reward, _, _ = env.step(command)
            matched = observation == event.observation and np.isclose(reward, recorded_reward)
            steps.append(
                StepReplay(
                    index,
                    command,
                    bool(matched),
                    event.observation,
                    observation,
                    recorded_reward,
                    float(reward),
                )
            )
        elif event.kind == EventKind.TOOL_CALL and tool_runner is not None:
            for call in event.action.tool_calls:
                result = tool_runner(call)
                steps.append(
                    StepReplay(index, call.name, result == event.result, event.result, result)
                )
        else:
            reason = (
                "no tool runner given" if event.kind == EventKind.TOOL_CALL else "not an action"
            )
            skipped.append(Skipped(index, event.kind.value, reason))
    return EpisodeReplay(trajectory.trajectory_id, tuple(steps), tuple(skipped))


@dataclasses.dataclass(frozen=True)
class Rerun:
    """A new policy's episode from the recorded task's reset."""

    trajectory_id: str
    commands: tuple[str, ...]
    observations: tuple[str, ...]
    total_reward: float
    done: bool


def rerun_episode(
    trajectory: Trajectory,
    make_env: Callable[[Mapping[str, Any]], ReplayEnv],
    policy: Callable[[Sequence[str]], str],
    *,
    max_steps: int = 50,
) -> Rerun:
    """Runs `policy` (observation history -> command) from the recorded task's reset."""
    env = make_env(trajectory.header.task)
    observation, _ = env.reset()
    observations, commands, total, done = [observation], [], 0.0, False
    for _ in range(max_steps):
        command = policy(tuple(observations))
        observation, reward, done, _ = env.step(command)
        commands.append(command)
        observations.append(observation)
        total += float(reward)
        if done:
            break
    return Rerun(trajectory.trajectory_id, tuple(commands), tuple(observations), total, done)
