"""A finished episode of any `TextEnv` and its ATDP record.

Each turn becomes two events: an `llm_call` (the lossless call: every input id, the sampled
ids, their temperature-1 log-probs and per-token policy versions, decoding parameters -- with
the log-probs under the decoding transform actually sampled, `extra["sampled_logprobs"]`, when
it is not the identity --, the prompt-template fingerprint) followed by the `env_step` it caused (the command, the resulting
observation, the rewards). The loader credits an event's rewards to the last output token of
the nearest LLM call at or before it, so the win reward and a malformed-reply penalty land on
the action token of the turn that earned them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    DecodingParams,
    Envelope,
    Event,
    EventKind,
    EventMetadata,
    Governance,
    LLMCall,
    Outcome,
    ReplayClass,
    Reward,
    Trajectory,
    TrajectoryHeader,
)
from sao_jax.envs.base import reward_sources

SOURCES = ("rollout", "expert_demo")


@dataclasses.dataclass(frozen=True, eq=False)
class Turn:
    """One model call and the environment step it caused.

    input_ids [P] int32: everything the model was given; output_ids [N] int32 (the stop token
    included); output_logprobs [N] float32 at temperature 1 (zeros for expert demos);
    output_versions [N] int32: the policy version that sampled each token;
    sampled_logprobs [N] float32: log-probs under the distribution actually sampled
    (temperature, top-k, top-p applied), None when that is the plain temperature-1 one.
    """

    input_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    output_versions: np.ndarray
    finish_reason: str  # "stop" | "length"
    reply: str  # decoded output, special tokens removed
    thought: str | None
    command: str  # what the env received ("" for a malformed reply)
    valid_reply: bool
    parse_error: str | None
    observation: str  # what the model saw this turn
    next_observation: str  # what the env answered
    admissible: bool  # the env accepted the command (ALFWorld: one of its admissible commands)
    won: bool
    env_reward: float  # win_reward on the winning step, else 0
    format_reward: float  # invalid_reply_penalty (malformed) / inadmissible_penalty, else 0
    seed: int
    started_at: float
    latency_s: float
    info: Mapping = dataclasses.field(default_factory=dict)  # the env's step info (not stored)
    sampled_logprobs: np.ndarray | None = None
    grammar: str | None = None  # the reply's output grammar (`RolloutConfig.reply_choices`)
    # an admitted command whose answer the episode had already seen (`RolloutConfig.repeat_penalty`)
    repeated_observation: bool = False
    novelty_reward: float = 0.0  # repeat_penalty on such a turn, else 0 (reward source "novelty")

    @property
    def reward(self) -> float:
        """The turn's whole reward, every source: what its ATDP step records and its loader row
        carries at the turn's last token."""
        return self.env_reward + self.format_reward + self.novelty_reward

    @property
    def policy_version(self) -> int:
        """Version of the weights that sampled the first token."""
        return int(self.output_versions[0]) if self.output_versions.size else 0


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
    """A finished episode on one task, with everything its ATDP record needs.

    env: the env's registry name; split, game_index: the task (its index in the split);
    game_id: the env's stable task id (`info["task_id"]`); task, task_type: the task text and
    its category ("" if none); env_spec: the env's own keys of `header.task`
    (`TextEnv.task_spec()`, e.g. ALFWorld's size and phrasing).
    """

    episode_id: str
    source: str  # "rollout" | "expert_demo"
    split: str
    game_index: int
    game_id: str
    task: str
    task_type: str
    max_steps: int
    layout: str
    group_id: int
    group_size: int
    member: int
    turns: tuple[Turn, ...]
    won: bool
    truncated_by: str | None  # None (won), "step_limit" or "context"
    model_id: str
    template_fingerprint: str
    decoding: DecodingParams
    worker_id: int
    started_at: float
    group_key: str = ""  # unique per group (`rollout_group_id`); "" = a group of its own
    env: str = "alfworld"
    env_spec: Mapping = dataclasses.field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.turns)

    @property
    def invalid_replies(self) -> int:
        return sum(not t.valid_reply for t in self.turns)

    @property
    def inadmissible_commands(self) -> int:
        """Well-formed replies whose command the room does not admit ("Nothing happens.")."""
        return sum(t.valid_reply and not t.admissible for t in self.turns)

    @property
    def repeated_observations(self) -> int:
        """Admitted commands whose answer the episode had already seen (`Turn.repeated_observation`)."""
        return sum(t.repeated_observation for t in self.turns)

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def generated_tokens(self) -> int:
        return sum(int(t.output_ids.shape[0]) for t in self.turns)

    @property
    def min_version(self) -> int:
        """Oldest policy version among the episode's sampled tokens (0 without turns)."""
        versions = [int(t.output_versions.min()) for t in self.turns if t.output_versions.size]
        return min(versions, default=0)

    def task_spec(self) -> dict:
        """How to rebuild this episode's environment (header.task; `env_from_task_spec`)."""
        return {
            "env": self.env,
            "split": self.split,
            "index": self.game_index,
            **self.env_spec,
            "max_steps": self.max_steps,
            "game_id": self.game_id,
            "task_type": self.task_type,
            "group_id": self.group_id,
            "group_size": self.group_size,
            "member": self.member,
            # what `LoaderConfig(group_by="task.group_key")` keeps in one batch
            "group_key": self.group_key or self.episode_id,
            "layout": self.layout,
            "source": self.source,
        }

    def to_trajectory(self, *, tenant: str, expires_at: float | None = None) -> Trajectory:
        """The ATDP trajectory of this episode (synthetic governance: training-eligible)."""
        header = TrajectoryHeader(
            trajectory_id=self.episode_id,
            governance=Governance.synthetic(tenant, expires_at=expires_at),
            created_at=self.started_at,
            session_id=self.episode_id,
            task=self.task_spec(),
            envelope=Envelope(
                harness_schema=self.template_fingerprint,
                policy_checkpoint=f"{self.model_id}@v{self.min_version}",
            ),
        )
        events: list[Event] = []
        for k, turn in enumerate(self.turns):
            events.append(self._llm_event(k, turn))
            events.append(self._env_event(turn))
        outcome = Outcome(
            success=self.won,
            terminated=self.truncated_by is None,
            info={
                "steps": self.steps,
                "truncated_by": self.truncated_by,
                "invalid_replies": self.invalid_replies,
                "total_reward": self.total_reward,
            },
        )
        return Trajectory(header, tuple(events), outcome)

    def _llm_event(self, k: int, turn: Turn) -> Event:
        demo = self.source == "expert_demo"
        decoding = dataclasses.replace(self.decoding, seed=turn.seed)
        if turn.sampled_logprobs is not None:  # the serving proxy's format: a list [N]
            extra = {**decoding.extra, "sampled_logprobs": turn.sampled_logprobs.tolist()}
            decoding = dataclasses.replace(decoding, extra=extra)
        if turn.grammar is not None:  # as the proxy records a constrained call's grammar
            decoding = dataclasses.replace(
                decoding, extra={**decoding.extra, "grammar": turn.grammar}
            )
        call = LLMCall(
            model_id=self.model_id,
            policy_version=turn.policy_version,
            input_ids=turn.input_ids,
            output_ids=turn.output_ids,
            output_logprobs=turn.output_logprobs,
            decoding=decoding,
            prompt_template_fingerprint=self.template_fingerprint,
            finish_reason=turn.finish_reason,
            output_versions=turn.output_versions,
        )
        return Event(
            kind=EventKind.LLM_CALL,
            # A demo's reply was written by the expert, not sampled: re-scoring it is still
            # well defined, re-sampling it is not.
            replay=ReplayClass.APPROXIMATE if demo else ReplayClass.DETERMINISTIC,
            observation=turn.observation,
            hidden=turn.thought,
            action=Action(ActionKind.COMMAND, text=turn.command),
            metadata=EventMetadata(
                timestamp=turn.started_at,
                latency_s=max(turn.latency_s, 0.0),
                prompt_tokens=int(turn.input_ids.shape[0]),
                completion_tokens=int(turn.output_ids.shape[0]),
                session_id=self.episode_id,
                interaction_id=f"{self.episode_id}/t{k}",
                harness_fingerprint=self.template_fingerprint,
                model_id=self.model_id,
            ),
            llm=call,
        )

    @staticmethod
    def _env_event(turn: Turn) -> Event:
        parts = reward_sources(turn.env_reward, turn.format_reward, turn.novelty_reward)
        rewards = [Reward(value, source) for value, source in parts]
        return Event(
            kind=EventKind.ENV_STEP,
            replay=ReplayClass.DETERMINISTIC,  # our engine is a pure function of game + commands
            observation=turn.next_observation,
            action=Action(ActionKind.COMMAND, text=turn.command),
            result={
                "won": turn.won,
                "admissible": turn.admissible,
                "invalid_reply": not turn.valid_reply,
                "parse_error": turn.parse_error,
                "repeated_observation": turn.repeated_observation,
            },
            rewards=tuple(rewards),
            error_class="" if turn.valid_reply else "invalid_reply",
        )
