"""Layouts (concat / windowed), reward placement and fixed-shape batch packing."""

import dataclasses

import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory, env_event, llm_event

from atdp_io import Event, EventKind, LateReward, ReplayClass, Reward
from atdp_io.rows import LayoutError, pack_batch, reward_per_call, trajectory_rows


def _turns(traj):
    return [e.llm for _, e in traj.llm_events()]


def test_concat_places_every_call_where_it_was_generated():
    traj = agent_trajectory("t", turns=3, prompt_len=6, obs_len=2, out_len=3, final_reward=1.0)
    (row,), fell_back = trajectory_rows(traj, "concat")
    assert not fell_back and row.turn_index == 0
    calls = _turns(traj)
    np.testing.assert_array_equal(row.tokens, calls[-1].context_ids)
    expected_mask = np.zeros(row.length, np.int32)
    for call in calls:
        start = call.input_ids.shape[0]
        end = start + call.output_ids.shape[0]
        expected_mask[start:end] = 1
        np.testing.assert_array_equal(row.rollout_logp[start:end], call.output_logprobs)
        np.testing.assert_array_equal(row.versions[start:end], call.output_versions)
    np.testing.assert_array_equal(row.loss_mask, expected_mask)
    assert not row.rollout_logp[expected_mask == 0].any()
    assert (row.versions[expected_mask == 0] == -1).all()
    # The env step after the last call carried the reward: it lands on that call's last token.
    last_output_token = calls[-1].input_ids.shape[0] + calls[-1].output_ids.shape[0] - 1
    assert np.flatnonzero(row.rewards).tolist() == [last_output_token]
    assert row.rewards[last_output_token] == 1.0


def test_windowed_is_one_row_per_call():
    traj = agent_trajectory("t", turns=3, concat=False)
    rows, fell_back = trajectory_rows(traj, "windowed")
    assert not fell_back and [r.turn_index for r in rows] == [0, 1, 2]
    for row, call in zip(rows, _turns(traj), strict=True):
        np.testing.assert_array_equal(row.tokens, call.context_ids)
        assert row.loss_mask.sum() == call.output_ids.shape[0]
        assert row.loss_mask[: call.input_ids.shape[0]].sum() == 0


def test_concat_on_a_non_extending_trajectory_falls_back_or_errors():
    traj = agent_trajectory("rebuilt", turns=2, concat=False)
    rows, fell_back = trajectory_rows(traj, "concat")
    assert fell_back and len(rows) == 2
    with pytest.raises(LayoutError, match=r"'rebuilt'.*does not extend"):
        trajectory_rows(traj, "concat", concat_fallback="error")


def test_rewards_go_to_the_nearest_preceding_call_including_late_ones():
    traj = agent_trajectory("t", turns=3, final_reward=0.0)
    # events: 0 llm, 1 env, 2 llm, 3 env, 4 llm, 5 env
    message = Event(EventKind.MESSAGE, ReplayClass.NON_REPLAYABLE, rewards=(Reward(9.0, "x"),))
    traj = dataclasses.replace(
        traj,
        events=(message, *traj.events),  # a reward before any call is dropped
        annotations=(
            LateReward("t", 2, Reward(0.5, "user"), NOW),  # env step after call 1 -> call 1
            LateReward("t", None, Reward(2.0, "tests"), NOW),  # whole trajectory -> last call
            LateReward("t", 3, Reward(1.0, "user"), NOW),  # a call itself
        ),
    )
    assert reward_per_call(traj) == {1: 0.5, 3: 1.0, 5: 2.0}
    assert reward_per_call(traj, {"user": 2.0}) == {1: 1.0, 3: 2.0, 5: 0.0}
    rows, _ = trajectory_rows(traj, "windowed")
    assert [float(r.rewards.sum()) for r in rows] == [0.5, 1.0, 2.0]
    assert all(r.rewards[-1] == r.rewards.sum() for r in rows)


def test_masked_outputs_and_interrupted_generations_keep_their_token_versions():
    call = llm_event([3, 4, 5], [6, 7, 8], version=4)
    llm = dataclasses.replace(call.llm, output_versions=[4, 4, 5], loss_mask=[1, 0, 1])
    traj = dataclasses.replace(
        agent_trajectory("t", turns=1),
        events=(dataclasses.replace(call, llm=llm), env_event("o", "c", 1.0)),
    )
    (row,), _ = trajectory_rows(traj, "concat")
    np.testing.assert_array_equal(row.loss_mask, [0, 0, 0, 1, 0, 1])
    assert row.rollout_logp[4] == 0.0
    assert row.min_version() == 4 and row.versions[5] == 5


def test_pack_batch_pads_to_a_static_shape():
    traj = agent_trajectory("t", turns=2, concat=False, prompt_len=5, out_len=2)
    rows, _ = trajectory_rows(traj, "windowed")
    (single,), _ = trajectory_rows(
        agent_trajectory("u", turns=1, prompt_len=4, out_len=2), "concat"
    )
    batch = pack_batch([rows, [single]], rows=4, seq_len=8, pad_id=0)
    assert {k: v.shape for k, v in batch.items()} == {
        **{k: (4, 8) for k in ("tokens", "loss_mask", "rollout_logp", "rewards", "versions")},
        "positions": (4, 8),
        "segment_ids": (4, 8),
        "traj_index": (4,),
        "turn_index": (4,),
    }
    assert batch["traj_index"].tolist() == [0, 0, 1, -1]
    assert batch["turn_index"].tolist() == [0, 1, 0, -1]
    assert batch["segment_ids"].sum(1).tolist() == [7, 7, 6, 0]
    assert batch["positions"][2].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    assert batch["tokens"][3].tolist() == [0] * 8 and (batch["versions"][3] == -1).all()
    with pytest.raises(ValueError, match="do not fit"):
        pack_batch([rows, rows, [single]], rows=4, seq_len=8)
    with pytest.raises(ValueError, match="exceeds seq_len"):
        pack_batch([rows], rows=4, seq_len=6)
