"""The online job's configuration: the serving worker, the agent process, the learner's side.

`OnlineConfig` is one run of `sao_jax.pipeline.online.run` (presets: `experiments.online_sao`);
its warm start, evaluation and checkpoints are the offline job's (`OnlineConfig.experiment`).
"""

from __future__ import annotations

import dataclasses

from sao_jax.pipeline.config import EvalSpec, ExperimentConfig, ModelSpec, RLSpec, WarmStartSpec
from sao_jax.pipeline.seed import with_seed
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.seed.config import SeedConfig
from sao_jax.train import LearnerConfig, get_algorithm

# a live agent plays each prompt once: the single-rollout algorithms (SAO, SAO + SEED)
ONLINE_ALGORITHMS = ("sao", "sao_seed")


@dataclasses.dataclass
class ServingSpec:
    """The worker serving the policy (`serving.worker.config.WorkerConfig`).

    Attributes:
      num_slots: requests decoded together (KV-cache slots).
      decode_steps: tokens per decode dispatch.
      max_prefill_batch: waiting requests prefilled per dispatch.
      max_staleness: the worker's staleness capacity eta (None: off). While the critic warms
        up the version cannot advance, so a small eta can hold the agent back (429s) until
        the first policy step; the loader's `online.max_staleness` filter applies either way.
      staleness_batch_size: LLM calls the learner consumes per version (with max_staleness).
      request_timeout_s: longest a completion may run.
      model_id: the name the agent passes as `model`.
    """

    num_slots: int = 16
    decode_steps: int = 8
    max_prefill_batch: int = 8
    max_staleness: int | None = None
    staleness_batch_size: int = 64
    request_timeout_s: float = 600.0
    model_id: str = "sao-alfworld-online"

    def __post_init__(self):
        for name in ("num_slots", "decode_steps", "max_prefill_batch", "staleness_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"serving.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"serving.max_staleness must be >= 0, got {self.max_staleness}")


@dataclasses.dataclass
class AgentSpec:
    """The agent process (`sao_jax.pipeline.online_agent`); games and prompts follow `env` and
    `rollout` (layout windowed, `rollout.history_length`, `rollout.max_new_tokens`, ...).

    Attributes:
      tenant: the tenant its sessions belong to (the partition the learner reads).
      concurrency: games it plays at once (one session each).
      max_retries: the openai client's retries (429 / 5xx / connection).
      stop_timeout_s: how long the agent may take to stop before it is killed.
    """

    tenant: str = "online"
    concurrency: int = 8
    max_retries: int = 8
    stop_timeout_s: float = 30.0

    def __post_init__(self):
        if self.concurrency < 1:
            raise ValueError(f"agent.concurrency must be >= 1, got {self.concurrency}")
        if not self.tenant or not self.tenant.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"agent.tenant must be a plain name, got {self.tenant!r}")


@dataclasses.dataclass
class OnlineSpec:
    """The learner's side of the online phase.

    Attributes:
      policy_steps: stop after this many policy updates.
      rows: rows per learner batch (one per LLM call: the windowed layout).
      seq_len: tokens per row (longer calls are dropped, counted).
      max_staleness: keep rows whose oldest token is at most this many versions behind the
        learner (None: keep all).
      idle_timeout_s: a stream idle this long hands over its partial batch.
      max_wall_seconds: also stop the online phase after this long (0: no limit).
      reward_grace_s: hold each closed trajectory back from the learner until it has a late
        reward or this many seconds passed (`LoaderConfig.reward_grace_s`): for agents or
        graders that post rewards after `/rl/end_session` (0: train at close).
    """

    policy_steps: int = 40
    rows: int = 64
    seq_len: int = 256
    max_staleness: int | None = 2
    idle_timeout_s: float = 5.0
    max_wall_seconds: float = 0.0
    reward_grace_s: float = 0.0

    def __post_init__(self):
        if self.policy_steps < 1 or self.rows < 1 or self.seq_len < 2:
            raise ValueError("online.policy_steps and online.rows must be >= 1, seq_len >= 2")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"online.max_staleness must be >= 0, got {self.max_staleness}")


