"""The RL job's retention hook: `Run.purge_schedule` purges this process's rollout partition
every `atdp_purge_every_s` seconds through the writer the engine appends with."""

import dataclasses
import time

import pytest

from atdp_io import (
    Action,
    ActionKind,
    Event,
    EventKind,
    Governance,
    Outcome,
    ReplayClass,
    Trajectory,
    TrajectoryHeader,
)
from experiments import alfworld_sao
from sao_jax.pipeline.setup import ROLLOUTS, Run


def _episode(tenant: str, trajectory_id: str, expires_at: float | None) -> Trajectory:
    step = Event(
        kind=EventKind.ENV_STEP,
        replay=ReplayClass.APPROXIMATE,
        observation="You are in the middle of a room.",
        action=Action(ActionKind.COMMAND, text="look"),
    )
    header = TrajectoryHeader(
        trajectory_id=trajectory_id,
        governance=Governance.synthetic(tenant, expires_at=expires_at),
        created_at=time.time(),
    )
    return Trajectory(header=header, events=(step,), outcome=Outcome(success=False))


def _config(tmp_path, every_s):
    return dataclasses.replace(
        alfworld_sao.micro(), out_dir=str(tmp_path), atdp_purge_every_s=every_s, progress=False
    )


def test_the_rl_phase_purges_expired_rollouts_through_its_live_writer(tmp_path):
    run = Run(_config(tmp_path, 0.05))
    tenant = run.tenant(ROLLOUTS)
    writer = run.store.writer(tenant)  # as reinforcement_learning holds it for the engine
    try:
        writer.append(
            [_episode(tenant, "stale", time.time() + 0.3), _episode(tenant, "kept", None)]
        )
        schedule = run.purge_schedule(ROLLOUTS)
        try:
            deadline = time.monotonic() + 30
            while schedule.stats["purged"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            schedule.stop()
        assert schedule.stats["purged"] == 1 and schedule.stats["errors"] == 0
        writer.append([_episode(tenant, "after", None)])  # the engine's writer still works
    finally:
        writer.close()
    reader = run.store.reader(tenant, principal=tenant)
    reader.refresh()
    assert reader.trajectory_ids() == ["kept", "after"]
    run.config = dataclasses.replace(run.config, atdp_purge_every_s=0.0)
    assert run.purge_schedule(ROLLOUTS) is None  # 0 turns it off


def test_a_negative_purge_interval_is_refused_before_the_run_starts(tmp_path):
    with pytest.raises(ValueError, match="atdp_purge_every_s must be >= 0 seconds"):
        Run(_config(tmp_path, -1.0))
