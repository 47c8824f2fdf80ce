"""The env API rollouts use, the game sampler, and the batched wrapper."""

from __future__ import annotations

import numpy as np
import pytest

from sao_jax.envs.alfworld.batched import BatchedAlfworldEnv
from sao_jax.envs.alfworld.env import AlfworldEnv, GameSampler
from sao_jax.envs.alfworld.game import TASK_TYPES
from sao_jax.envs.alfworld.generator import make_game


def test_reset_and_step_follow_the_contract():
    env = AlfworldEnv("valid_seen", size="small", expert_in_info=True)
    observation, info = env.reset(index=4)
    game = make_game("valid_seen", 4, size="small")
    assert observation.endswith(f"Your task is to: {game.task.sentence}.")
    assert info["task"] == game.task.sentence and info["task_type"] == game.task.task_type
    assert info["game_id"] == "valid_seen/small/0004" and info["steps"] == 0 and not info["won"]
    assert info["expert_action"] in info["admissible_commands"]
    total, done = 0.0, False
    while not done:
        observation, reward, done, info = env.step(info["expert_action"])
        total += reward
        assert info["admissible"]
    assert total == 1.0 and info["won"] and info["expert_action"] is None
    assert info["episode"] == {
        "won": True,
        "steps": info["steps"],
        "task_type": game.task.task_type,
        "game_id": game.game_id,
    }
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_episode_ends_after_max_steps_and_bad_commands_cost_a_step():
    env = AlfworldEnv("train", max_steps=3)
    env.reset(index=0)
    assert env.step("dance")[1:3] == (0.0, False)
    _, _, done, info = env.step("dance")
    assert not done and info["admissible"] is False and info["steps"] == 2
    observation, reward, done, info = env.step("look")
    assert (observation.startswith("You are in the middle"), reward, done) == (True, 0.0, True)
    assert info["episode"]["won"] is False and info["episode"]["steps"] == 3


def test_reset_plays_a_given_game_object():
    game = make_game("train", 9, size="full")
    env = AlfworldEnv("train")
    env.reset(game=game)
    assert env.game is game


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(split="dev"), ValueError, "unknown split"),
        (dict(size="medium"), ValueError, "unknown size"),
        (dict(max_steps=0), ValueError, "max_steps"),
        (dict(indices=[5000]), IndexError, "train has 3553"),
        (dict(phrasing="1.0"), ValueError, "phrasing"),
    ],
)
def test_bad_env_settings_name_the_problem(kwargs, error, message):
    with pytest.raises(error, match=message):
        AlfworldEnv(**kwargs).reset()


def test_env_without_a_game_says_so():
    env = AlfworldEnv()
    with pytest.raises(RuntimeError, match="reset"):
        _ = env.game
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


def test_sampler_covers_each_epoch_once_in_a_seeded_order():
    sampler = GameSampler("valid_unseen", seed=3)
    first_epoch = [sampler.next_index() for _ in range(134)]
    assert sorted(first_epoch) == list(range(134))
    second_epoch = [sampler.next_index() for _ in range(134)]
    assert sorted(second_epoch) == list(range(134)) and second_epoch != first_epoch
    again = GameSampler("valid_unseen", seed=3)
    assert [again.next_index() for _ in range(134)] == first_epoch
    other = GameSampler("valid_unseen", seed=4)
    assert [other.next_index() for _ in range(134)] != first_epoch
    subset = GameSampler("train", indices=[7, 9])
    assert sorted(subset.next_index() for _ in range(2)) == [7, 9]
    with pytest.raises(ValueError, match="at least one"):
        GameSampler("train", indices=[])
    with pytest.raises(ValueError, match="sampler draws from"):
        AlfworldEnv("valid_seen", sampler=GameSampler("train"))


@pytest.mark.parametrize("expert", ["search", "oracle"])
def test_batched_envs_play_distinct_games_and_count_successes_per_task_type(expert):
    batch = BatchedAlfworldEnv(16, "valid_seen", size="small", seed=1, expert=expert)
    assert all(env.expert == expert for env in batch.envs)
    observations, infos = batch.reset()
    assert len(observations) == 16 and len({info["game_id"] for info in infos}) == 16
    dones = np.zeros(16, bool)
    while not dones.all():
        commands = batch.expert_actions()
        observations, rewards, step_dones, infos = batch.step(commands)
        assert rewards.dtype == np.float32 and step_dones.dtype == bool
        for e, command in enumerate(commands):
            assert infos[e]["stepped"] == (command is not None)
        dones |= step_dones
    stats = batch.success_by_task_type()
    assert stats["all"] == {"episodes": 16, "won": 16, "success_rate": 1.0}
    assert sum(stats[t]["episodes"] for t in TASK_TYPES) == 16
    assert all(stats[t]["success_rate"] == 1.0 for t in TASK_TYPES if stats[t]["episodes"])


def test_batched_step_checks_its_commands():
    batch = BatchedAlfworldEnv(2, "train", max_steps=1)
    batch.reset()
    with pytest.raises(ValueError, match="got 1 commands for 2 envs"):
        batch.step(["look"])
    _, _, dones, infos = batch.step(["look", None])
    assert dones.tolist() == [True, False] and infos[1]["stepped"] is False
    assert batch.success_by_task_type()["all"] == {"episodes": 1, "won": 0, "success_rate": 0.0}
    with pytest.raises(ValueError, match="env 0 has finished"):
        batch.step(["look", "look"])
    batch.reset([0])
    assert batch.step(["look", "look"])[2].tolist() == [True, True]
    with pytest.raises(ValueError, match="num_envs"):
        BatchedAlfworldEnv(0)


def test_batched_auto_reset_starts_the_next_game_at_once():
    batch = BatchedAlfworldEnv(1, "train", size="small", auto_reset=True, max_steps=2)
    _, infos = batch.reset()
    first_game = infos[0]["game_id"]
    batch.step(["look"])
    observations, _, dones, infos = batch.step(["look"])
    assert dones[0]
    assert infos[0]["final_observation"].startswith("You are in the middle of a room.")
    assert infos[0]["episode"]["game_id"] == first_game != infos[0]["game_id"]
    assert observations[0].startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert infos[0]["steps"] == 0
    batch.step(["look"])  # the new episode accepts commands
