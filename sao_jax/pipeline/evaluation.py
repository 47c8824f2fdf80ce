"""Greedy evaluation of the job's policy on the evaluation splits, at phase ends and during RL.

Each process plays its share of the games and the results are combined on every process; the
figures are logged (`eval/<split>/...`) and kept in `Run.evals[tag]` for the summary.
"""

from __future__ import annotations

import dataclasses
import time

from sao_jax.distributed.host_sync import allgather_json
from sao_jax.metrics import MetricsWriter
from sao_jax.pipeline.setup import Run
from sao_jax.rollout import EvalResult, Sampler, WeightPublisher, evaluate
from sao_jax.train import Learner


def evaluate_policy(
    run: Run, log: MetricsWriter, policy, version: int, tag: str, splits=None
) -> dict:
    """Greedy success on each split (default: `run.eval_splits`; overall and per task type),
    logged at the current step.

    Uses worker 0's sampler, so it must not run while the engine plays (see `PeriodicEval`).
    """
    sampler = run.sampler(0)
    sampler.update_weights(run.local_copy(policy), version)
    return evaluate_with(run, log, sampler, tag, run.eval_splits if splits is None else splits)


def evaluate_with(run: Run, log: MetricsWriter, sampler: Sampler, tag: str, splits) -> dict:
    """Each process plays its share of the games; the results are combined on every process."""
    start = time.perf_counter()
    results = {}
    for split in splits:
        result = evaluate(
            sampler,
            run.tokenizer,
            split=split,
            num_games=run.config.eval.num_games,
            num_envs=run.config.eval.num_envs,
            rollout=run.config.rollout,
            env=run.config.env,
            shard=(run.process, run.processes),
        )
        if run.processes > 1:
            parts = allgather_json(dataclasses.asdict(result))
            result = EvalResult.combine([EvalResult(**part) for part in parts])
        log.write(run.step, result.metrics())
        results[split] = {
            "success": result.success_rate,
            "episodes": result.episodes,
            "avg_steps": result.avg_steps,
            "invalid_reply_rate": result.invalid_reply_rate,
            "inadmissible_rate": result.inadmissible_rate,
            "repeat_rate": result.repeat_rate,
            "by_task_type": {
                t: row["success_rate"] for t, row in result.by_task_type.items() if row["episodes"]
            },
        }
    run.seconds["eval"] += time.perf_counter() - start
    run.evals[tag] = results
    return results


class PeriodicEval:
    """The held-out split (the last of `run.eval_splits`) every `eval.every_policy_steps`
    during RL, on its own sampler (worker 0's is busy playing), with the weights just published
    (already on the rollout mesh)."""

    def __init__(self, run: Run, log: MetricsWriter, publisher: WeightPublisher):
        self.run, self.log, self.publisher = run, log, publisher
        self.every = run.config.eval.every_policy_steps
        self.done: set[int] = set()

    def maybe(self, learner: Learner) -> None:
        version = learner.policy_version
        if not self.every or version % self.every or version in self.done or learner.in_warmup:
            return
        self.done.add(version)
        snapshot = self.publisher.latest()
        sampler = self.run.sampler(-1)
        sampler.update_weights(snapshot.params, snapshot.version)
        heldout = self.run.eval_splits[-1:]
        evaluate_with(self.run, self.log, sampler, f"policy_step_{version}", heldout)
