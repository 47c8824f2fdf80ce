"""The phases of an ALFWorld RL run (`experiments.alfworld_sao`): build, clone, evaluate, train.

Data flow: every episode (expert demo, critic warm-up rollout, RL rollout) is written to the
run's ATDP store, one tenant per source, and every batch the learner sees comes back through
`atdp_io`'s grain loader. Only weights travel the other way, through a `WeightPublisher`.
"""

from __future__ import annotations

import dataclasses
import time

from atdp_io.trained_on import TrainedOn
from sao_jax.checkpoint import Checkpointer, checkpoint_directory
from sao_jax.distributed.host_sync import allgather_json
from sao_jax.distributed.job import setup_job
from sao_jax.distributed.runtime import DistributedConfig
from sao_jax.metrics import (
    MetricsWriter,
    ProgressBar,
    plot_learning_curves,
    read_metrics,
    save_summary,
    summary_table,
)
from sao_jax.pipeline.config import SPLITS, ExperimentConfig
from sao_jax.pipeline.setup import (
    _SAMPLERS,
    ROLLOUTS,
    WARM_START_DIR,
    WARMUP,
    Run,
    build_model,
    build_tokenizer,
    resolve,
    scalars,
)
from sao_jax.pipeline.warm_start import clone_expert
from sao_jax.rollout import EvalResult, Sampler, WeightPublisher, evaluate
from sao_jax.train import Learner
from sao_jax.train.loop import OnlineTrainer

# the phases, and the run's building blocks (`alfworld_setup`) for the runners built on them
__all__ = [
    "CURVE_KEYS",
    "ROLLOUTS",
    "WARMUP",
    "WARM_START_DIR",
    "_SAMPLERS",
    "Run",
    "budget_left",
    "build_model",
    "build_tokenizer",
    "checkpoint",
    "critic_warmup",
    "evaluate_policy",
    "print_summary",
    "reinforcement_learning",
    "resolve",
    "restore",
    "run",
    "summarize",
    "warm_start",
]

CURVE_KEYS = (
    "batch/success_rate",
    "eval/valid_unseen/success",
    "policy/entropy",
    "policy/clip_frac",
    "policy/grad_norm",
    "critic/explained_variance",
    "batch/staleness_mean",
    "bc/nll",
)


# -- phases ------------------------------------------------------------------------------------


def warm_start(run: Run, log: MetricsWriter) -> None:
    """The cloned policy and its start evaluation, saved to DIR/warm_start (or both taken from
    `warm_start.from_run`)."""
    spec = run.config.warm_start
    if spec.from_run:
        with Checkpointer(
            checkpoint_directory(spec.from_run) / WARM_START_DIR, create=False
        ) as saved:
            restored = saved.restore({"policy": run.policy})
            run.trained_on = TrainedOn(parent=saved.step_path(restored.step))
        run.policy = restored.items["policy"]
        run.evals["start"] = restored.metadata["evals"]["start"]
        if "warm_start" in restored.metadata["evals"]:
            run.evals["warm_start"] = restored.metadata["evals"]["warm_start"]
        return
    clone_expert(run, log)
    evaluate_policy(run, log, run.policy, 0, "start")
    with Checkpointer(run.warm_start_dir, max_to_keep=1, async_save=False) as saved:
        kept = {k: run.evals[k] for k in ("start", "warm_start") if k in run.evals}
        saved.save(0, {"policy": run.policy}, metadata={"evals": kept}, trained_on=run.trained_on)


def evaluate_policy(
    run: Run, log: MetricsWriter, policy, version: int, tag: str, splits=SPLITS
) -> dict:
    """Greedy success on each split (overall and per task type), logged at the current step.

    Uses worker 0's sampler, so it must not run while the engine plays (see `rl_evaluator`).
    """
    sampler = run.sampler(0)
    sampler.update_weights(run.local_copy(policy), version)
    return _evaluate(run, log, sampler, tag, splits)


def _evaluate(run: Run, log: MetricsWriter, sampler: Sampler, tag: str, splits) -> dict:
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
            "by_task_type": {
                t: row["success_rate"] for t, row in result.by_task_type.items() if row["episodes"]
            },
        }
    run.seconds["eval"] += time.perf_counter() - start
    run.evals[tag] = results
    return results


def critic_warmup(run: Run, log: MetricsWriter, learner: Learner, publisher) -> None:
    """Critic-only iterations on rollouts of the starting policy, played synchronously (the
    policy version cannot advance while only the critic trains, so an asynchronous engine's
    admission would stall); with `rl.critic_head_fit` the value head is first set to the
    least-squares fit of those rollouts' Monte-Carlo returns (`Learner.fit_value_head`)."""
    rl, config = run.config.rl, run.config
    if not learner.in_warmup:
        return
    with run.store.writer(run.tenant(WARMUP)) as writer:
        engine = run.engine(publisher, writer, asynchronous=False, tenant=WARMUP, seed_offset=500)
        stats = run.combined_stats(engine.generate(run.share(rl.warmup_episodes)))
    log.write(
        run.step, {"warmup/episodes": stats["episodes"], "warmup/success": stats["success_rate"]}
    )
    loader = run.loader(WARMUP, rows=rl.rows, seq_len=rl.seq_len)
    if rl.critic_head_fit:
        fit = learner.fit_value_head(loader.epoch(seed=config.seed, num_epochs=1))
        log.write(run.step, fit)
    batches = iter(loader.epoch(seed=config.seed, num_epochs=None))
    while learner.in_warmup:
        metrics = learner.iteration(next(batches))
        run.step += 1
        log.write(run.step, metrics)


