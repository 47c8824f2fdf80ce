"""The env protocol: the registry builds registered envs from an EnvConfig (a user's own env
included), clear errors for unknown or clashing names and incomplete envs, the shared task
sampler and reply parser, the default reward hook, and the info-key check."""

from __future__ import annotations

from typing import ClassVar

import pytest

from sao_jax.envs import (
    EnvConfig,
    PromptHarness,
    PromptOptions,
    RewardWeights,
    TaskSampler,
    TextEnv,
    env_class,
    env_from_task_spec,
    env_names,
    parse_reply,
    register_env,
)
from sao_jax.envs.alfworld import AlfworldEnv, GameSampler
from sao_jax.envs.base import STEP_INFO_KEYS, check_info, repeats_observation, tagged_reply
from sao_jax.rollout.prompts import PromptBuilder, template_fingerprint
from sao_jax.tokenizers import WordTokenizer


class EchoPrompts(PromptHarness):
    name = "echo"

    def prompt(self, task, observation, admissible, history, options):
        return f"Say: {task}\nSeen: {observation}"

    def followup(self, observation, admissible, *, step, options):
        return f"Seen: {observation}"

    def fingerprint_parts(self, layout, options):
        return ["echo"]


class EchoEnv(TextEnv):
    """A user's env in a dozen lines: win by saying the task's word."""

    name = "echo"
    splits: ClassVar = {"train": 3, "test": 2}
    experts = ("copy",)
    harness = EchoPrompts()
    WORDS = ("apple", "pear", "plum")

    def __init__(self, split, max_steps, sampler, expert="copy"):
        self.split, self.max_steps, self.sampler, self.expert = split, max_steps, sampler, expert

    @classmethod
    def from_config(cls, config, sampler):
        return cls(config.split, config.max_steps, sampler, config.expert)

    @classmethod
    def from_task_spec(cls, spec, *, expert=None):
        return cls(spec["split"], spec["max_steps"], TaskSampler(spec["split"], 3))

    @classmethod
    def vocabulary(cls):
        return ["Say", "Seen", *cls.WORDS]

    def reset(self, index=None):
        index = self.sampler.next_index() if index is None else index
        self.word, self.steps = self.WORDS[index], 0
        return "ready", self._info(False)

    def step(self, action):
        self.steps += 1
        won = action == self.word
        info = {**self._info(won), "admissible": True}
        return action, float(won), won or self.steps >= self.max_steps, info

    def expert_action(self):
        return self.word

    def _info(self, won):
        return {
            "task": self.word,
            "task_id": self.word,
            "task_type": "",
            "admissible_commands": None,
            "won": won,
        }


def test_builtin_envs_are_registered_by_name():
    assert {"alfworld", "arithmetic"} <= set(env_names())
    assert env_class("alfworld") is AlfworldEnv
    (env,) = EnvConfig(size="small", max_steps=3).make_envs(1)
    assert isinstance(env, AlfworldEnv) and env.max_steps == 3
    observation, info = env.reset(0)
    assert check_info(info, ("task", "task_id", "task_type", "admissible_commands", "won"), "t")
    assert info["task_id"] == info["game_id"] and observation
    _, _, _, info = env.step("look")
    assert check_info(info, STEP_INFO_KEYS, "step")


def test_a_registered_user_env_is_built_and_rebuilt_by_name():
    register_env(EchoEnv)
    register_env(EchoEnv)  # the same class again: harmless
    envs = EnvConfig(name="echo", split="train", max_steps=2, expert="copy").make_envs(2)
    assert all(isinstance(e, EchoEnv) for e in envs) and envs[0].sampler is envs[1].sampler
    played = {envs[0].reset()[1]["task"], envs[1].reset()[1]["task"]}
    assert len(played) == 2  # one shared task stream: distinct tasks
    env = env_from_task_spec({"env": "echo", "split": "test", "max_steps": 1, "index": 1})
    env.reset(1)
    assert env.step(env.expert_action())[1:3] == (1.0, True)
    assert template_fingerprint("windowed", 2, False, harness=EchoEnv.harness).startswith("echo-")


def test_registry_and_config_errors_name_the_problem():
    register_env(EchoEnv)
    with pytest.raises(ValueError, match=r"unknown env 'chess'; expected one of \("):
        EnvConfig(name="chess")
    with pytest.raises(ValueError, match=r"EnvConfig\.expert must be one of"):
        EnvConfig(name="echo", split="train", expert="search")
    with pytest.raises(ValueError, match="unknown split 'dev' of 'alfworld'"):
        EnvConfig(split="dev")
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        EnvConfig(max_steps=0)
    with pytest.raises(ValueError, match="num_envs"):
        EnvConfig().make_envs(0)
    with pytest.raises(TypeError, match="TextEnv subclass"):
        register_env(dict)

    class Impostor(EchoEnv):
        pass

    with pytest.raises(ValueError, match="'echo' is taken"):
        register_env(Impostor)

    class Nameless(EchoEnv):
        name = ""

    with pytest.raises(ValueError, match="name must be a non-empty string"):
        register_env(Nameless)

    class Alfworld2(EchoEnv):
        name = "alfworld"

    with pytest.raises(ValueError, match=r"taken|built-in"):
        register_env(Alfworld2)
    with pytest.raises(TypeError, match="abstract"):

        class Half(TextEnv):  # no reset / step / ...
            name = "half"

        Half()


