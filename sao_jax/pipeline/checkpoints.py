"""Checkpoint and resume of a job: the learner, the run's counters and the RL stream's position.

A checkpoint's metadata holds the phase it was taken in, the metrics step, seconds per phase,
evaluations so far, rollout counters and, per process, the loader stream's position and the
task streams' failed-task replay, so a resumed job continues each process's ATDP stream where
it stopped and still replays the games it had failed.
"""

from __future__ import annotations

import time

from sao_jax.distributed.host_sync import allgather_json
from sao_jax.pipeline.setup import Run, scalars
from sao_jax.train import Learner
from sao_jax.train.loop import OnlineTrainer


def checkpoint(run: Run, learner: Learner, trainer: OnlineTrainer | None, *, phase: str) -> None:
    """Learner + run progress; the id is the global step (or the next free id at a phase end)."""
    run.seconds["total"] = run.total_before + time.perf_counter() - run.began
    if trainer is not None:
        # one stream position per process (each reads its own tenant); a collective
        run.data_state = {"by_process": allgather_json(trainer.data_state())}
        replay = getattr(trainer.engine, "task_replay_state", None)  # not a live server's
        if replay is not None:
            run.task_replay = replay()
    # this process's task streams in `run`, every process's in the checkpoint (a collective)
    task_replay = None if run.task_replay is None else allgather_json(run.task_replay)
    metadata = {
        "phase": phase,
        "global_step": run.step,
        "seconds": run.seconds,
        "evals": run.evals,
        "data": run.data_state,
        "task_replay": task_replay,
        "rollout_stats": scalars(run.rollout_stats),
    }
    latest = run.checkpointer.latest_step()
    step = run.step if latest is None or run.step > latest else latest + 1
    learner.save(run.checkpointer, step, metadata=metadata, force=True)


def restore(run: Run, learner: Learner) -> dict | None:
    """The latest checkpoint into `learner` and the run's counters; None when there is none."""
    if run.checkpointer.latest_step() is None:
        return None
    meta = learner.restore(run.checkpointer).metadata
    run.step = int(meta["global_step"])
    run.seconds.update(meta.get("seconds", {}))
    run.total_before = run.seconds["total"]
    run.evals = dict(meta.get("evals", {}))
    run.rollout_stats = dict(meta.get("rollout_stats") or {})
    data = meta.get("data")
    if data is not None:
        positions = data.get("by_process", [data])  # one process before multi-process runs
        if len(positions) != run.processes:
            raise ValueError(
                f"the checkpoint in {run.checkpointer.directory} was written by "
                f"{len(positions)} process(es), this job has {run.processes}: resume it with "
                f"{len(positions)} (each process continues the stream of its own ATDP tenant)"
            )
        data = positions[run.process]
    run.data_state = data
    replay = meta.get("task_replay")  # per process; absent from checkpoints before it
    run.task_replay = replay[run.process] if replay and len(replay) == run.processes else None
    return meta