@dataclasses.dataclass
class OnlineConfig:
    """One online SAO (or SAO + SEED) run.

    Attributes:
      out_dir: run directory (default: runs/online_sao/<timestamp>).
      resume: continue the run in out_dir from its latest checkpoint.
      seed: offsets every seed (model init, games, sampling).
      model: the policy (preset + overrides, or a HF checkpoint).
      rollout: prompts, decoding and rewards (the agent's harness; layout must be windowed).
      env: the env whose tasks the agent plays (and evaluation's settings).
      learner: the RL algorithm and its optimisers.
      warm_start: expert demos + behaviour cloning, or `from_run` of an alfworld_sao run.
      serving: the worker.
      agent: the agent process.
      online: the learner's side of the online phase.
      eval: greedy evaluation before and after.
      hindsight: SEED's settings (`learner.algorithm=sao_seed`): the stage-2 analyzer reads
        the served episodes back from the learner's batches (`sao_jax.seed.from_batch`);
        stage 1 (`hindsight.sft_steps` > 0, off by default online) plays with the rollout
        engine after the warm start, before serving.
      checkpoint_every: policy steps between checkpoints.
      checkpoint_keep: checkpoints kept on disk.
      progress: show progress bars.
      tensorboard: also write TensorBoard event files.
    """

    out_dir: str = ""
    resume: bool = False
    seed: int = 0
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    warm_start: WarmStartSpec = dataclasses.field(default_factory=WarmStartSpec)
    serving: ServingSpec = dataclasses.field(default_factory=ServingSpec)
    agent: AgentSpec = dataclasses.field(default_factory=AgentSpec)
    online: OnlineSpec = dataclasses.field(default_factory=OnlineSpec)
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)
    hindsight: SeedConfig = dataclasses.field(default_factory=lambda: SeedConfig(sft_steps=0))
    checkpoint_every: int = 10
    checkpoint_keep: int = 2
    progress: bool = True
    tensorboard: bool = True

    def __post_init__(self):
        if self.rollout.layout != "windowed":
            raise ValueError(
                "rollout.layout must be 'windowed' online: the agent sends each turn's harness "
                f"prompt as a fresh conversation, got {self.rollout.layout!r}"
            )
        if self.learner.algorithm not in ONLINE_ALGORITHMS:
            # group baselines need G plays of one prompt at once; a live agent plays each once
            raise ValueError(
                f"learner.algorithm must be one of {ONLINE_ALGORITHMS} online, got "
                f"{self.learner.algorithm!r}"
            )
        if self.serving.max_staleness is not None:
            # version 0 must serve every warm-up batch and the first policy batch, plus the
            # games in flight, before the first update raises the worker's capacity
            capacity = (self.serving.max_staleness + 1) * self.serving.staleness_batch_size
            needed = self.online.rows * (self.learner.critic.warmup_steps + 1)
            needed += self.agent.concurrency * self.env.max_steps
            if capacity < needed:
                raise ValueError(
                    f"serving.max_staleness: (max_staleness + 1) x staleness_batch_size = "
                    f"{capacity} calls is below the {needed} the learner needs before its first "
                    "update (online.rows x (learner.critic.warmup_steps + 1) + agent.concurrency "
                    "x env.max_steps): the agent would wait on 429s forever"
                )
        if self.rollout.max_new_tokens + 16 > self.online.seq_len:
            raise ValueError("online.seq_len must leave room for a prompt + rollout.max_new_tokens")

    def experiment(self) -> ExperimentConfig:
        """The `alfworld_sao` config whose warm start, evaluation and checkpoints this run
        reuses (its `rl` only shapes DAgger rounds of the warm start); with SEED
        (`sao_seed`) the `alfworld_seed` config with `hindsight`."""
        rl = RLSpec(policy_steps=self.online.policy_steps, max_staleness=self.online.max_staleness
                    or 0, rows=self.online.rows, seq_len=self.online.seq_len)  # fmt: skip
        # fields online has no counterpart for (mesh, atdp_path, ...) keep alfworld_sao's defaults
        ours = {f.name for f in dataclasses.fields(self)}
        fields = ({f.name for f in dataclasses.fields(ExperimentConfig)} & ours) - {"rl"}
        config = ExperimentConfig(rl=rl, **{name: getattr(self, name) for name in fields})
        if get_algorithm(self.learner.algorithm).opd:
            return with_seed(config, self.hindsight)
        return config