def test_task_sampler_is_a_stable_permutation_per_epoch():
    sampler = TaskSampler("train", 5, seed=3)
    first = [sampler.next_index() for _ in range(5)]
    second = [sampler.next_index() for _ in range(5)]
    assert sorted(first) == sorted(second) == list(range(5)) and first != second
    again = TaskSampler("train", 5, seed=3)
    assert [again.next_index() for _ in range(10)] == first + second
    # ALFWorld's game sampler is the same stream (stored runs replay the same games)
    games = GameSampler("valid_seen", seed=3)
    shared = TaskSampler("valid_seen", AlfworldEnv.splits["valid_seen"], seed=3)
    assert [games.next_index() for _ in range(20)] == [shared.next_index() for _ in range(20)]
    with pytest.raises(IndexError, match=r"train has 5 tasks \(0..4\), got 5"):
        TaskSampler("train", 5, indices=[5])
    with pytest.raises(ValueError, match="at least one task"):
        TaskSampler("train", 5, indices=[])


def test_task_sampler_without_replay_ignores_outcomes():
    plain, told = TaskSampler("train", 20, seed=1), TaskSampler("train", 20, seed=1)
    drawn = []
    for _ in range(30):
        drawn.append(told.next_index())
        told.record(drawn[-1], won=False)
    assert drawn == [plain.next_index() for _ in range(30)]
    assert told.waiting == () and told.replays_served == 0


def test_failed_task_replay_serves_failures_until_won_or_limit():
    sampler = TaskSampler("train", 200, seed=0, replay_failed=0.5, replay_limit=2)
    first = sampler.next_index()
    sampler.record(first, won=False)
    assert sampler.waiting == (first,)
    sampler.record(first, won=False)  # a task waits once at a time
    assert sampler.waiting == (first,)
    # a task that always fails comes back exactly `replay_limit` times (within one epoch the
    # permutation does not draw it again)
    draws = [first]
    for _ in range(60):
        draws.append(sampler.next_index())
        sampler.record(draws[-1], won=draws[-1] != first)
    assert draws.count(first) == 3 and sampler.replays_served == 2
    assert first not in sampler.waiting
    # the other tasks were won: none waits, none came twice
    assert sampler.waiting == () and len(set(draws)) == len(draws) - 2
    # a win takes a waiting task off the queue and resets its count
    other = TaskSampler("train", 200, seed=0, replay_failed=0.5, replay_limit=1)
    task = other.next_index()
    other.record(task, won=False)
    other.record(task, won=True)
    assert other.waiting == ()
    # the oldest failure is replayed first
    queue = TaskSampler("train", 200, seed=0, replay_failed=0.9)
    failed = [queue.next_index() for _ in range(3)]
    for index in failed:
        queue.record(index, won=False)
    replayed = [i for i in (queue.next_index() for _ in range(30)) if i in failed]
    assert replayed == failed


def test_failed_task_replay_state_survives_a_json_round_trip_into_a_fresh_stream():
    import json

    saved = TaskSampler("train", 200, seed=0, replay_failed=0.9, replay_limit=2)
    failed = [saved.next_index() for _ in range(3)]
    for index in failed:
        saved.record(index, won=False)
    replayed = saved.next_index()  # the oldest failure, served once
    state = json.loads(json.dumps(saved.replay_state()))
    # a resumed run's stream: another seed (fresh games), the same queue and counts
    resumed = TaskSampler("train", 200, seed=7, replay_failed=0.9, replay_limit=2)
    resumed.restore_replay_state(state)
    assert replayed == failed[0] and resumed.waiting == saved.waiting == tuple(failed[1:])
    assert resumed.replays_served == saved.replays_served == 1
    resumed.record(replayed, won=False)  # its replays count on: one more allowed, then none
    assert resumed.waiting == (*failed[1:], replayed)
    draws = [resumed.next_index() for _ in range(40)]
    assert [d for d in draws if d in failed][:3] == [*failed[1:], replayed]
    # bad states are refused and change nothing
    before = resumed.replay_state()
    bad_states = [
        {"waiting": [500], "replays": [], "replays_served": 0},  # not a task of this stream
        {"waiting": [1, 1], "replays": [], "replays_served": 0},
        {"waiting": [], "replays": [[1, -1]], "replays_served": 0},
        {"waiting": []},
    ]
    for bad in bad_states:
        with pytest.raises(ValueError, match="replay state"):
            resumed.restore_replay_state(bad)
        assert resumed.replay_state() == before


