"""The RL phases of a job: critic warm-up on rollouts of the start policy, then online RL.

Online RL: rollout engine -> ATDP (this process's `rollouts` tenant) -> loader stream ->
learner -> `WeightPublisher` -> the engine's samplers; checkpoints every
`checkpoint_every` policy steps carry the stream's position (`checkpoints`), and
`eval.every_policy_steps` evaluates the held-out split on the way (`evaluation.PeriodicEval`).
"""

from __future__ import annotations

import time

from sao_jax.metrics import MetricsWriter, ProgressBar
from sao_jax.pipeline.checkpoints import checkpoint
from sao_jax.pipeline.evaluation import PeriodicEval
from sao_jax.pipeline.setup import ROLLOUTS, WARMUP, Run
from sao_jax.rollout.stats import interval_rates
from sao_jax.train import Learner
from sao_jax.train.loop import OnlineTrainer

# env-seed offset per episode already played, when a resumed RL phase starts (above the
# 100,000 per process of `Run.seed_offset`)
RESUME_SEED_STRIDE = 1 << 20


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
    # A resumed phase draws fresh games: seeded as the first segment was, its env stream
    # would replay that segment's games in order (the sampler's seed stays the run's). The
    # offset of a resume point sits above every process's own (`Run.seed_offset`); a fresh
    # run keeps offset 0.
    engine = run.engine(
        publisher,
        writer,
        asynchronous=rl.asynchronous,
        tenant=ROLLOUTS,
        seed_offset=RESUME_SEED_STRIDE * episodes_before,
    )
    if run.task_replay:  # failures still waiting for a replay when the checkpoint was taken
        engine.restore_task_replay(run.task_replay)
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
    start_temperature = config.rollout.temperature

    def follow_schedule() -> None:  # rl.final_temperature; a resumed phase goes on from its step
        if rl.final_temperature is not None:
            temperature = rl.rollout_temperature(start_temperature, learner.policy_version)
            engine.set_temperature(temperature)

    follow_schedule()
    evaluator = PeriodicEval(run, log, publisher)
    # an env-step budget ends the phase first (compare_algos' equal budgets): count those
    by_env_steps = bool(rl.env_steps)
    bar = ProgressBar(
        rl.env_steps if by_env_steps else rl.policy_steps,
        desc=f"RL ({learner.algorithm.label})",
        keys=("batch/success_rate", "policy/clip_frac", "critic/explained_variance"),
        initial=steps_before if by_env_steps else learner.policy_version,
        unit="env step" if by_env_steps else "step",
        disable=None if config.progress else True,  # None: process 0 only
    )
    last_checkpoint = learner.policy_version
    previous_stats = None  # the stats at the iteration before, for the recent rates

    def on_iteration(metrics: dict) -> bool:
        nonlocal last_checkpoint, previous_stats
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
                "rollout/repeat_rate": stats["repeat_rate"],
                "rollout/replayed_tasks": stats["replayed_tasks"],
                "rollout/temperature": engine.temperature,
            }
        )
        # the cumulative rates above move less and less; these are the episodes finished
        # since the previous iteration (absent when none finished)
        recent = interval_rates(previous_stats, stats)
        metrics.update({f"rollout/recent/{k}": v for k, v in recent.items()})
        previous_stats = stats
        metrics.update({k: v for k, v in stats.items() if k.startswith("loader/")})
        log.write(run.step, metrics)
        done = run.rollout_stats["env_steps"] if by_env_steps else learner.policy_version
        bar.update(min(done, bar.total) - bar.n, metrics=metrics)
        evaluator.maybe(learner)
        follow_schedule()
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
