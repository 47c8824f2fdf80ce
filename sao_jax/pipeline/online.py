"""The online job: warm start, evaluate, learn from live traffic, evaluate (`OnlineJob`).

Warm start, evaluation, checkpoints and the summary are the offline job's (`Job`); only the
online phase differs: instead of the rollout engine, a live server (`OnlineServer`) and an
agent process (`AgentFleet`) produce the ATDP trajectories the learner's stream reads.
Presets and the command line: `experiments.online_sao`.
"""

from __future__ import annotations

import contextlib
import time

from sao_jax.metrics import MetricsWriter, ProgressBar, read_metrics
from sao_jax.pipeline.checkpoints import checkpoint
from sao_jax.pipeline.job import Job
from sao_jax.pipeline.online_agent import AgentConfig
from sao_jax.pipeline.online_config import OnlineConfig
from sao_jax.pipeline.online_serving import AgentFinished, AgentFleet, OnlineServer
from sao_jax.pipeline.seed import SeedJob, hindsight_sft, seed_summary
from sao_jax.pipeline.seed import make_learner as seed_learner
from sao_jax.pipeline.setup import Run
from sao_jax.pipeline.summary import CURVE_KEYS
from sao_jax.rollout import WeightPublisher
from sao_jax.train import Learner, get_algorithm
from sao_jax.train.loop import OnlineTrainer
from serving.worker.config import WorkerConfig

SERVING_CURVE_KEYS = ("serving/requests_per_second", "serving/policy_version")


def agent_config(config: OnlineConfig, url: str) -> AgentConfig:
    """The agent's settings: the run's games, harness prompt, rewards and decoding."""
    rollout, env = config.rollout, config.env
    return AgentConfig(
        url=url,
        env=env.name,
        tenant=config.agent.tenant,
        concurrency=config.agent.concurrency,
        split=env.split,
        size=env.size,
        phrasing=env.phrasing,
        max_steps=env.max_steps,
        seed=env.seed + 1000 * config.seed,
        history_length=rollout.history_length,
        think=rollout.think,
        memory_line=rollout.memory_line,
        prompt_style=rollout.prompt_style,
        win_reward=rollout.win_reward,
        invalid_reply_penalty=rollout.invalid_reply_penalty,
        inadmissible_penalty=rollout.inadmissible_penalty,
        repeat_penalty=rollout.repeat_penalty,
        max_tokens=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        request_timeout_s=config.serving.request_timeout_s,
        max_retries=config.agent.max_retries,
    )


def worker_config(config: OnlineConfig) -> WorkerConfig:
    """The serving worker's batch, context and admission for this run."""
    spec = config.serving
    return WorkerConfig(
        preset=None,
        num_slots=spec.num_slots,
        # the rollout engine's cache size: a prompt + reply that would not fit it is refused
        context_length=config.rollout.max_context_tokens,
        decode_steps=spec.decode_steps,
        max_prefill_batch=spec.max_prefill_batch,
        request_timeout_s=spec.request_timeout_s,
        max_staleness=spec.max_staleness,
        staleness_batch_size=spec.staleness_batch_size,
    )