def test_failed_task_replay_takes_its_share_of_draws_and_is_reproducible():
    def stream(seed):
        sampler = TaskSampler("train", 5000, seed=seed, replay_failed=0.3, replay_limit=100)
        drawn = []
        for _ in range(2000):
            drawn.append(sampler.next_index())
            sampler.record(drawn[-1], won=False)  # every task fails: the queue never empties
        return drawn, sampler.replays_served

    drawn, replays = stream(4)
    assert abs(replays / 2000 - 0.3) < 0.05
    assert len(drawn) - len(set(drawn)) == replays  # a 5,000-task epoch repeats nothing itself
    assert stream(4) == (drawn, replays)
    assert stream(5)[0] != drawn


@pytest.mark.parametrize(
    ("replay_failed", "replay_limit", "message"),
    [
        (1.0, 2, r"replay_failed must be in \[0, 1\)"),
        (-0.1, 2, r"replay_failed must be in \[0, 1\)"),
        ("0.5", 2, "replay_failed must be a probability"),
        (True, 2, "replay_failed must be a probability"),
        (0.5, 0, "replay_limit must be an int >= 1"),
        (0.5, 1.5, "replay_limit must be an int >= 1"),
    ],
)
def test_failed_task_replay_rejects_bad_settings(replay_failed, replay_limit, message):
    with pytest.raises(ValueError, match=message):
        TaskSampler("train", 5, replay_failed=replay_failed, replay_limit=replay_limit)
    with pytest.raises(ValueError, match=message):
        EnvConfig(replay_failed=replay_failed, replay_limit=replay_limit)


def test_env_config_gives_its_envs_one_replaying_stream():
    envs = EnvConfig(replay_failed=0.25, replay_limit=3).make_envs(2)
    assert envs[0].sampler is envs[1].sampler
    assert (envs[0].sampler.replay_failed, envs[0].sampler.replay_limit) == (0.25, 3)
    assert EnvConfig().make_envs(1)[0].sampler.replay_failed == 0.0


def test_replies_rewards_and_info_checks():
    assert parse_reply(tagged_reply("calc 2 * 3", think=True), think=True).action == "calc 2 * 3"
    assert (
        parse_reply("<action>go</action>", think=True).error
        == "0 <think> blocks; expected exactly one"
    )
    weights = RewardWeights(win_reward=5.0, invalid_reply_penalty=-1.0, inadmissible_penalty=-0.5)
    env = EchoEnv("train", 1, TaskSampler("train", 3))
    assert env.rewards(1.0, valid_reply=True, admissible=True, weights=weights) == (5.0, 0.0)
    assert env.rewards(0.0, valid_reply=False, admissible=False, weights=weights) == (0.0, -1.0)
    assert env.rewards(0.0, valid_reply=True, admissible=False, weights=weights) == (0.0, -0.5)
    with pytest.raises(ValueError, match=r"MyEnv.step info lacks \['admissible'\]"):
        check_info({"task": "", "task_id": "", "task_type": "", "admissible_commands": None,
                    "won": False}, STEP_INFO_KEYS, "MyEnv.step")  # fmt: skip
    with pytest.raises(ValueError, match="prompt style must be one of"):
        PromptOptions(style="terse")


def test_prompt_builder_uses_the_env_harness_and_refuses_what_it_cannot_render():
    tokenizer = WordTokenizer.from_words([*EchoEnv.vocabulary(), "ready"])
    builder = PromptBuilder(tokenizer, "windowed", history_length=1, think=False,
                            harness=EchoEnv.harness)  # fmt: skip
    text = tokenizer.decode(builder.first("apple", "ready", None), skip_special_tokens=True)
    assert "Say: apple" in text and "Seen: ready" in text
    with pytest.raises(ValueError, match="'echo' prompts have no memory line"):
        PromptBuilder(tokenizer, "windowed", history_length=1, think=False, memory_line=True,
                      harness=EchoEnv.harness)  # fmt: skip


def test_an_answer_repeats_when_the_episode_saw_it_before():
    history = [("You are in the middle of a room.", "go to desk 1"), ("On the desk 1...", "look")]
    assert repeats_observation("On the desk 1...", "You see a lamp.", history)
    assert repeats_observation("You are in the middle of a room.", "x", history)
    assert repeats_observation("You see a lamp.", "You see a lamp.", history)  # the one just given
    assert not repeats_observation("You see a mug.", "You see a lamp.", history)
    assert not repeats_observation("On the desk 1", "x", history)  # whole texts, not prefixes
    assert not repeats_observation("anything", "other", [])
