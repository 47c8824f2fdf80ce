"""The arithmetic env: deterministic tasks per split, the calculator and answer rules, refused
actions, the expert solves every task, its words fit a word tokenizer, and an AgentLoop with a
tiny random policy plays it end to end into Episodes that become ATDP trajectories."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from atdp_io import EventKind
from sao_jax.envs import EnvConfig, PromptedEnv, PromptOptions, env_from_task_spec
from sao_jax.envs.arithmetic import (
    SPLITS,
    TASK_TYPES,
    ArithmeticEnv,
    CalculatorError,
    evaluate_expression,
    make_task,
)
from sao_jax.models import init_model
from sao_jax.rollout import (
    AgentLoop,
    EngineConfig,
    RolloutConfig,
    RolloutEngine,
    Sampler,
    WeightPublisher,
    collect_expert_demos,
    evaluate,
)
from sao_jax.seed import from_batch, from_trajectory
from sao_jax.tokenizers import WordTokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
from rollout_testlib import open_store, read_batches, small_moe_config

ROLLOUT = RolloutConfig(max_new_tokens=16, max_context_tokens=256, decode_chunk=4)


@functools.cache
def tokenizer() -> WordTokenizer:
    return WordTokenizer.from_texts([" ".join(ArithmeticEnv.vocabulary())])


@functools.cache
def model():
    return init_model(small_moe_config(tokenizer().vocab_size, dense_intermediate_size=64))


@functools.cache
def sampler() -> Sampler:
    return Sampler(model(), pad_id=tokenizer().pad_id, min_prompt_bucket=256)


def play_expert(env: ArithmeticEnv, index: int) -> tuple[list[str], float, dict]:
    env.reset(index)
    actions, total, info = [], 0.0, {}
    done = False
    while not done:
        action = env.expert_action()
        _, reward, done, info = env.step(action)
        actions.append(action)
        total += reward
    return actions, total, info


def test_tasks_are_deterministic_and_splits_differ():
    for split, n in SPLITS.items():
        tasks = [make_task(split, i) for i in range(20)]
        assert tasks == [make_task(split, i) for i in range(20)]
        assert {t.task_type for t in tasks} == set(TASK_TYPES)
        assert all(evaluate_expression(t.expression) == t.answer for t in tasks)
        assert make_task(split, n - 1).task_id == f"arithmetic-{split}-{n - 1}"
    seen = [make_task("valid_seen", i) for i in range(SPLITS["valid_seen"])]
    unseen = [make_task("valid_unseen", i) for i in range(SPLITS["valid_unseen"])]
    assert max(_operands(seen)) < 100 <= min(_operands(unseen, "add"))
    assert any("(" in t.expression for t in unseen) and not any("(" in t.expression for t in seen)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        make_task("test", 0)
    with pytest.raises(IndexError, match=r"valid_seen has 100 tasks \(0..99\), got 100"):
        make_task("valid_seen", 100)


def _operands(tasks, task_type=None) -> list[int]:
    """Every number in the tasks' expressions (of one task type if given)."""
    chosen = [t for t in tasks if task_type in (None, t.task_type)]
    return [int(n) for t in chosen for n in re.findall(r"\d+", t.expression)]


def test_calculator_reads_integer_expressions_and_refuses_the_rest():
    assert evaluate_expression("2 + 3 * 4") == 14
    assert evaluate_expression("(2 + 3) * 4") == 20
    assert evaluate_expression("7 - 10") == -3 and evaluate_expression("-(2*3)") == -6
    for bad, reason in [
        ("", "empty"),
        ("2 +", "ends too early"),
        ("(2", "never closed"),
        ("2 )", r"unexpected '\)'"),
        ("2 / 3", "cannot read '/ 3'"),
        ("import os", "cannot read"),
        ("9" * 81, "longer than 80"),
        ("99999999 * 99999999", "beyond"),
    ]:
        with pytest.raises(CalculatorError, match=reason):
            evaluate_expression(bad)