def online_rl(run: Run, config: OnlineConfig, log: MetricsWriter, learner: Learner) -> dict:
    """Serve the learner's policy, run the agent, train on what the proxy records; returns
    the serving figures."""
    spec = config.online
    start, rl_before = time.perf_counter(), run.seconds["rl"]
    publisher = WeightPublisher()
    publisher.publish(learner.policy_module(copy=False), learner.policy_version)
    server = OnlineServer(
        learner.policy_module(copy=True),
        run.tokenizer,
        buffer=str(run.out / "atdp"),
        worker=worker_config(config),
        model_id=config.serving.model_id,
        policy_version=learner.policy_version,
    )
    fleet: AgentFleet | None = None
    unfollow = None
    loader = run.loader(
        config.agent.tenant,
        rows=spec.rows,
        seq_len=spec.seq_len,
        max_staleness=spec.max_staleness,
        reward_grace_s=spec.reward_grace_s,
        current_version=lambda: learner.policy_version,
    )
    bar = ProgressBar(
        spec.policy_steps,
        desc="online SAO",
        keys=("batch/success_rate", "serving/requests_per_second", "policy/clip_frac"),
        initial=learner.policy_version,
        disable=not config.progress,
    )
    last_checkpoint = learner.policy_version
    served_before = dict(run.rollout_stats)
    try:
        server.start()
        unfollow = server.follow(publisher)
        fleet = AgentFleet(
            agent_config(config, server.url),
            server.admin_key,
            run.out / "agent",
            stop_timeout_s=config.agent.stop_timeout_s,
        )
        trainer = OnlineTrainer(
            learner,
            loader,
            publisher,
            fleet,
            asynchronous=True,
            episodes_per_round=1,
            idle_timeout_s=spec.idle_timeout_s,
        )
        if run.data_state:
            trainer.set_data_state(run.data_state)

        def on_iteration(metrics: dict) -> bool:
            nonlocal last_checkpoint
            run.step += 1
            elapsed = time.perf_counter() - start
            games, figures = fleet.episodes(), server.figures()
            dropped = loader.stats.snapshot().get("dropped_stale_rows", 0)
            run.rollout_stats = _served_stats(served_before, games, figures, dropped)
            metrics.update(
                {
                    "rollout/episodes": run.rollout_stats["episodes"],
                    "rollout/env_steps": run.rollout_stats["env_steps"],
                    "rollout/success_rate": games["won"] / max(games["episodes"], 1),
                    "rollout/dropped_stale": dropped,
                    "serving/requests": figures["completions"],
                    "serving/requests_per_second": figures["completions"] / max(elapsed, 1e-9),
                    "serving/events_recorded": figures["events_recorded"],
                    "serving/policy_version": figures["served_policy_version"],
                }
            )
            log.write(run.step, metrics)
            bar.update(learner.policy_version - bar.n, metrics=metrics)
            if learner.policy_version - last_checkpoint >= config.checkpoint_every:
                run.seconds["rl"] = rl_before + time.perf_counter() - start
                checkpoint(run, learner, trainer, phase="rl")
                last_checkpoint = learner.policy_version
            return bool(spec.max_wall_seconds) and elapsed >= spec.max_wall_seconds

        # AgentFinished: the agent's episode budget ran out first; train no further
        with contextlib.suppress(AgentFinished):
            trainer.run(spec.policy_steps, on_iteration)
        run.data_state = trainer.data_state()
        run.timing = dict(trainer.timing)
    finally:
        bar.close()
        if fleet is not None:
            fleet.stop()
        if unfollow is not None:
            unfollow()
        figures = server.figures()
        server.stop()
    elapsed = time.perf_counter() - start
    run.seconds["rl"] = rl_before + elapsed
    games = fleet.episodes()
    dropped = loader.stats.snapshot().get("dropped_stale_rows", 0)
    run.rollout_stats = _served_stats(served_before, games, figures, dropped)
    checkpoint(run, learner, None, phase="rl_done")
    agent = fleet.final_stats()
    return {
        "requests": int(figures["completions"]),
        "requests_per_second": figures["completions"] / max(elapsed, 1e-9),
        "events_recorded": int(figures["events_recorded"]),
        "rewards_recorded": int(figures["rewards_recorded"]),
        "generated_tokens": int(figures["generated_tokens"]),
        "weight_swaps": int(figures["weight_swaps"]),
        "rejected_429": int(figures["rejected_429"]),
        "served_policy_version": int(figures["served_policy_version"]),
        "dropped_stale": int(dropped),
        "loader": loader.stats.snapshot(),
        "agent_episodes": games["episodes"],
        "agent_success_rate": games["won"] / max(games["episodes"], 1),
        "agent_max_policy_version": agent.get("max_policy_version"),
        "agent_abandoned": agent.get("abandoned"),
        "agent_errors": agent.get("errors"),
        "agent_exit_status": fleet.process.returncode if fleet.process else None,
        "online_seconds": elapsed,
    }


def _served_stats(before: dict, games: dict, figures: dict, dropped: int) -> dict:
    """Counters in `alfworld_run`'s rollout_stats shape (summed over resumed segments)."""
    return {
        "episodes": int(before.get("episodes", 0)) + games["episodes"],
        "env_steps": int(before.get("env_steps", 0)) + games["env_steps"],
        "won": int(before.get("won", 0)) + games["won"],
        "dropped_stale": int(before.get("dropped_stale", 0)) + int(dropped),
        "requests": int(before.get("requests", 0)) + int(figures["completions"]),
    }


class OnlineJob(Job):
    """The job whose RL phase learns from a live server's traffic (`online_rl`); one process.
    With `learner.algorithm=sao_seed` it is SEED's job on served traffic: a `SeedLearner`
    (`sao_jax.pipeline.seed.make_learner`) reads each batch's served episodes back through the
    env's harness, the configured analyzer writes their skills, the OPD term trains; stage 1
    runs after the warm start when `hindsight.sft_steps` > 0; `seed_*` keys in the summary.

    Attributes (besides `Job`'s): online: the `OnlineConfig`; serving: the online phase's
    serving figures (empty until it ran), in the summary as `serving` and `serving_*`.
    """

    multi_process = False
    curve_keys = (*CURVE_KEYS, *SERVING_CURVE_KEYS)

    def __init__(self, config: OnlineConfig):
        self.online, self.serving = config, {}
        self.seed = get_algorithm(config.learner.algorithm).opd
        if self.seed:
            self.curve_keys = (*SeedJob.curve_keys, *SERVING_CURVE_KEYS)
        super().__init__(config.experiment())

    def make_learner(self) -> Learner:
        return seed_learner(self.state) if self.seed else super().make_learner()

    def after_warm_start(self) -> None:
        if self.seed:  # stage-1 counts ride in the evals, as in SeedJob
            self.state.evals["seed_sft"] = hindsight_sft(self.state, self.log)

    def train(self) -> None:
        """The online phase (its first `learner.critic.warmup_steps` iterations train only the
        critic, on served data too)."""
        self.serving = online_rl(self.state, self.online, self.log, self.learner)

    def summarize(self) -> dict:
        summary = super().summarize()
        if self.seed:
            sft = dict(self.state.evals.get("seed_sft") or {})
            summary.update(seed_summary(read_metrics(self.state.out), sft))
        summary["serving"] = self.serving
        summary.update(
            {f"serving_{k}": v for k, v in self.serving.items() if not isinstance(v, dict)}
        )
        return summary


def run(config: OnlineConfig) -> dict:
    """Run (or resume) online SAO (or SAO + SEED); returns the summary also written to
    DIR/summary.json."""
    return OnlineJob(config).run()