def checkpoint(run: Run, learner: Learner, trainer: OnlineTrainer | None, *, phase: str) -> None:
    """Learner + run progress; the id is the global step (or the next free id at a phase end)."""
    run.seconds["total"] = run.total_before + time.perf_counter() - run.began
    if trainer is not None:
        # one stream position per process (each reads its own tenant); a collective
        run.data_state = {"by_process": allgather_json(trainer.data_state())}
    metadata = {
        "phase": phase,
        "global_step": run.step,
        "seconds": run.seconds,
        "evals": run.evals,
        "data": run.data_state,
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
    return meta


def budget_left(run: Run, learner: Learner) -> bool:
    """Whether RL has policy steps (and environment steps) left to take."""
    rl = run.config.rl
    env_steps = int(run.rollout_stats.get("env_steps", 0))
    return learner.policy_version < rl.policy_steps and not (
        rl.env_steps and env_steps >= rl.env_steps
    )


def reinforcement_learning(
    run: Run, log: MetricsWriter, learner: Learner, publisher, data_state: dict | None
) -> None:
    """The online phase: engine -> ATDP -> loader stream -> learner -> publisher."""
    config, rl = run.config, run.config.rl
    start, rl_before = time.perf_counter(), run.seconds["rl"]
    steps_before = int(run.rollout_stats.get("env_steps", 0))
    episodes_before = int(run.rollout_stats.get("episodes", 0))
    writer = run.store.writer(run.tenant(ROLLOUTS))
    retention = run.purge_schedule(ROLLOUTS)  # purges through `writer`
    engine = run.engine(
        publisher, writer, asynchronous=rl.asynchronous, tenant=ROLLOUTS, seed_offset=0
    )
    loader = run.loader(
        ROLLOUTS,
        rows=rl.rows,
        seq_len=rl.seq_len,
        max_staleness=rl.max_staleness,
        max_trajectories=run.share(rl.batch_episodes) if rl.batch_episodes else None,
        current_version=lambda: learner.policy_version,
    )
    trainer = OnlineTrainer(
        learner,
        loader,
        publisher,
        engine,
        asynchronous=rl.asynchronous,
        episodes_per_round=run.episodes_per_version,
        idle_timeout_s=rl.idle_timeout_s,
    )
    if data_state:
        trainer.set_data_state(data_state)
    evaluator = _PeriodicEval(run, log, publisher)
    bar = ProgressBar(
        rl.policy_steps,
        desc=f"RL ({learner.algorithm.label})",
        keys=("batch/success_rate", "policy/clip_frac", "critic/explained_variance"),
        initial=learner.policy_version,
        disable=None if config.progress else True,  # None: process 0 only
    )
    last_checkpoint = learner.policy_version

    def on_iteration(metrics: dict) -> bool:
        nonlocal last_checkpoint
        run.step += 1
        # what the loader passed over (too long, stale, ...): counted with the engine's
        # stats in one exchange on several processes
        read = {f"loader/{k}": v for k, v in loader.stats.snapshot().items()}
        stats = run.combined_stats(engine.stats() | read)
        run.rollout_stats = dict(
            stats,
            env_steps=steps_before + stats["env_steps"],
            episodes=episodes_before + stats["episodes"],
        )
        metrics.update(
            {
                "rollout/episodes": run.rollout_stats["episodes"],
                "rollout/env_steps": run.rollout_stats["env_steps"],
                "rollout/success_rate": stats["success_rate"],
                "rollout/dropped_stale": stats["dropped_stale"],
                "rollout/invalid_reply_rate": stats["invalid_reply_rate"],
                "rollout/inadmissible_rate": stats["inadmissible_rate"],
            }
        )
        metrics.update({k: v for k, v in stats.items() if k.startswith("loader/")})
        log.write(run.step, metrics)
        bar.update(learner.policy_version - bar.n, metrics=metrics)
        evaluator.maybe(learner)
        if learner.policy_version - last_checkpoint >= config.checkpoint_every:
            run.seconds["rl"] = rl_before + time.perf_counter() - start
            checkpoint(run, learner, trainer, phase="rl")
            last_checkpoint = learner.policy_version
        return bool(rl.env_steps) and run.rollout_stats["env_steps"] >= rl.env_steps

    try:
        trainer.run(rl.policy_steps, on_iteration)
    finally:
        bar.close()
        if retention is not None:
            retention.stop()
        writer.close()
    run.seconds["rl"] = rl_before + time.perf_counter() - start
    run.timing = dict(trainer.timing)
    checkpoint(run, learner, trainer, phase="rl_done")


class _PeriodicEval:
    """valid_unseen every `eval.every_policy_steps` during RL, on its own sampler (worker 0's
    is busy playing), with the weights just published (already on the rollout mesh)."""

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
        _evaluate(self.run, self.log, sampler, f"policy_step_{version}", ("valid_unseen",))


def summarize(run: Run, learner: Learner) -> dict:
    """summary.json: success before / after RL (overall, per task type), budget, timings."""
    start, end = run.evals.get("start", {}), run.evals.get("end", {})
    stats = run.rollout_stats

    def success(tag: dict, split: str):
        return tag.get(split, {}).get("success")

    return {
        "algorithm": learner.algorithm.name,
        "asynchronous": run.config.rl.asynchronous,
        "seed": run.config.seed,
        "unseen_success_start": success(start, "valid_unseen"),
        "unseen_success_end": success(end, "valid_unseen"),
        "seen_success_start": success(start, "valid_seen"),
        "seen_success_end": success(end, "valid_seen"),
        "policy_steps": learner.policy_version,
        "critic_steps": learner.counters.critic_steps,
        "skipped_policy_steps": learner.counters.skipped_policy_steps,
        "rl_episodes": stats.get("episodes", 0),
        "rl_env_steps": stats.get("env_steps", 0),
        "rl_dropped_stale": stats.get("dropped_stale", 0),
        "rl_dropped_too_long": stats.get("loader/dropped_too_long", 0),
        "bc_seconds": run.seconds["bc"],
        "eval_seconds": run.seconds["eval"],
        "rl_seconds": run.seconds["rl"],
        "wall_seconds": run.seconds["total"],
        "by_task_type": {
            f"{split}_{tag}": run.evals.get(tag, {}).get(split, {}).get("by_task_type", {})
            for tag in ("start", "end")
            for split in SPLITS
        },
        "rl_timing": run.timing,
        "warm_start": run.evals.get("warm_start", {}),
    }


def print_summary(summary: dict) -> None:
    """Success per split and task type before / after RL, then the run's scalars."""
    rows = []
    for split, name in (("valid_seen", "seen"), ("valid_unseen", "unseen")):
        before = summary["by_task_type"].get(f"{split}_start", {})
        after = summary["by_task_type"].get(f"{split}_end", {})
        rows.append(
            {
                "split": split,
                "task type": "all",
                "start": summary[f"{name}_success_start"],
                "end": summary[f"{name}_success_end"],
            }
        )
        for task_type in sorted(set(before) | set(after)):
            rows.append(
                {
                    "split": split,
                    "task type": task_type,
                    "start": before.get(task_type),
                    "end": after.get(task_type),
                }
            )
    print(summary_table(rows, floatfmt=".3f"))
    if summary.get("warm_start"):  # the cloned start: its expert, epochs, held-out imitation
        print(summary_table({f"warm start: {k}": v for k, v in summary["warm_start"].items()}))
    print(summary_table({k: v for k, v in summary.items() if not isinstance(v, dict)}))


def run(config: ExperimentConfig, *, distributed: DistributedConfig | None = None) -> dict:
    """Run (or resume) the experiment; returns the summary also written to DIR/summary.json.

    `distributed` (default: the environment) joins a multi-process job; only process 0 writes
    metrics, the summary and the curve, and prints."""
    state = Run(config, setup_job(config.mesh, distributed), multi_process=True)
    learner = Learner(state.config.learner, state.policy, mesh=state.mesh)
    meta = restore(state, learner) if config.resume else None
    with MetricsWriter(
        state.out,
        tensorboard=config.tensorboard,
        # a resume without a checkpoint starts over: drop the records of the earlier attempt
        resume_from_step=state.step if config.resume else None,
    ) as log:
        if meta is None:
            warm_start(state, log)
            learner = Learner(state.config.learner, state.policy, mesh=state.mesh)
            learner.trained_on = state.trained_on  # its first checkpoint's parent: the warm start
        elif meta["phase"] != "rl" and budget_left(state, learner):
            meta["phase"] = "rl"  # a finished run resumed with a larger budget
            state.evals.pop("end", None)
        if meta is None or meta["phase"] == "rl":
            publisher = state.publisher()
            publisher.publish(learner.policy_module(copy=False), learner.policy_version)
            if meta is None:
                critic_warmup(state, log, learner, publisher)
                checkpoint(state, learner, None, phase="rl")
            reinforcement_learning(state, log, learner, publisher, state.data_state)
        if "end" not in state.evals:
            evaluate_policy(state, log, learner.policy_module(), learner.policy_version, "end")
        checkpoint(state, learner, None, phase="done")
    state.checkpointer.wait_until_finished()
    state.checkpointer.close()
    summary = summarize(state, learner)
    save_summary(state.out, summary)
    if state.job.is_primary:  # metrics.jsonl exists on process 0 only
        records = read_metrics(state.out)
        keys = [k for k in CURVE_KEYS if any(isinstance(r.get(k), int | float) for r in records)]
        curve = state.out / "learning_curve.png"
        plot_learning_curves(records, curve, keys=keys, title=str(state.out))
        print_summary(summary)
    return summary
