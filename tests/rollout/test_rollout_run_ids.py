"""Run ids are checked against the ATDP writer's redactor when a rollout object is built: an id
the writer would refuse or rewrite fails at construction, naming the id, and nothing is written;
an opaque id is stored exactly as given."""

import re

import pytest
from rollout_testlib import env_config, model, open_store, rollout_config, sampler, tokenizer

from atdp_io import Governance, Outcome, SchemaError, Trajectory, TrajectoryHeader
from sao_jax.rollout import AgentLoop, EngineConfig, RolloutEngine, WeightPublisher
from sao_jax.rollout import collect_expert_demos as collect_demos
from sao_jax.rollout.run_ids import (
    MAX_GROUPS,
    check_run_id,
    demo_episode_id,
    rollout_episode_id,
)

TENANT = "alfworld"
PHONE = "555-123-4567"
# run id -> (detector, the id whose redaction is reported)
REFUSED = {
    PHONE: ("phone", PHONE),
    "4111111111111111": ("credit_card", "4111111111111111"),
    "ops@example.com": ("email", "ops@example.com"),
    # clean by itself: only a long episode id is long enough to read as an API key
    "sk-abcd": ("api_key", rollout_episode_id("sk-abcd", 0, MAX_GROUPS, 0)),
}
ACCEPTED = ["tdemo", "r2024-s555-1234", "alfworld-s0-o1-r0123abcd", "eval-valid_unseen"]


def stored_ids(store, tenant=TENANT):
    reader = store.reader(tenant, principal=tenant)
    reader.refresh()
    return list(reader.trajectory_ids())


def bare_trajectory(trajectory_id):
    governance = Governance.synthetic(TENANT, expires_at=None)
    header = TrajectoryHeader(trajectory_id=trajectory_id, governance=governance, created_at=1.8e9)
    return Trajectory(header, (), Outcome(success=False))


@pytest.mark.parametrize("run_id", sorted(REFUSED))
def test_check_refuses_exactly_what_the_writer_refuses(tmp_path, run_id):
    detector, culprit = REFUSED[run_id]
    shortest, longest = (rollout_episode_id(run_id, 0, g, 0) for g in (0, MAX_GROUPS))
    with pytest.raises(ValueError, match=re.escape(f"run_id {run_id!r}") + f".*{detector}") as err:
        check_run_id(run_id, (shortest, longest), owner="test")
    if culprit != run_id:
        assert f"derived id '{culprit}'" in str(err.value)
    # the real write path: the store's default writer refuses that trajectory id
    with open_store(tmp_path).writer(TENANT) as writer:
        with pytest.raises(SchemaError, match="trajectory_id"):
            writer.append([bare_trajectory(culprit)])
        for ok in ACCEPTED:
            writer.append([bare_trajectory(rollout_episode_id(ok, 0, MAX_GROUPS, 0))])


def test_check_refuses_non_string_and_empty_ids():
    with pytest.raises(TypeError, match="run_id must be a str, got int"):
        check_run_id(5551234567, (), owner="test")
    with pytest.raises(ValueError, match="non-empty"):
        check_run_id("", (), owner="test")


def test_agent_loop_refuses_a_phone_like_run_id_at_construction():
    envs = env_config().make_envs(1)
    for run_id, (detector, _) in REFUSED.items():
        message = re.escape(f"AgentLoop: run_id {run_id!r}") + f".*{detector}"
        with pytest.raises(ValueError, match=message):
            AgentLoop(sampler(), tokenizer(), envs, rollout_config(), run_id=run_id)
    for run_id in ACCEPTED:
        loop = AgentLoop(sampler(), tokenizer(), envs, rollout_config(), run_id=run_id)
        assert loop.run_id == run_id
    assert AgentLoop(sampler(), tokenizer(), envs, rollout_config()).run_id  # random default


def test_engine_refuses_a_phone_like_run_id_before_playing(tmp_path):
    store = open_store(tmp_path)
    refused = pytest.raises(ValueError, match=f"run_id '{PHONE}'.*phone")
    with store.writer(TENANT) as writer, refused:
        RolloutEngine(
            model(),
            tokenizer(),
            writer,
            WeightPublisher(),
            rollout=rollout_config(),
            env=env_config(),
            config=EngineConfig(envs_per_worker=1, asynchronous=False),
            samplers=[sampler()],
            run_id=PHONE,
        )
    assert stored_ids(store) == []


def demos(store, run_id, num_episodes=2):
    with store.writer(TENANT) as writer:
        collect_demos(
            writer,
            tokenizer(),
            num_episodes=num_episodes,
            rollout=rollout_config(),
            env=env_config(),
            run_id=run_id,
        )


def test_expert_demos_refuse_a_phone_like_run_id_before_writing(tmp_path):
    store = open_store(tmp_path)
    with pytest.raises(ValueError, match=f"collect_expert_demos: run_id '{PHONE}'.*phone"):
        demos(store, PHONE)
    assert stored_ids(store) == []
    demos(store, "r2024-s555-1234")
    assert sorted(stored_ids(store)) == [demo_episode_id("r2024-s555-1234", e) for e in (0, 1)]
