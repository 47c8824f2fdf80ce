"""The text-environment protocol every environment the rollout plays implements.

An environment is two parts:

- a `TextEnv` subclass: the game. `reset(index)` starts task `index` of its split and returns
  the first observation; `step(action)` applies one action (plain text) and returns
  `(observation, reward, done, info)`; `expert_action()` is a scripted teacher (behaviour
  cloning, DAgger); class attributes name its splits, experts and task types.
- a `PromptHarness`: the text around it, with no state. It renders a turn's prompt (windowed
  and turn 0) or the follow-up user turn of a concat episode, parses a model reply into an
  action (`ParsedReply`), writes the reply an expert would give, and reads decoded prompts
  back (SEED's records of learner batches).

`AgentLoop`, `evaluate`, `collect_expert_demos` and SEED's records use only these two classes,
so any registered env (`sao_jax.envs.registry`) plays through the same rollout and learner.

Info dicts (returned by `reset` and `step`) must carry at least `INFO_KEYS`:
  task: the task text shown in every prompt; task_id: a stable id of the task (ALFWorld's
  game id); task_type: the task's category, for per-type success ("" if the env has none);
  admissible_commands: the actions the prompt lists now, or None (the env lists none);
  won: whether the episode is won.
`step` adds `admissible`: whether the action was one the env accepts (an env without such a
notion says True for every well-formed action).
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sao_jax.envs.rng import StableRng

INFO_KEYS = ("task", "task_id", "task_type", "admissible_commands", "won")
STEP_INFO_KEYS = (*INFO_KEYS, "admissible")
PROMPT_STYLES = ("paper", "compact")

_ACTION_BLOCK = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)


def check_prompt_style(style: str) -> None:
    """A ValueError naming the known styles for any other."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")


def check_info(info: Mapping, keys: Sequence[str], where: str) -> Mapping:
    """`info` if it holds every key of `keys`, else a ValueError naming the missing ones."""
    missing = [k for k in keys if k not in info]
    if missing:
        raise ValueError(
            f"{where} info lacks {missing}; a TextEnv's info must hold {list(keys)} "
            "(see sao_jax.envs.base)"
        )
    return info