def test_rules_calc_then_answer_wins_and_bad_actions_are_refused():
    env = ArithmeticEnv("train", max_steps=5)
    observation, info = env.reset(3)
    task = make_task("train", 3)
    assert observation == "The calculator is ready." and info["task"] == task.text
    assert info["admissible_commands"] is None and info["task_type"] == task.task_type
    observation, reward, done, info = env.step("calc 6*7")
    assert (observation, reward, done, info["admissible"], info["tool"]) == (
        "6 * 7 = 42", 0.0, False, True, "calc",
    )  # fmt: skip
    for action, expected in [
        ("", "Unknown action"),
        ("hello world", "Unknown action"),
        ("calc 2 +", "The calculator refused: the expression ends too early."),
        ("answer twelve", "The answer must be a whole number."),
    ]:
        observation, reward, done, info = env.step(action)
        assert expected in observation and not info["admissible"] and reward == 0.0
    assert env.done and env.steps == 5 and not info["won"]  # the step limit ended it
    env.reset(3)
    observation, reward, done, info = env.step(f"answer {task.answer}")
    assert (reward, done, info["won"]) == (1.0, True, True) and observation.startswith("Correct")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("calc 1")
    env.reset(3)
    observation, reward, done, info = env.step(f"answer {task.answer + 1}")
    assert (reward, done, info["won"], info["admissible"]) == (0.0, True, False, True)
    assert observation.startswith("Wrong")


def test_the_expert_solves_every_task_of_every_split_with_the_calculator():
    for split, n in SPLITS.items():
        env = ArithmeticEnv(split, max_steps=4)
        for index in range(n):
            actions, total, info = play_expert(env, index)
            assert total == 1.0 and info["won"], (split, index, actions)
            assert actions[0].startswith("calc ") and actions[1].startswith("answer ")
            assert env.expert_action() is None


def test_every_text_of_the_env_fits_the_word_vocabulary():
    tok = tokenizer()
    assert tok.vocab_size < 400  # small enough for the tiny preset's embedding
    env = ArithmeticEnv("valid_unseen", max_steps=6)
    texts = []
    for index in range(10):
        observation, info = env.reset(index)
        texts += [observation, info["task"]]
        for action in ("calc 2 +", "hello", "answer x", "calc " + "9" * 81):
            texts.append(env.step(action)[0])
        texts.append(env.step(env.expert_action())[0])
        texts.append(env.step(env.expert_action())[0])
    for text in texts:
        ids = tok.encode(text)
        assert tok.unk_id not in ids, text
        assert tok.decode(ids) == text


def test_config_registry_and_task_spec_rebuild_the_env():
    envs = EnvConfig(name="arithmetic", split="valid_seen", max_steps=3).make_envs(2)
    assert all(isinstance(e, ArithmeticEnv) and e.max_steps == 3 for e in envs)
    first = {envs[0].reset()[1]["task_id"], envs[1].reset()[1]["task_id"]}
    assert len(first) == 2
    env = env_from_task_spec(
        {"env": "arithmetic", "split": "valid_unseen", "index": 4, "max_steps": 2}
    )
    assert isinstance(env, ArithmeticEnv) and env.max_steps == 2
    assert env.reset(4)[1]["task"] == make_task("valid_unseen", 4).text


def test_prompted_env_speaks_in_prompts_and_replies():
    env = PromptedEnv(ArithmeticEnv("train", max_steps=4), PromptOptions(history_length=2))
    prompt, info = env.reset(3)
    task = make_task("train", 3)
    assert f"Task: {task.text}" in prompt and "Current observation: The calculator" in prompt
    assert prompt.endswith("Give one action within <action> </action> tags.")
    prompt, reward, done, info = env.step("no tags here")
    assert (reward, done, info["invalid_replies"]) == (-0.1, False, 1)
    assert info["reply"].error == "no <action>...</action> block"
    prompt, reward, done, info = env.step(f"<action>calc {task.expression}</action>")
    assert reward == 0.0 and f"= {task.answer}" in prompt
    assert f"Action: calc {task.expression}" in prompt  # the history window shows it
    prompt, reward, done, info = env.step(f"<action>answer {task.answer}</action>")
    assert (reward, done, info["won"]) == (10.0, True, True)
    assert [action for _, action in info["history"]] == [
        "",
        f"calc {task.expression}",
        f"answer {task.answer}",
    ]
    with pytest.raises(ValueError, match="'arithmetic' prompts have no memory line"):
        PromptedEnv(ArithmeticEnv(), PromptOptions(memory_line=True))
    with pytest.raises(TypeError, match="needs a TextEnv"):
        PromptedEnv(object())


def _episodes(config: RolloutConfig, num: int = 6):
    envs = EnvConfig(name="arithmetic", max_steps=3).make_envs(3)
    loop = AgentLoop(sampler(), tokenizer(), envs, config, run_id="arith")
    return [e for group in loop.play(range(num), max_episodes=num) for e in group]


