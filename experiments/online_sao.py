"""Online SAO from live traffic: an agent uses the policy through an OpenAI endpoint, SAO learns.

    python -m experiments.online_sao --out runs/online warm_start.from_run=runs/alfworld_sao/X
    python -m experiments.online_sao --config micro --out /tmp/online      # seconds: smoke test
    python -m experiments.online_sao --out runs/online --resume online.policy_steps=60

Phases: warm start (behaviour cloning on expert demos, or `warm_start.from_run` of an
`alfworld_sao` run) -> greedy evaluation -> online RL -> greedy evaluation. Online RL: the
policy is served by `serving` (gateway, router, data proxy, worker in this process, on a
loopback port); an ALFWorld agent in a separate process (`experiments.online_agent`) plays
through the official `openai` client and posts rewards on `/rl`; the data proxy records every
call into `DIR/atdp` (tenant `agent.tenant`); the SAO learner reads that live buffer with the
ATDP loader's stream (staleness filtered by policy version) and publishes each update, which
the worker swaps in (`worker.follow(publisher)`). The first `learner.critic.warmup_steps`
iterations train only the critic, on served data too. Outputs as `alfworld_sao`, plus
`DIR/agent/` (episodes.jsonl, stats.json, stderr.log) and serving figures in summary.json.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from pathlib import Path

from experiments import alfworld_sao
from experiments.alfworld_sao import EvalSpec, ExperimentConfig, ModelSpec, RLSpec, WarmStartSpec
from sao_jax.config_cli import parse_cli
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.train import LearnerConfig


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
    """The agent process (`experiments.online_agent`); games and prompts follow `env` and
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
    """One online SAO run.

    Attributes:
      out_dir: run directory (default: runs/online_sao/<timestamp>).
      resume: continue the run in out_dir from its latest checkpoint.
      seed: offsets every seed (model init, games, sampling).
      model: the policy (preset + overrides, or a HF checkpoint).
      rollout: prompts, decoding and rewards (the agent's harness; layout must be windowed).
      env: the ALFWorld games the agent plays (and evaluation's settings).
      learner: the RL algorithm and its optimisers.
      warm_start: expert demos + behaviour cloning, or `from_run` of an alfworld_sao run.
      serving: the worker.
      agent: the agent process.
      online: the learner's side of the online phase.
      eval: greedy evaluation before and after.
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
        if self.learner.algorithm != "sao":
            # group baselines need G plays of one prompt at once; a live agent plays each once
            raise ValueError(
                f"learner.algorithm must be 'sao' online, got {self.learner.algorithm!r}"
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
        reuses (its `rl` only shapes DAgger rounds of the warm start)."""
        rl = RLSpec(policy_steps=self.online.policy_steps, max_staleness=self.online.max_staleness
                    or 0, rows=self.online.rows, seq_len=self.online.seq_len)  # fmt: skip
        # fields online has no counterpart for (mesh, atdp_path, ...) keep alfworld_sao's defaults
        ours = {f.name for f in dataclasses.fields(self)}
        fields = ({f.name for f in dataclasses.fields(ExperimentConfig)} & ours) - {"rl"}
        return ExperimentConfig(rl=rl, **{name: getattr(self, name) for name in fields})


def tiny() -> OnlineConfig:
    """The 2-core CPU demo: alfworld_sao's tiny policy (clone it, or reuse a run's clone)."""
    base = alfworld_sao.tiny()
    return OnlineConfig(
        model=base.model,
        rollout=base.rollout,
        env=base.env,
        learner=base.learner,
        warm_start=base.warm_start,
        serving=ServingSpec(num_slots=16),
        agent=AgentSpec(concurrency=12),
        online=OnlineSpec(policy_steps=40, rows=64, seq_len=256, max_staleness=2),
        eval=base.eval,
    )


def micro() -> OnlineConfig:
    """Smoke test: a barely cloned micro model, short games, two policy steps."""
    base = alfworld_sao.micro()
    return OnlineConfig(
        model=base.model,
        rollout=base.rollout,
        env=base.env,
        learner=dataclasses.replace(
            base.learner, critic=dataclasses.replace(base.learner.critic, warmup_steps=0)
        ),
        warm_start=dataclasses.replace(base.warm_start, demo_episodes=4, steps=2, dagger_rounds=0),
        serving=ServingSpec(num_slots=4, decode_steps=4, max_prefill_batch=1),  # few compiles
        agent=AgentSpec(concurrency=4, stop_timeout_s=20.0),
        # staleness 0: the second batch can only hold calls served with the first update
        online=OnlineSpec(policy_steps=2, rows=8, seq_len=320, max_staleness=0, idle_timeout_s=1.0),
        eval=EvalSpec(num_games=2, num_envs=2),
        checkpoint_every=1,
    )


PRESETS = {"tiny": tiny(), "micro": micro()}


def parse(argv: list[str] | None = None) -> OnlineConfig:
    """The run's config from the command line (`out_dir` defaults to a timestamped dir)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    has_out = any(a == "--out" or a.startswith("--out=") for a in argv)
    if not has_out and not any(a in ("-h", "--help") for a in argv):
        argv = ["--out", str(Path("runs/online_sao") / time.strftime("%Y%m%d-%H%M%S")), *argv]
    return parse_cli(
        argv, PRESETS, prog="python -m experiments.online_sao", description=__doc__.split("\n")[0]
    )


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary."""
    config = parse(argv)
    from experiments.online_run import run  # heavy imports once the command line is valid

    interrupted = threading.Event()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main_thread else None
    if previous is signal.default_int_handler:  # a foreground job (a background one ignores it)

        def on_sigint(signum, frame):
            # Python raises a handler's exception in whatever frame runs, and one raised inside
            # a gc callback (JAX registers one) is printed and dropped: remember it as well.
            interrupted.set()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
    try:
        summary = run(config)
        if interrupted.is_set():  # the KeyboardInterrupt was swallowed; the run ended anyway
            raise KeyboardInterrupt
        return summary
    except KeyboardInterrupt:  # the agent and the server are already stopped
        print(f"interrupted; resume with --out {config.out_dir} --resume", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    main()
