"""Multi-turn episodes of any `TextEnv` on a batch of envs, one KV-cache slot per env.

The loop speaks to the envs only through the protocol of `sao_jax.envs.base`: `reset` /
`step` / `rewards` on the env, prompts and reply parsing from its class's `harness`.

Continuous batching ("slot refill"): whenever a slot's reply is complete, its env steps at
once and the slot is refilled with the next turn's prompt (or a new game) at the next
dispatch, while the other slots keep decoding. Nothing waits for the slowest reply of the
batch. `refill="lockstep"` instead prefills only once every slot has finished its reply
(classic batched turns), for comparison.

In the concat layout a slot keeps its KV cache across turns: the next turn encodes only the
ids appended since the last reply (`Sampler.extend`), unless the cache was built (even in
part) by older weights, in which case the whole input is encoded again.

Prefix caching (`RolloutConfig.prefix_cache`): any other prompt loaded into a slot (every
windowed turn, a new episode) skips the leading ids it shares with the prompt the slot's
cache holds from its last load, when the same weights encoded that one
(`Sampler.prefill(cached=...)`). A windowed turn starts with the same chat marker and task
line as the slot's previous turn, so those are encoded once per episode instead of per turn.

Weights may change between dispatches (`before_dispatch`, where the async engine syncs): each
sampled token records the version that produced it, so a reply interrupted by a weight update
carries both versions (AReaL's interruptible generation, keeping the reply's cache).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

from atdp_io import DecodingParams
from atdp_io.grammar_masks import TokenConstraint
from sao_jax.envs.base import (
    INFO_KEYS,
    STEP_INFO_KEYS,
    RewardWeights,
    TextEnv,
    check_info,
    check_prompt_style,
    repeated_turn,
    turn_rewards,
)
from sao_jax.envs.registry import EnvConfig
from sao_jax.rollout.choices import ChoiceMasks
from sao_jax.rollout.episode import Episode, Turn
from sao_jax.rollout.prompts import LAYOUTS, PromptBuilder
from sao_jax.rollout.run_ids import (
    MAX_GROUPS,
    check_run_id,
    new_run_id,
    rollout_episode_id,
    rollout_group_id,
)
from sao_jax.rollout.sampler import Sampler
from sao_jax.rollout.sampling import SamplingParams
from sao_jax.tokenizers import Tokenizer

REFILL_MODES = ("continuous", "lockstep")


__all__ = ["REFILL_MODES", "AgentLoop", "EnvConfig", "RolloutConfig"]


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are prompted, sampled and rewarded.

    layout: "windowed" (each turn a fresh prompt with the last `history_length` steps) or
      "concat" (one growing token stream per episode).
    think: ask for `<think>` reasoning before `<action>` (off for small models).
    memory_line: (windowed) add the env harness's line of what the episode saw beyond the
      window, if it has one (ALFWorld: the receptacles looked into so far with the task's
      objects seen in them, from the episode's texts; off: the papers' prompt; see
      benchmarks/alfworld_experts.py for what it changes).
    prompt_style: "paper" (ALFWorld: the verl-agent / GiGPO / SEED wording) or "compact" (the
      same facts in fewer tokens, for a model trained from scratch).
    win_reward, invalid_reply_penalty: multiplies the env's reward (1 on the winning step);
      added on a malformed reply. The env's reward hook (`TextEnv.rewards`) applies them.
    inadmissible_penalty: added when the env refuses a well-formed reply's command (ALFWorld:
      not one of the admissible commands the prompt lists, "Nothing happens."); 0 keeps the
      papers' reward (win and malformed reply only), a small negative value penalises a
      policy that loops on one.
    repeat_penalty: added when a well-formed command the env admits answers with an observation
      the episode has already seen (its opening text or an earlier step's answer, compared as
      text): an episodic novelty penalty on steps that bring nothing new -- ALFWorld: going
      back to a receptacle whose contents have not changed, `look` / `examine` again. The turn
      records `repeated_observation` whatever the setting (`rollout/repeat_rate`); 0 (the
      default) leaves the reward alone.
    max_new_tokens: reply length cap (the stop token counts).
    max_context_tokens: KV-cache positions per slot: a turn's input + `max_new_tokens` must
      fit (the cap of a whole concat episode), so every loader row fits a `seq_len` of this
      size; at most the model's `max_seq_len`.
    temperature, top_k, top_p: decoding (temperature 0 is greedy). Every turn records the
      policy's temperature-1 log-probs; when these are not the identity (1, 0, 1), also the
      log-probs under the distribution actually sampled (greedy: 0 for the argmax), as
      `decoding.extra["sampled_logprobs"]` like the serving proxy, so the learner's DIS ratio
      compares like with like.
    group_size: G plays of each game, started together and written together (GRPO groups).
    decode_chunk: decode steps per dispatch (more: less Python overhead; fewer: finished slots
      refill sooner).
    refill: "continuous" (refill finished slots at once) or "lockstep".
    seed: base of every call's sampling seed.
    model_id: recorded with every LLM call.
    prefix_cache: a prompt loaded into a slot skips the ids it shares with the prompt the
      slot's cache already holds (encoded by the same weights); False: every load encodes its
      whole prompt. Tokens and log-probs are the same either way.
    reply_choices: keep every reply to one of the actions the prompt lists (ALFWorld: its
      admissible commands), in the harness's reply format: a token mask before each sampled
      token, from a grammar of each action's token ids (`sao_jax.rollout.choices`). The grammar is recorded with the call, so the learner
      rebuilds the masks and trains with the masked ratio; the masked behaviour log-probs
      are recorded as `sampled_logprobs`. Decodes one token per dispatch (each token's mask
      depends on the one before). Off: free replies, as the papers sample them.
    """

    layout: str = "windowed"
    history_length: int = 2
    think: bool = False
    memory_line: bool = False
    prompt_style: str = "paper"
    win_reward: float = 10.0
    invalid_reply_penalty: float = -0.1
    inadmissible_penalty: float = 0.0
    repeat_penalty: float = 0.0
    max_new_tokens: int = 32
    max_context_tokens: int = 1024
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    group_size: int = 1
    decode_chunk: int = 4
    refill: str = "continuous"
    seed: int = 0
    model_id: str = "sao_jax-policy"
    prefix_cache: bool = True
    reply_choices: bool = False

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"RolloutConfig.layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.refill not in REFILL_MODES:
            raise ValueError(
                f"RolloutConfig.refill must be one of {REFILL_MODES}, got {self.refill!r}"
            )
        for name in ("max_new_tokens", "max_context_tokens", "group_size", "decode_chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RolloutConfig.{name} must be a positive int, got {value!r}")
        if self.history_length < 0:
            raise ValueError(
                f"RolloutConfig.history_length must be >= 0, got {self.history_length}"
            )
        check_prompt_style(self.prompt_style)
        if self.memory_line and self.layout != "windowed":
            raise ValueError("RolloutConfig.memory_line needs layout='windowed'")
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"RolloutConfig.max_new_tokens ({self.max_new_tokens}) must be below "
                f"max_context_tokens ({self.max_context_tokens})"
            )
        # Validates temperature / top_k / top_p with the sampler's own messages.
        SamplingParams(self.temperature, self.top_k, self.top_p, self.max_new_tokens)

    @property
    def reward_weights(self) -> RewardWeights:
        """The reward settings the env's reward hook (`TextEnv.rewards`) reads."""
        return RewardWeights(self.win_reward, self.invalid_reply_penalty, self.inadmissible_penalty)

    def sampling(
        self, stop_ids: Sequence[int], seed: int, temperature: float | None = None
    ) -> SamplingParams:
        """One call's sampling parameters (`temperature`: instead of this config's)."""
        return SamplingParams(
            temperature=self.temperature if temperature is None else temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(stop_ids),
            seed=seed,
        )


