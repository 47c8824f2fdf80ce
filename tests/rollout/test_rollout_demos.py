"""Expert demonstrations: the policy's reply format in the policy's token layout, marked as
demos, won, and laid out by the loader into rows whose action tokens decode to the expert's
commands with the win reward on the last one."""

import numpy as np
import pytest
from rollout_testlib import env_config, open_store, read_batches, rollout_config, tokenizer

from sao_jax.envs import env_from_task_spec
from sao_jax.envs.alfworld import AlfworldEnv, parse_reply
from sao_jax.rollout import collect_expert_demos

TENANT = "alfworld-demos"
# header.task of an ALFWorld episode, as stored before envs were pluggable (loaders and
# relabelling read these keys)
ALFWORLD_TASK_KEYS = {
    "env", "split", "index", "size", "phrasing", "max_steps", "game_id", "task_type",
    "group_id", "group_size", "member", "group_key", "layout", "source",
}  # fmt: skip


def collect(tmp_path, num_episodes=4, expert="search", **rollout):
    store = open_store(tmp_path / "demos")
    with store.writer(TENANT) as writer:
        stats = collect_expert_demos(
            writer,
            tokenizer(),
            num_episodes=num_episodes,
            rollout=rollout_config(**rollout),
            env=env_config(max_steps=50, expert=expert),
        )
    reader = store.reader(TENANT, principal=TENANT)
    reader.refresh()
    return store, stats, [reader.read(i) for i in reader.trajectory_ids()]


@pytest.mark.parametrize("layout", ["windowed", "concat"])
def test_demo_rows_decode_to_the_expert_commands(tmp_path, layout):
    # a whole search-expert episode (it looks before it finds) outgrows the 1024-token concat
    # row of these tests; the planner's short episodes fit
    expert = "search" if layout == "windowed" else "oracle"
    store, stats, trajectories = collect(tmp_path, layout=layout, expert=expert)
    assert stats["episodes"] == 4 and stats["success_rate"] == 1.0
    assert stats["invalid_replies"] == 0
    tok = tokenizer()
    (batch,), loader = read_batches(store, TENANT, layout)
    assert loader.stats.snapshot().get("concat_fallbacks", 0) == 0
    for k, trajectory in enumerate(trajectories):
        assert trajectory.header.task["source"] == "expert_demo"
        assert trajectory.outcome.success is True
        commands = [e.action.text for e in trajectory.events if e.kind == "env_step"]
        rows = np.flatnonzero(batch["traj_index"] == k)
        assert len(rows) == (len(commands) if layout == "windowed" else 1)
        replies = []
        for r in rows:
            mask = batch["loss_mask"][r] > 0
            assert not batch["rollout_logp"][r].any()  # no policy log-probs: zeros
            edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
            for start, end in zip(edges[::2], edges[1::2], strict=True):
                replies.append(tok.decode(batch["tokens"][r, start:end]))
        assert replies == [f"<action>{c}</action><|im_end|>" for c in commands]
        for reply, command in zip(replies, commands, strict=True):
            assert parse_reply(reply, think=False).action == command
        last = rows[-1]
        end = np.flatnonzero(batch["loss_mask"][last])[-1]
        assert batch["rewards"][last, end] == 10.0 and batch["rewards"].sum() > 0
        for _, event in trajectory.llm_events():
            assert event.llm.decoding.extra["logprobs"] == "absent"
            assert event.llm.model_id == f"alfworld-expert-{expert}"
            assert event.llm.decoding.extra["policy"] == f"expert-{expert}"
        # The recorded commands win the recorded game, rebuilt from the stored task spec.
        task = trajectory.header.task
        assert set(task) == ALFWORLD_TASK_KEYS and task["env"] == "alfworld"
        env = env_from_task_spec(task)
        assert isinstance(env, AlfworldEnv) and (env.size, env.max_steps) == ("small", 50)
        env.reset(task["index"])
        assert env.game.game_id == task["game_id"]
        assert [env.step(c)[2] for c in commands][-1] and env.engine.won
    assert np.isclose(batch["rewards"].sum(), 10.0 * len(trajectories))


def test_demos_say_which_expert_made_them(tmp_path):
    _, stats, trajectories = collect(tmp_path, num_episodes=2, expert="oracle")
    assert stats["won"] == 2
    for trajectory in trajectories:
        for _, event in trajectory.llm_events():
            assert event.llm.model_id == "alfworld-expert-oracle"
            assert event.llm.decoding.extra["policy"] == "expert-oracle"
    with pytest.raises(ValueError, match=r"EnvConfig\.expert must be one of"):
        env_config(expert="planner")


def test_think_demos_parse_as_valid_think_replies(tmp_path):
    _, stats, trajectories = collect(tmp_path, num_episodes=1, think=True)
    assert stats["won"] == 1
    for _, event in trajectories[0].llm_events():
        reply = tokenizer().decode(event.llm.output_ids, skip_special_tokens=True)
        parsed = parse_reply(reply, think=True)
        assert parsed.valid and parsed.action == event.action.text


def test_bad_arguments_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="num_episodes"):
        collect(tmp_path, num_episodes=0)
    with pytest.raises(ValueError, match="max_new_tokens=4"):
        collect(tmp_path, max_new_tokens=4)