@pytest.mark.parametrize("layout", ["windowed", "concat"])
def test_agent_loop_plays_random_policy_episodes_into_atdp(tmp_path, layout):
    config = RolloutConfig(**{**ROLLOUT.__dict__, "layout": layout, "group_size": 2})
    episodes = _episodes(config)
    assert len(episodes) == 6 and {e.env for e in episodes} == {"arithmetic"}
    for episode in episodes:
        assert episode.steps in (1, 2, 3)
        assert episode.game_id == f"arithmetic-train-{episode.game_index}"
        assert episode.task == make_task("train", episode.game_index).text
        for turn in episode.turns:
            assert turn.info["task_id"] == episode.game_id  # the env's step info is kept
    # a random policy's malformed replies: penalised, each costs a step
    invalid = [t for e in episodes for t in e.turns if not t.valid_reply]
    assert invalid
    assert all(t.command == "" for t in invalid)
    assert all(t.format_reward == ROLLOUT.invalid_reply_penalty for t in invalid)
    store = open_store(tmp_path / "atdp")
    with store.writer("arith") as writer:
        writer.append([e.to_trajectory(tenant="arith") for e in episodes])
    reader = store.reader("arith", principal="arith")
    reader.refresh()
    trajectories = [reader.read(i) for i in reader.trajectory_ids()]
    assert len(trajectories) == 6
    for trajectory in trajectories:
        task = trajectory.header.task
        assert task["env"] == "arithmetic" and task["split"] == "train"
        assert trajectory.header.envelope.harness_schema.startswith("arithmetic-")
        assert {e.kind for e in trajectory.events} == {EventKind.LLM_CALL, EventKind.ENV_STEP}
        assert from_trajectory(trajectory).task == make_task("train", task["index"]).text
    batches, _ = read_batches(store, "arith", layout, rows=32)
    calls = sum(e.steps for e in episodes)
    rows = sum(int((b["traj_index"] >= 0).sum()) for b in batches)
    assert rows == (calls if layout == "windowed" else 6)
    if layout == "windowed":  # (a concat input also holds the sampled replies, <unk> or not)
        prompts = [t.input_ids for e in episodes for t in e.turns]
        assert all(tokenizer().unk_id not in ids for ids in prompts)


def test_expert_demos_win_and_decode_back_through_the_harness(tmp_path):
    store = open_store(tmp_path / "demos")
    env = EnvConfig(name="arithmetic", max_steps=4)
    with store.writer("demos") as writer:
        stats = collect_expert_demos(
            writer, tokenizer(), num_episodes=5, rollout=ROLLOUT, env=env, run_id="ademo"
        )
    assert stats["episodes"] == 5 and stats["success_rate"] == 1.0
    assert stats["avg_steps"] == 2.0 and stats["invalid_replies"] == 0
    (batch,), _ = read_batches(store, "demos", "windowed", rows=16)
    records = from_batch(batch, tokenizer(), env="arithmetic")
    assert len(records) == 5
    for record in records.values():
        assert record.success and record.actions[0].startswith("calc ")
        assert record.actions[1].startswith("answer ") and len(record.observations) == 2
        assert record.task_type in TASK_TYPES
    rewards = batch["rewards"][batch["rewards"] != 0]  # the win reward on each answer token
    assert rewards.shape == (5,) and np.allclose(rewards, ROLLOUT.win_reward)


def test_evaluate_reports_success_per_task_type_of_the_env():
    result = evaluate(
        sampler(),
        tokenizer(),
        split="valid_unseen",
        num_games=5,
        num_envs=5,
        rollout=ROLLOUT,
        env=EnvConfig(name="arithmetic", max_steps=2),
    )
    assert result.episodes == 5 and set(result.by_task_type) == set(TASK_TYPES)
    assert all(row["episodes"] == 1 for row in result.by_task_type.values())
    with pytest.raises(ValueError, match="unknown split 'valid' of 'arithmetic'"):
        evaluate(sampler(), tokenizer(), split="valid", env=EnvConfig(name="arithmetic"))


def test_the_rollout_engine_writes_arithmetic_episodes(tmp_path):
    store = open_store(tmp_path / "atdp")
    with store.writer("arith") as writer:
        engine = RolloutEngine(
            model(),
            tokenizer(),
            writer,
            WeightPublisher(),
            rollout=ROLLOUT,
            env=EnvConfig(name="arithmetic", max_steps=2),
            config=EngineConfig(
                envs_per_worker=4, episodes_per_version=4, asynchronous=False, tenant="arith"
            ),
            samplers=[sampler()],
        )
        with engine:
            stats = engine.generate(4)
    assert stats["episodes"] == 4 and set(stats["by_task_type"]) == set(TASK_TYPES)
    reader = store.reader("arith", principal="arith")
    reader.refresh()
    tasks = [reader.read(i).header.task for i in reader.trajectory_ids()]
    assert len(tasks) == 4 and {t["env"] for t in tasks} == {"arithmetic"}