@dataclasses.dataclass
class _Slot:
    """The episode in progress in one slot and its current turn."""

    env: TextEnv
    episode_id: str
    game_index: int
    group_id: int
    member: int
    observation: str
    info: dict
    input_ids: list[int]
    started_at: float
    history: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    out_ids: list[int] = dataclasses.field(default_factory=list)
    out_logp: list[float] = dataclasses.field(default_factory=list)
    out_versions: list[int] = dataclasses.field(default_factory=list)
    out_behaviour: list[float] = dataclasses.field(default_factory=list)  # transformed logps
    seed: int = 0
    turn_started: float = 0.0
    continuation: list[int] | None = None  # concat: ids appended since the last turn
    cache_version: int | None = None  # the weights version that built the slot's whole cache
    grammar: str | None = None  # reply_choices: this turn's grammar (recorded with the call)
    constraint: TokenConstraint | None = None  # ... and its state after the tokens so far
    temperature: float = 1.0  # the episode's decoding temperature (fixed when it starts)
    behaviour: bool = False  # record the transformed log-probs (the transform is not identity)


# What the loop and the engine use of an env's task stream (`TaskSampler`): draws, outcomes
# for the failed-task replay, its count, and its state for a checkpoint
TASK_STREAM_API = (
    "next_index",
    "record",
    "replays_served",
    "replay_state",
    "checked_replay_state",
    "restore_replay_state",
)


