"""A training job from a config: warm start -> critic warm-up -> RL -> evaluation -> summary.

    from sao_jax.pipeline import run
    summary = run(config)                 # or: Job(config).run()

Every episode (expert demo, critic warm-up rollout, RL rollout) is written to the run's ATDP
store, one tenant per source, and every batch the learner sees comes back through `atdp_io`'s
grain loader; only weights travel the other way, through a `WeightPublisher`. Outputs in
`config.out_dir`: metrics.jsonl (+ tensorboard/), checkpoints/, warm_start/, atdp/,
learning_curve.png, summary.json. `config.resume` continues the run there from its latest
checkpoint (the RL stream where it stopped). On several processes (`distributed`) each
process plays and reads its own ATDP tenant; only process 0 writes metrics, the curve and
prints.
"""

from __future__ import annotations

from sao_jax.distributed.job import setup_job
from sao_jax.distributed.runtime import DistributedConfig
from sao_jax.metrics import MetricsWriter
from sao_jax.pipeline.checkpoints import checkpoint, restore
from sao_jax.pipeline.config import ExperimentConfig
from sao_jax.pipeline.evaluation import evaluate_policy
from sao_jax.pipeline.rl import budget_left, critic_warmup, reinforcement_learning
from sao_jax.pipeline.setup import Run
from sao_jax.pipeline.summary import CURVE_KEYS, summarize, write_outputs
from sao_jax.pipeline.warm_start import ExtraDemos, warm_start
from sao_jax.train import Learner


class Job:
    """One run of `config`, phase by phase; `run()` does them all (what `run(config)` does).

    Not `sao_jax.distributed.Job` (the processes and mesh a run joined: `state.job`).
    A job with more phases subclasses it (`sao_jax.pipeline.seed.SeedJob`): `make_learner`,
    `after_warm_start`, `summarize` and `curve_keys` are its hooks.

    Attributes:
      state: the `Run` the phases share (config resolved, tokenizer, policy, store, counters).
      learner: the RL learner (replaced after the warm start, built on the cloned policy).
      resumed: the metadata of the checkpoint the job resumed from (None: a fresh start).
      log: the metrics writer (DIR/metrics.jsonl, tensorboard).
    """

    multi_process = True  # whether the job runs on several processes
    curve_keys: tuple[str, ...] = CURVE_KEYS  # what learning_curve.png plots (those logged)

    def __init__(self, config: ExperimentConfig, *, distributed: DistributedConfig | None = None):
        # joins a multi-process job (`distributed`, default: the environment) first
        job = setup_job(config.mesh, distributed)
        self.state = Run(config, job, multi_process=self.multi_process)
        self.learner = self.make_learner()
        self.resumed = restore(self.state, self.learner) if config.resume else None
        self.log = MetricsWriter(
            self.state.out,
            tensorboard=config.tensorboard,
            # a resume without a checkpoint starts over: drop the records of the earlier attempt
            resume_from_step=self.state.step if config.resume else None,
        )

    def make_learner(self) -> Learner:
        """The RL learner on the current policy (`state.policy`)."""
        return Learner(self.state.config.learner, self.state.policy, mesh=self.state.mesh)

    def warm_start(self) -> None:
        """Demonstrations -> behaviour cloning (+ DAgger) -> start evaluation
        (`after_warm_start` next); the learner is rebuilt on the resulting policy."""
        state = self.state
        warm_start(state, self.log, extra=self.extra_demos())
        self.after_warm_start()
        self.learner = self.make_learner()
        self.learner.trained_on = state.trained_on  # its first checkpoint's parent

    def extra_demos(self) -> ExtraDemos | None:
        """Derived demonstrations a subclass clones beside the expert's (None: none)."""
        return None

    def after_warm_start(self) -> None:
        """A subclass's phase between the warm start and RL (it may replace `state.policy`)."""

    def summarize(self) -> dict:
        """summary.json's content (`summary.summarize`)."""
        return summarize(self.state, self.learner)

    def train(self) -> None:
        """Critic warm-up (on a fresh start), then RL until the budget is spent."""
        state, learner = self.state, self.learner
        publisher = state.publisher()
        publisher.publish(learner.policy_module(copy=False), learner.policy_version)
        if self.resumed is None:
            critic_warmup(state, self.log, learner, publisher)
            checkpoint(state, learner, None, phase="rl")
        reinforcement_learning(state, self.log, learner, publisher, state.data_state)

    def evaluate(self, tag: str) -> dict:
        """Greedy success of the current policy on the evaluation splits, kept as `tag`."""
        learner = self.learner
        return evaluate_policy(
            self.state, self.log, learner.policy_module(), learner.policy_version, tag
        )

    def finish(self) -> dict:
        """The final checkpoint, summary.json, learning curve and table; returns the summary."""
        checkpoint(self.state, self.learner, None, phase="done")
        self.log.close()
        self.state.checkpointer.wait_until_finished()
        self.state.checkpointer.close()
        summary = self.summarize()
        write_outputs(self.state, summary, self.curve_keys)
        return summary

    def run(self) -> dict:
        """Every phase a fresh or resumed run still has; returns the summary."""
        meta = self.resumed
        try:
            if meta is None:
                self.warm_start()
            elif meta["phase"] != "rl" and budget_left(self.state, self.learner):
                meta["phase"] = "rl"  # a finished run resumed with a larger budget
                self.state.evals.pop("end", None)
            if meta is None or meta["phase"] == "rl":
                self.train()
            if "end" not in self.state.evals:
                self.evaluate("end")
        except BaseException:
            self.log.close()
            raise
        return self.finish()


def run(config: ExperimentConfig, *, distributed: DistributedConfig | None = None) -> dict:
    """Run (or resume) the job of `config`; returns the summary also written to summary.json."""
    return Job(config, distributed=distributed).run()
