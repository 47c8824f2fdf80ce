"""The evolution experiment's configuration (`experiments.evolve_alfworld`).

`EvolveConfig` is one run of `sao_jax.pipeline.evolve.run`: a cloned ALFWorld policy served by
the one-process server, an agent per tenant playing through the gateway, and the control plane
(`serving.control.plane.ControlPlane`) running a round after each window of games.
"""

from __future__ import annotations

import dataclasses

from sao_jax.pipeline.config import EvalSpec, ExperimentConfig, ModelSpec, RLSpec, WarmStartSpec
from sao_jax.pipeline.online_config import ServingSpec
from sao_jax.pipeline.setup import WARM_START_DIR, lacks_warm_start
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.train import LearnerConfig


@dataclasses.dataclass
class EvolveSpec:
    """The rounds of the loop.

    Attributes:
      tenants: the deployments (one composite history each); the first gets the planted
        candidates and the injected regression.
      rounds: rounds of (play a window per tenant -> watch -> analyse, propose, gate, choose,
        ship).
      games_per_round: games each tenant plays per round (its live window).
      game_pool: the distinct games of each tenant, played again every round (a deployment's
        recurring tasks; tenants get disjoint pools).
      concurrency: games played at once per tenant (threads of the agent).
      temperature: the agent's decoding temperature live (0: greedy, as replay plays).
      replay_episodes: recorded episodes the gate replays per candidate.
      gate_confidence: of the gate's and the watch's intervals (`GateConfig.confidence`).
      policy_steps: learner iterations of a policy candidate on the window's rows.
      policy_rows: rows of its batch (the window's episodes that fit, one row per call).
      policy_learning_rate: their learning rate (10x RL's: a window is a few steps; at 3e-4 x 4
        steps a sign-flipped update moved known-good log-probs by 0.001 nats and won more).
      policy_fit_baseline: fit the candidate's fresh value head to the window's returns first
        (`WindowTrainer.fit_baseline`; without it the advantages are the returns). Off by
        default: measured on 3 seeds at the default rate, every fitted candidate replayed
        worse (-0.38 to -0.62) where 11 of 21 unfitted ones were inconclusive
        (experiments/README.md, 2026-12-07).
      policy_critic_warmup: critic-only iterations on the window before its policy steps.
      plant_round: round whose gate also sees the planted harmful candidates (a reply-format
        breaking harness edit, a policy update on sign-flipped rewards); 0: none planted.
      regression_round: round at whose start a harmful composite (the planted corrupted
        policy, or the format-breaking edit before any policy exists) is promoted directly,
        past the gate, to the first tenant; the watch after its window must roll it back (the
        window after the last round is watched too). 0: none.
      watch_min_sessions: labelled sessions per version before the watch judges.
      rescore: also gate by re-scoring recorded known-good actions (`model_scorer`).
    """

    tenants: tuple[str, ...] = ("acme", "globex")
    rounds: int = 4
    games_per_round: int = 16
    game_pool: int = 16
    concurrency: int = 8
    temperature: float = 0.0
    replay_episodes: int = 8
    gate_confidence: float = 0.95
    policy_steps: int = 8
    policy_rows: int = 256
    policy_learning_rate: float = 1e-3
    policy_fit_baseline: bool = False
    policy_critic_warmup: int = 0
    plant_round: int = 1
    regression_round: int = 2
    watch_min_sessions: int = 8
    rescore: bool = True

    def __post_init__(self):
        if len(self.tenants) < 2 or len(set(self.tenants)) != len(self.tenants):
            raise ValueError(f"evolve.tenants must name two or more tenants, got {self.tenants}")
        for name in ("rounds", "games_per_round", "game_pool", "concurrency", "replay_episodes",
                     "policy_steps", "policy_rows", "watch_min_sessions"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"evolve.{name} must be >= 1, got {getattr(self, name)}")
        if self.policy_critic_warmup < 0:
            raise ValueError(
                f"evolve.policy_critic_warmup must be >= 0, got {self.policy_critic_warmup}"
            )
        if not 0.5 <= self.gate_confidence < 1:
            raise ValueError(
                f"evolve.gate_confidence must be in [0.5, 1), got {self.gate_confidence}"
            )
        for name in ("plant_round", "regression_round"):
            if not 0 <= getattr(self, name) <= self.rounds:
                raise ValueError(
                    f"evolve.{name} must be in [0, rounds={self.rounds}], got {getattr(self, name)}"
                )


@dataclasses.dataclass
class EvolveConfig:
    """One evolution run.

    Attributes:
      out_dir: run directory (default: runs/evolve_alfworld/<timestamp>).
      seed: offsets every seed (model init, games, sampling).
      model: the policy (must match `warm_start.from_run`'s).
      rollout: prompts, decoding and rewards (the agent's harness; windowed layout).
      env: the env whose games the tenants play.
      learner: the algorithm of the policy candidates (SAO).
      warm_start: expert demos + behaviour cloning, or `from_run`: an `alfworld_sao` run whose
        cloned policy (DIR/warm_start) is served.
      serving: the worker.
      evolve: the rounds.
      eval: greedy evaluation of a fresh clone (skipped with `warm_start.from_run`).
      progress: show progress bars.
      tensorboard: also write TensorBoard event files.
    """

    out_dir: str = ""
    seed: int = 0
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    warm_start: WarmStartSpec = dataclasses.field(default_factory=WarmStartSpec)
    serving: ServingSpec = dataclasses.field(default_factory=ServingSpec)
    evolve: EvolveSpec = dataclasses.field(default_factory=EvolveSpec)
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)
    progress: bool = True
    tensorboard: bool = True

    def __post_init__(self):
        if self.rollout.layout != "windowed":
            raise ValueError(
                "rollout.layout must be 'windowed': the agent sends each turn's prompt as a "
                f"fresh conversation and replay plays that layout only, got {self.rollout.layout!r}"
            )
        source = self.warm_start.from_run
        if source and lacks_warm_start(source):
            raise ValueError(
                f"warm_start.from_run={source!r} holds no {WARM_START_DIR}/ directory: give the "
                "directory of an alfworld_sao run (its cloned policy is saved in DIR/warm_start)"
            )

    def experiment(self) -> ExperimentConfig:
        """The `alfworld_sao` config whose warm start this run reuses."""
        ours = {f.name for f in dataclasses.fields(self)}
        shared = ({f.name for f in dataclasses.fields(ExperimentConfig)} & ours) - {"rl"}
        rl = RLSpec(policy_steps=self.evolve.policy_steps, rows=self.evolve.policy_rows, seq_len=0)
        return ExperimentConfig(rl=rl, **{name: getattr(self, name) for name in shared})