class AgentLoop:
    """Plays episodes with one `Sampler` over `envs` (one KV-cache slot each).

    Args:
      sampler: the policy's sampler (its weights and version are read at every dispatch).
      tokenizer: the policy's tokenizer (ChatML markers required).
      envs: `TextEnv`s of one class (e.g. `EnvConfig.make_envs`), or a batched env whose
        `envs` are (a `BatchedAlfworldEnv`: they are used directly).
      config: `RolloutConfig`.
      worker_id, run_id: make episode ids unique across workers and runs (run_id None: a
        random one). A run_id the ATDP writer would redact is a `ValueError` here.
    """

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: Tokenizer,
        envs: Sequence[TextEnv],
        config: RolloutConfig = RolloutConfig(),
        *,
        worker_id: int = 0,
        run_id: str | None = None,
    ):
        envs = list(getattr(envs, "envs", envs))
        if not envs or not all(isinstance(e, TextEnv) for e in envs):
            raise ValueError("AgentLoop needs a non-empty list of TextEnv (or a batched env)")
        if len({type(e) for e in envs}) > 1:
            raise ValueError(
                f"AgentLoop needs envs of one class, got {sorted({type(e).__name__ for e in envs})}"
            )
        stream = getattr(envs[0], "sampler", None)
        missing = [name for name in TASK_STREAM_API if not hasattr(stream, name)]
        if missing:
            raise TypeError(
                f"{type(envs[0]).__name__}.sampler is {type(stream).__name__}, which lacks "
                f"{missing}: an env's task stream must be a sao_jax.envs.TaskSampler (its "
                f"`from_config(config, sampler)` is handed one)"
            )
        model = sampler.config
        if config.max_context_tokens > model.max_seq_len:
            raise ValueError(
                f"RolloutConfig.max_context_tokens ({config.max_context_tokens}) exceeds the "
                f"model's max_seq_len ({model.max_seq_len})"
            )
        if tokenizer.vocab_size > model.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                f"{model.vocab_size}"
            )
        self.sampler, self.tokenizer, self.envs, self.config = sampler, tokenizer, envs, config
        self.worker_id = worker_id
        if run_id is None:
            run_id = new_run_id()
        else:
            shortest = rollout_episode_id(run_id, worker_id, 0, 0)
            longest = rollout_episode_id(run_id, worker_id, MAX_GROUPS, config.group_size - 1)
            check_run_id(run_id, (shortest, longest), owner="AgentLoop")
        self.run_id = run_id
        self.harness = type(envs[0]).harness
        self.prompts = PromptBuilder.for_rollout(tokenizer, config, self.harness)
        self.stop_ids = tuple(tokenizer.stop_ids)
        stop_names = tuple(tokenizer.decode([i]) for i in self.stop_ids)
        self.decoding = DecodingParams(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_tokens=config.max_new_tokens,
            stop=stop_names,
            # a constrained call's masks are rebuilt with the ids that may end it (as served)
            extra={"stop_token_ids": list(self.stop_ids)} if config.reply_choices else {},
        )
        self.choices = (
            ChoiceMasks(
                tokenizer,
                model.vocab_size,
                self.harness,
                style=config.prompt_style,
                think=config.think,
            )
            if config.reply_choices
            else None
        )
        self.temperature = config.temperature  # of the episodes that start next
        self._reset_state()
        self._groups = itertools.count()
        self.abandoned_episodes = 0  # started but never finished (play stopped early)

    @property
    def behaviour(self) -> bool:
        """Whether episodes started now record behaviour log-probs under the sampled transform."""
        return self._records_behaviour(self.temperature)

    def _records_behaviour(self, temperature: float) -> bool:
        # Only when the transform is not the identity (there they equal the temperature-1
        # ones, and records stay as they were); a token mask changes the distribution too.
        config = self.config
        transformed = (temperature, config.top_k, config.top_p) != (1.0, 0, 1.0)
        return transformed or self.choices is not None

    def set_temperature(self, temperature: float) -> None:
        """Decode the episodes that start from now on at `temperature` (> 0: an episode keeps
        the temperature it started with, and records it with its calls, so the learner's ratio
        is taken against the distribution each token was sampled from). Safe to call while
        another thread plays."""
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
        if not temperature > 0:
            raise ValueError(
                f"temperature must be > 0 to change it during play (greedy episodes carry no "
                f"behaviour distribution to train on), got {temperature!r}"
            )
        self.temperature = float(temperature)

    # ------------------------------------------------------------------------------ play
    def play(
        self,
        games: Iterable[int] | None = None,
        *,
        max_episodes: int | None = None,
        admit: Callable[[int, bool], bool] | None = None,
        before_dispatch: Callable[[], None] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[list[Episode]]:
        """Play until `games` runs out, `max_episodes` have started, or `stop()`; yield each
        finished group (its G episodes in member order).

        games: task indices of the envs' split (each played `group_size` times); default the
          envs' own endless task stream (their shared `TaskSampler`, which is told each
          finished episode's outcome: `TaskSampler.record`, for its failed-task replay).
        admit(n, block): asked before starting a group of n episodes; `block` is True when no
          slot is busy (wait for room, or return False to end the play).
        before_dispatch(): called before every prefill / decode (the weight-sync point).
        stop(): checked every dispatch; in-progress episodes are then abandoned.
        """
        config, group_size = self.config, self.config.group_size
        shared = None
        if games is None:
            shared = self.envs[0].sampler
            games = (shared.next_index() for _ in itertools.count())
        games = iter(games)
        slots: list[_Slot | None] = [None] * len(self.envs)
        waiting: deque[tuple[int, int, int]] = deque()  # (game index, group id, member)
        groups: dict[int, list[Episode | None]] = {}
        ready: list[int] = []  # slots holding a prompt not yet prefilled
        generating: set[int] = set()
        started, yielded, exhausted = 0, 0, False
        if np.asarray(self._state.active).any():  # a previous play was stopped mid-reply
            self._reset_state()

        def admit_group(block: bool) -> bool:
            nonlocal started, exhausted
            if exhausted or (max_episodes is not None and started + group_size > max_episodes):
                exhausted = True
                return False
            if admit is not None and not admit(group_size, block):
                return False
            index = next(games, None)
            if index is None:
                exhausted = True
                return False
            group = next(self._groups)
            groups[group] = [None] * group_size
            waiting.extend((index, group, m) for m in range(group_size))
            started += group_size
            return True

        try:
            while not (stop is not None and stop()):
                for b in range(len(slots)):
                    if slots[b] is not None:
                        continue
                    if not waiting and not admit_group(block=False):
                        break
                    slots[b] = self._start(b, *waiting.popleft())
                    ready.append(b)
                if not ready and not generating:
                    if waiting or admit_group(block=True):
                        continue
                    break
                finished: list[int] = []
                if ready and (config.refill == "continuous" or not generating):
                    finished += self._prefill(slots, ready, generating, before_dispatch)
                    ready = []
                if generating:
                    finished += self._decode(slots, generating, before_dispatch)
                done_groups = []
                for b in finished:
                    episode = self._end_turn(slots[b])
                    if episode is None:
                        ready.append(b)
                        continue
                    slots[b] = None
                    members = groups[episode.group_id]
                    members[episode.member] = episode
                    if all(e is not None for e in members):
                        done_groups.append(groups.pop(episode.group_id))
                for group in done_groups:
                    yielded += len(group)
                    if shared is not None:  # outcomes steer the stream's failed-task replay
                        for episode in group:
                            shared.record(episode.game_index, episode.won)
                    yield group
        finally:
            self.abandoned_episodes += started - yielded

    # ------------------------------------------------------------------------- internals
    def _reset_state(self) -> None:
        self._state = self.sampler.init_state(len(self.envs), self.config.max_context_tokens)
        # Per slot: (ids the cache holds at positions 0.., the weights generation that
        # encoded them), or None. Only a load writes positions below its prompt's end.
        self._cached: list[tuple[list[int], int] | None] = [None] * len(self.envs)

    def _cached_prefix(self, b: int, ids: Sequence[int]) -> int:
        """Leading ids of `ids` slot b's cache holds from the current weights (< len(ids))."""
        record = self._cached[b]
        if not self.config.prefix_cache or record is None:
            return 0
        held, generation = record
        if generation != self.sampler.weights_generation:
            return 0
        limit = min(len(held), len(ids) - 1)
        same = 0
        while same < limit and held[same] == ids[same]:
            same += 1
        return same

    def _start(self, b: int, index: int, group: int, member: int) -> _Slot:
        env, temperature = self.envs[b], self.temperature  # read once: set_temperature may run
        observation, info = env.reset(index)
        check_info(info, INFO_KEYS, f"{type(env).__name__}.reset")
        ids = self.prompts.first(info["task"], observation, info["admissible_commands"])
        if len(ids) + self.config.max_new_tokens > self.config.max_context_tokens:
            raise ValueError(
                f"game {index}: the first prompt has {len(ids)} tokens; with max_new_tokens="
                f"{self.config.max_new_tokens} it does not fit max_context_tokens="
                f"{self.config.max_context_tokens}"
            )
        return _Slot(
            env=env,
            episode_id=rollout_episode_id(self.run_id, self.worker_id, group, member),
            game_index=index,
            group_id=group,
            member=member,
            observation=observation,
            info=info,
            input_ids=ids,
            started_at=time.time(),
            temperature=temperature,
            behaviour=self._records_behaviour(temperature),
        )

    def _call_seed(self, slot: _Slot) -> int:
        # From the schedule-independent position of the call, not the run id: the same
        # config seed replays the same episodes, whatever the slot and batch composition.
        key = f"{self.config.seed}/{self.worker_id}/{slot.group_id}/{slot.member}/{len(slot.turns)}"
        return zlib.crc32(key.encode())

    def _prefill(self, slots, ready, generating, before_dispatch) -> list[int]:
        """Start the turn of every ready slot: a concat turn whose slot cache is intact
        appends only its new tokens (`Sampler.extend`); anything else encodes its whole input."""
        if before_dispatch is not None:
            before_dispatch()
        version = self.sampler.policy_version
        extend, full = [], []
        for b in ready:
            slot = slots[b]
            # The cached prefix must come from the current weights, or the turn's log-probs
            # would mix versions (a full prefill re-encodes it under the new ones).
            reusable = slot.continuation is not None and slot.cache_version == version
            (extend if reusable else full).append(b)
            slot.seed, slot.turn_started = self._call_seed(slot), time.time()
            slot.out_ids, slot.out_logp, slot.out_versions = [], [], []
            slot.out_behaviour = []
            slot.cache_version = version
            if self.choices is not None:
                slot.grammar = self.choices.grammar(slot.info["admissible_commands"])
                slot.constraint = self.choices.start(slot.grammar)
        finished = []
        for group, extending in ((full, False), (extend, True)):
            if not group:
                continue
            sampling = [
                self.config.sampling(self.stop_ids, slots[b].seed, slots[b].temperature)
                for b in group
            ]
            behaviour = any(slots[b].behaviour for b in group)
            generation = self.sampler.weights_generation
            masks = None
            if self.choices is not None:
                masks = np.stack([slots[b].constraint.bitmask() for b in group])
            if extending:
                tokens = [slots[b].continuation for b in group]
                self._state, first, logp, done, *sampled = self.sampler.extend(
                    self._state,
                    tokens,
                    group,
                    sampling,
                    token_mask=masks,
                    behaviour=behaviour,
                )
            else:
                tokens = [slots[b].input_ids for b in group]
                cached = [self._cached_prefix(b, slots[b].input_ids) for b in group]
                self._state, first, logp, done, *sampled = self.sampler.prefill(
                    self._state,
                    tokens,
                    group,
                    sampling,
                    cached=cached,
                    token_mask=masks,
                    behaviour=behaviour,
                )
            # weights swapped during the load (another thread): nothing it wrote is reusable
            same_weights = generation == self.sampler.weights_generation
            for i, b in enumerate(group):
                slot = slots[b]
                # An extended slot's cache holds its whole input too, from these weights only
                # if its last load was (the generation only grows: nothing changed since).
                held = self._cached[b]
                intact = same_weights and (
                    not extending or (held is not None and held[1] == generation)
                )
                self._cached[b] = (list(slot.input_ids), generation) if intact else None
                slot.out_ids.append(int(first[i]))
                slot.out_logp.append(float(logp[i]))
                slot.out_versions.append(version)
                if slot.behaviour:
                    slot.out_behaviour.append(float(sampled[0][i]))
                if slot.constraint is not None:
                    slot.constraint.consume(first[i])
                if done[i]:
                    finished.append(b)
                else:
                    generating.add(b)
        return finished

    def _decode(self, slots, generating, before_dispatch) -> list[int]:
        if before_dispatch is not None:
            before_dispatch()
        version = self.sampler.policy_version
        steps, masks = self.config.decode_chunk, None
        if self.choices is not None:  # each token's mask follows from the one before
            steps, masks = 1, self.choices.unconstrained(len(slots))
            for b in generating:
                masks[b] = slots[b].constraint.bitmask()
        behaviour = any(slots[b].behaviour for b in generating)
        self._state, tokens, logp, emitted, *sampled = self.sampler.decode(
            self._state, steps, token_mask=masks, behaviour=behaviour
        )
        active = np.asarray(self._state.active)
        finished = []
        for b in sorted(generating):
            slot, n = slots[b], int(emitted[b].sum())
            slot.out_ids += tokens[b, :n].tolist()
            slot.out_logp += logp[b, :n].tolist()
            slot.out_versions += [version] * n
            if slot.behaviour:
                slot.out_behaviour += sampled[0][b, :n].tolist()
            if slot.constraint is not None and n:
                slot.constraint.consume(tokens[b, 0])
            if n and version != slot.cache_version:
                slot.cache_version = None  # the cache now mixes weight versions
            if not active[b]:
                finished.append(b)
        generating.difference_update(finished)
        return finished

    def _end_turn(self, slot: _Slot) -> Episode | None:
        """Step the env with the finished reply; the finished Episode, or None to continue."""
        config = self.config
        out_ids = np.asarray(slot.out_ids, np.int32)
        reply = self.tokenizer.decode(out_ids, skip_special_tokens=True)
        parsed = self.harness.parse_reply(reply, think=config.think)
        command = parsed.action if parsed.valid else ""
        observation, won_reward, done, info = slot.env.step(command)
        check_info(info, STEP_INFO_KEYS, f"{type(slot.env).__name__}.step")
        admissible = bool(info["admissible"])
        env_reward, format_reward = slot.env.rewards(
            won_reward,
            valid_reply=parsed.valid,
            admissible=admissible,
            weights=config.reward_weights,
        )
        repeated = repeated_turn(
            observation,
            slot.observation,
            slot.history,
            valid_reply=parsed.valid,
            admissible=admissible,
        )
        slot.turns.append(
            Turn(
                input_ids=np.asarray(slot.input_ids, np.int32),
                output_ids=out_ids,
                output_logprobs=np.asarray(slot.out_logp, np.float32),
                output_versions=np.asarray(slot.out_versions, np.int32),
                finish_reason="stop" if out_ids[-1] in self.stop_ids else "length",
                reply=reply,
                thought=parsed.thought,
                command=command,
                valid_reply=parsed.valid,
                parse_error=parsed.error,
                observation=slot.observation,
                next_observation=observation,
                admissible=admissible,
                won=bool(info["won"]),
                env_reward=env_reward,
                format_reward=format_reward,
                repeated_observation=repeated,
                novelty_reward=config.repeat_penalty if repeated else 0.0,
                seed=slot.seed,
                started_at=slot.turn_started,
                latency_s=time.time() - slot.turn_started,
                info=info,
                sampled_logprobs=(
                    np.asarray(slot.out_behaviour, np.float32) if slot.behaviour else None
                ),
                grammar=slot.grammar,
            )
        )
        slot.history.append((slot.observation, command))
        if done:
            return self._episode(slot, None if info["won"] else "step_limit")
        next_ids = self.prompts.next(
            previous_input=slot.input_ids,
            previous_output=slot.out_ids,
            task=info["task"],
            observation=observation,
            admissible=info["admissible_commands"],
            history=slot.history,
        )
        if len(next_ids) + config.max_new_tokens > config.max_context_tokens:
            return self._episode(slot, "context")
        if config.layout == "concat":
            slot.continuation = next_ids[len(slot.input_ids) + len(slot.out_ids) :]
        slot.input_ids, slot.observation, slot.info = next_ids, observation, info
        return None

    def _episode(self, slot: _Slot, truncated_by: str | None) -> Episode:
        env, info = slot.env, slot.info
        return Episode(
            episode_id=slot.episode_id,
            source="rollout",
            env=env.name,
            split=env.split,
            game_index=slot.game_index,
            game_id=str(info["task_id"]),
            task=info["task"],
            task_type=info["task_type"],
            env_spec=env.task_spec(),
            max_steps=env.max_steps,
            layout=self.config.layout,
            group_id=slot.group_id,
            group_size=self.config.group_size,
            member=slot.member,
            turns=tuple(slot.turns),
            won=truncated_by is None,
            truncated_by=truncated_by,
            model_id=self.config.model_id,
            template_fingerprint=self.prompts.fingerprint,
            decoding=dataclasses.replace(self.decoding, temperature=slot.temperature),
            worker_id=self.worker_id,
            started_at=slot.started_at,
            group_key=rollout_group_id(self.run_id, self.worker_id, slot.group_id),
        )


def _reply_penalty(config: RolloutConfig, valid: bool, admissible: bool) -> float:
    """The turn's reply-shape reward of the default reward hook: malformed reply, else an
    inadmissible command, else 0."""
    weights = config.reward_weights
    return turn_rewards(0.0, valid_reply=valid, admissible=admissible, weights=weights)[1]
