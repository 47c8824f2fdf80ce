"""Episodes as the analyzers read them: from ATDP trajectories and from learner batches."""

import numpy as np
import pytest
from seed_factories import demo_store, demo_trajectories, first_batch, word_tokenizer

from sao_jax.envs.alfworld import make_game
from sao_jax.seed import EpisodeRecord, from_batch, from_trajectory


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return demo_store(tmp_path_factory.mktemp("records"), num_episodes=3)


def test_from_trajectory_reads_task_actions_outcome_and_game(store):
    for trajectory in demo_trajectories(store):
        record = from_trajectory(trajectory)
        spec = trajectory.header.task
        game = make_game(spec["split"], spec["index"], size=spec["size"])
        assert record.task == game.task.sentence
        assert record.task_type == game.task.task_type
        calls = trajectory.llm_events()
        assert record.actions == tuple(e.action.text for _, e in calls)
        assert record.success == bool(trajectory.outcome.success)
        assert record.game["index"] == spec["index"]


@pytest.mark.parametrize("layout", ["windowed", "concat"])
def test_from_batch_decodes_each_trajectory_back(store, layout):
    batch = first_batch(store, layout=layout)
    records = from_batch(batch, word_tokenizer())
    by_task = {}
    for trajectory in demo_trajectories(store):
        record = from_trajectory(trajectory)
        by_task.setdefault(record.task, []).append(record)
    slots = np.unique(batch["traj_index"][batch["traj_index"] >= 0])
    assert sorted(records) == list(slots)
    for record in records.values():
        expected = by_task[record.task]  # the task sentence came back from the prompt
        assert any(e.actions == record.actions for e in expected)
        assert record.task_type == expected[0].task_type != ""
        assert any(e.success == record.success for e in expected)
        assert len(record.observations) == len(record.actions)


def test_empty_episode_is_rejected_naming_it():
    with pytest.raises(ValueError, match=r"ep-7.*no actions"):
        EpisodeRecord("ep-7", "put a mug in cabinet", "", (), (), False)
    with pytest.raises(ValueError, match="no task"):
        EpisodeRecord("ep-8", "", "", ("look",), (), False)