# -- replies --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """A parsed model reply. `action` is normalised (lower case, single spaces); `valid` False
    means the reply is malformed and `error` says why."""

    action: str | None
    valid: bool
    error: str | None = None
    thought: str | None = None


def parse_reply(reply: str, *, think: bool = True) -> ParsedReply:
    """Extract the action from `...<think>...</think>...<action>...</action>`.

    Malformed (valid=False, with an error naming the problem): no or several `<action>`
    blocks, an empty action, and with `think`, a missing, repeated or misplaced `<think>`.
    """
    actions = _ACTION_BLOCK.findall(reply)
    if not actions:
        return ParsedReply(None, False, "no <action>...</action> block")
    if len(actions) > 1:
        return ParsedReply(None, False, f"{len(actions)} <action> blocks; expected exactly one")
    action = " ".join(actions[0].split()).strip("'\"`").strip().lower()
    if not action:
        return ParsedReply(None, False, "empty <action> block")
    thought = None
    if think:
        thoughts = list(_THINK_BLOCK.finditer(reply))
        if len(thoughts) != 1:
            return ParsedReply(
                action, False, f"{len(thoughts)} <think> blocks; expected exactly one"
            )
        if thoughts[0].start() > _ACTION_BLOCK.search(reply).start():
            return ParsedReply(action, False, "<think> must come before <action>")
        thought = thoughts[0].group(1).strip()
    return ParsedReply(action, True, None, thought)


def tagged_reply(action: str, *, think: bool) -> str:
    """The reply `parse_reply` reads as `action` (an empty `<think></think>` first with think)."""
    return f"{'<think></think>' if think else ''}<action>{action}</action>"


# -- prompts --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PromptOptions:
    """What shapes a prompt besides the episode (from `RolloutConfig`).

    history_length: h, past (observation, action) pairs a windowed prompt shows.
    think: ask for `<think>` reasoning before the action.
    memory_line: (windowed) a line of what the episode saw beyond the window, if the harness
      has one (`PromptHarness.memory_line`).
    style: "paper" or "compact" (`PROMPT_STYLES`; what each means is the harness's choice).
    """

    history_length: int = 2
    think: bool = False
    memory_line: bool = False
    style: str = "paper"

    def __post_init__(self):
        check_prompt_style(self.style)
        if self.history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {self.history_length}")


class PromptHarness(abc.ABC):
    """How an env's turns are written for the model and its replies read back (no state).

    Subclasses implement `prompt`, `followup` and `fingerprint_parts`; replies default to the
    `<think>` / `<action>` tags (`parse_reply`, `tagged_reply`); override `read_prompt` and
    `task_type_of` for SEED's records of learner batches.

    name: the env's name; prompt-template fingerprints read "<name>-<hash>".
    memory_line: whether `PromptOptions.memory_line` is supported.
    """

    name: ClassVar[str] = ""
    memory_line: ClassVar[bool] = False

    def check_options(self, options: PromptOptions) -> None:
        """A ValueError for options this harness cannot render."""
        if options.memory_line and not self.memory_line:
            raise ValueError(f"the {self.name!r} prompts have no memory line")

    @abc.abstractmethod
    def prompt(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        history: Sequence[tuple[str, str]],
        options: PromptOptions,
    ) -> str:
        """The user text of a turn that starts a chat: turn 0 (empty history) and every
        windowed turn. history: every earlier (observation, action) pair, oldest first (the
        step count is its length); admissible: the env's listed actions, or None."""

    @abc.abstractmethod
    def followup(
        self,
        observation: str,
        admissible: Sequence[str] | None,
        *,
        step: int,
        options: PromptOptions,
    ) -> str:
        """The user text a concat episode appends after step `step` - 1 (the task and the
        history are already in the context)."""

    @abc.abstractmethod
    def fingerprint_parts(self, layout: str, options: PromptOptions) -> list[str]:
        """The fixed texts of this harness's prompts (hashed into the template fingerprint)."""

    def parse_reply(self, reply: str, *, think: bool) -> ParsedReply:
        """The action of a model reply (malformed: valid False and an error)."""
        return parse_reply(reply, think=think)

    def format_reply(self, action: str, *, think: bool) -> str:
        """The reply the policy should produce to take `action` (expert demos)."""
        return tagged_reply(action, think=think)

    def reply_choices(self, *, style: str, think: bool) -> dict[str, str] | None:
        """How a reply can be kept to the actions a prompt of this `style` lists: the JSON of
        a deployment harness's `serving.control.composite.ReplyChoices` ({"pattern": one group
        capturing the list, "separator", "template": the reply around `{choice}`}); None when
        the prompts list no actions or the reply has free text (`think`)."""
        return None

    def read_prompt(self, text: str) -> tuple[str, list[str]]:
        """(task, observations) found in a decoded prompt or context (chat markers removed);
        ("", []) when unknown."""
        return "", []

    def task_type_of(self, task: str) -> str:
        """The task type of a task text ("" if unknown)."""
        return ""


# -- rewards --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RewardWeights:
    """The rollout's reward settings (`RolloutConfig`): the win reward multiplies the env's own
    reward; the penalties are added on a malformed reply / a well-formed but refused action."""

    win_reward: float = 10.0
    invalid_reply_penalty: float = -0.1
    inadmissible_penalty: float = 0.0


def turn_rewards(
    reward: float, *, valid_reply: bool, admissible: bool, weights: RewardWeights
) -> tuple[float, float]:
    """(env_reward, format_reward) of a turn: `win_reward * reward`, and the malformed-reply
    penalty, else the refused-action penalty, else 0."""
    if not valid_reply:
        penalty = weights.invalid_reply_penalty
    else:
        penalty = 0.0 if admissible else weights.inadmissible_penalty
    return weights.win_reward * float(reward), penalty


def repeats_observation(observation: str, current: str, history: Sequence[tuple[str, str]]) -> bool:
    """Whether an env's answer repeats what the episode already saw: the observation the
    command was given (`current`) or one before it (`history`: (observation, command) pairs,
    the opening text first)."""
    return observation == current or any(observation == seen for seen, _ in history)


def repeated_turn(
    observation: str,
    current: str,
    history: Sequence[tuple[str, str]],
    *,
    valid_reply: bool,
    admissible: bool,
) -> bool:
    """A turn `RolloutConfig.repeat_penalty` (source "novelty") falls on: a well-formed,
    admitted command whose answer `repeats_observation` (a refused or malformed one is the
    format penalty's business). One rule for the rollout engine and `PromptedEnv`."""
    return valid_reply and admissible and repeats_observation(observation, current, history)


def reward_sources(
    env_reward: float, format_reward: float, novelty_reward: float
) -> list[tuple[float, str]]:
    """A turn's non-zero rewards as (value, source) under the sources its ATDP step records
    and a served agent posts: "env", "format", "novelty"."""
    rewards = [(env_reward, "env"), (format_reward, "format"), (novelty_reward, "novelty")]
    return [(float(value), source) for value, source in rewards if value]


# -- tasks ----------------------------------------------------------------------------------------


class TaskSampler:
    """Endless, reproducible stream of task indices of one split: each epoch is a fresh stable
    permutation of `indices` (default 0..num_tasks-1). Envs sharing a sampler draw distinct
    tasks until the split is exhausted.

    Failed-task replay (a curriculum in the manner of prioritized level replay, with failure
    as the priority): with `replay_failed` > 0, whoever plays the stream reports each finished
    episode with `record(index, won)`, and each draw is, with probability `replay_failed`,
    the oldest failed task waiting for a replay instead of the permutation's next. A task
    waits at most once at a time, so the queue never outgrows the split; a win takes it off,
    and after `replay_limit` replays that all failed it is not queued again (a task the
    policy cannot win stops taking draws). The draw decisions come from `StableRng`, so a
    stream is reproducible given the order outcomes are recorded in.
    """

    def __init__(
        self,
        split: str,
        num_tasks: int,
        *,
        seed: int = 0,
        indices: Sequence[int] | None = None,
        replay_failed: float = 0.0,
        replay_limit: int = 2,
    ):
        self.split, self.seed = split, seed
        self.indices = tuple(range(num_tasks)) if indices is None else tuple(indices)
        if not self.indices:
            raise ValueError(f"a TaskSampler of {split!r} needs at least one task index")
        for index in self.indices:
            if not isinstance(index, int) or not 0 <= index < num_tasks:
                raise IndexError(
                    f"{split} has {num_tasks} tasks (0..{num_tasks - 1}), got {index!r}"
                )
        check_replay(replay_failed, replay_limit)
        self.replay_failed, self.replay_limit = float(replay_failed), replay_limit
        self._epoch, self._order, self._position = -1, [], 0
        self._draws = 0
        self._waiting: dict[int, None] = {}  # failed tasks waiting for a replay, oldest first
        self._replays: dict[int, int] = {}  # task -> replays served since it last won
        self.replays_served = 0

    def next_index(self) -> int:
        """The next task index: a waiting failed task (probability `replay_failed`), else the
        permutation's next."""
        self._draws += 1
        if self._waiting and StableRng("replay", self.split, self.seed, self._draws).chance(
            self.replay_failed
        ):
            index = next(iter(self._waiting))
            del self._waiting[index]
            self._replays[index] = self._replays.get(index, 0) + 1
            self.replays_served += 1
            return index
        if self._position >= len(self._order):
            self._epoch += 1
            self._order = StableRng("sampler", self.split, self.seed, self._epoch).shuffled(
                self.indices
            )
            self._position = 0
        self._position += 1
        return self._order[self._position - 1]

    def record(self, index: int, won: bool) -> None:
        """Report how an episode of task `index` ended (feeds the failed-task replay; a no-op
        when `replay_failed` is 0)."""
        if not self.replay_failed:
            return
        if won:
            self._waiting.pop(index, None)
            self._replays.pop(index, None)
        elif self._replays.get(index, 0) < self.replay_limit:
            self._waiting.setdefault(index, None)

    @property
    def waiting(self) -> tuple[int, ...]:
        """The failed tasks waiting for a replay, oldest first."""
        return tuple(self._waiting)

    def replay_state(self) -> dict:
        """The failed-task replay's memory as JSON (for a checkpoint): the tasks waiting,
        oldest first, the replays each has been served since it last won, and the count of
        replays served. The permutation's position is not in it: a resumed run draws fresh
        games (`sao_jax.pipeline.rl`)."""
        return {
            "waiting": list(self._waiting),
            "replays": [[index, count] for index, count in self._replays.items()],
            "replays_served": self.replays_served,
        }

    def restore_replay_state(self, state: dict) -> None:
        """Take back what `replay_state` saved, so failures waiting for a replay survive a
        resume. Refuses (ValueError, nothing changed) a state naming tasks this stream does
        not draw, or malformed counts."""
        waiting, replays, served = self.checked_replay_state(state)
        self._waiting = dict.fromkeys(waiting)
        self._replays = replays
        self.replays_served = served

    def checked_replay_state(self, state: dict) -> tuple[list[int], dict[int, int], int]:
        """(waiting, replays per task, replays served) of a saved replay state, or ValueError."""
        try:
            waiting = [int(i) for i in state["waiting"]]
            replays = {int(i): int(n) for i, n in state["replays"]}
            served = int(state["replays_served"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a TaskSampler replay state: {state!r} ({error})") from None
        strays = sorted({*waiting, *replays} - set(self.indices))
        if strays:
            raise ValueError(
                f"the replay state names tasks {strays[:5]} that this {self.split!r} stream "
                f"does not draw: was it saved by a run of another split or task list?"
            )
        if served < 0 or min(replays.values(), default=0) < 0 or len(set(waiting)) < len(waiting):
            raise ValueError(
                f"not a TaskSampler replay state (a negative count or a task twice): {state!r}"
            )
        return waiting, replays, served


def check_replay(replay_failed: float, replay_limit: int) -> None:
    """Raise a ValueError unless 0 <= replay_failed < 1 and replay_limit is an int >= 1."""
    if isinstance(replay_failed, bool) or not isinstance(replay_failed, int | float):
        raise ValueError(f"replay_failed must be a probability, got {replay_failed!r}")
    if not 0.0 <= replay_failed < 1.0:
        raise ValueError(
            f"replay_failed must be in [0, 1) (1 would replay failures forever), got "
            f"{replay_failed!r}"
        )
    if isinstance(replay_limit, bool) or not isinstance(replay_limit, int) or replay_limit < 1:
        raise ValueError(f"replay_limit must be an int >= 1, got {replay_limit!r}")


class TextEnv(abc.ABC):
    """One task at a time of a text environment; see the module docstring for info keys.

    Class attributes:
      name: the registry name, recorded as `header.task["env"]`.
      splits: {split: number of tasks}; tasks are indices 0..n-1 and a pure function of the
        split, the index and the env's constructor options.
      experts: the expert kinds `EnvConfig.expert` may name.
      task_types: the task categories evaluation reports success for (() if none).
      harness: the `PromptHarness` of its prompts and replies.
    Instance attributes: split, max_steps, expert, and sampler (a `TaskSampler` of the split,
    shared by the envs of one batch).

    Rewards: `step` returns the env's own reward (e.g. 1.0 on the winning step); the rollout
    turns it and the reply's validity into the turn's rewards with `rewards` (the reward hook:
    override it for a different shaping).
    """

    name: ClassVar[str]
    splits: ClassVar[Mapping[str, int]]
    experts: ClassVar[tuple[str, ...]]
    task_types: ClassVar[tuple[str, ...]] = ()
    harness: ClassVar[PromptHarness]

    split: str
    max_steps: int
    expert: str
    sampler: TaskSampler

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Any, sampler: TaskSampler) -> TextEnv:
        """An env playing `config.split` from `sampler` (the registry's factory; config: an
        `EnvConfig` of `sao_jax.envs.registry`, which imports this module)."""

    @classmethod
    @abc.abstractmethod
    def from_task_spec(cls, spec: Mapping, *, expert: str | None = None) -> TextEnv:
        """An env that can replay a stored episode: `header.task` as `Episode.task_spec()`
        wrote it (call `reset(spec["index"])` next). expert: None = the first of `experts`."""

    @classmethod
    @abc.abstractmethod
    def vocabulary(cls) -> list[str]:
        """Every word its prompts, observations and actions use (a word tokenizer's corpus)."""

    @abc.abstractmethod
    def reset(self, index: int | None = None) -> tuple[str, dict]:
        """Start task `index` of the split (None: the sampler's next); (observation, info)."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply `action` ("" for a malformed reply: it still costs a step);
        (observation, reward, done, info). done: won or `max_steps` steps taken."""

    @abc.abstractmethod
    def expert_action(self) -> str | None:
        """The expert's next action from the current state (None once won)."""

    def task_spec(self) -> dict:
        """Env-specific keys of `header.task` that `from_task_spec` needs besides env, split,
        index and max_steps (which the episode records itself)."""
        return {}

    def rewards(
        self, reward: float, *, valid_reply: bool, admissible: bool, weights: RewardWeights
    ) -> tuple[float, float]:
        """The reward hook: (env_reward, format_reward) of a turn (`turn_rewards`)."""
        return turn_rewards(reward, valid_reply=valid_reply, admissible=admissible, weights=weights)
