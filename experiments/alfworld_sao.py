"""An MoE LLM agent learns ALFWorld with SAO (or a baseline), on a laptop CPU or a TPU pod.

    python -m experiments.alfworld_sao                       # the tiny preset, 2 CPU cores
    python -m experiments.alfworld_sao --config small --out runs/small learner.algorithm=ppo
    python -m experiments.alfworld_sao --out runs/x --resume

Phases: expert demonstrations -> behaviour cloning (skipped with `model.hf_path`) -> greedy
evaluation on valid_seen / valid_unseen -> critic warm-up on rollouts of the cloned policy ->
RL (rollout engine -> ATDP buffer -> loader stream -> learner -> published weights) -> greedy
evaluation again. Everything the agent plays goes to `DIR/atdp`; the learner reads it back
through the loader. Outputs: `DIR/metrics.jsonl` + `DIR/tensorboard/`, `DIR/checkpoints/`,
`DIR/learning_curve.png`, `DIR/summary.json`, and a summary table on the terminal.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from sao_jax.config_cli import parse_cli
from sao_jax.distributed.job import MeshSpec
from sao_jax.distributed.runtime import split_flags
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig

SPLITS = ("valid_seen", "valid_unseen")


@dataclasses.dataclass
class ModelSpec:
    """The policy: a preset with overrides, or a HF Qwen3-MoE checkpoint.

    Attributes:
      preset: `sao_jax.models` preset; vocab_size always follows the tokenizer.
      hf_path: HF Qwen3-MoE directory (config.json, safetensors, tokenizer.json) to start from;
        the behaviour-cloning warm start is skipped.
      d_model: override of the preset (None keeps the preset's value); likewise below.
      num_layers: override.
      num_heads: override.
      num_kv_heads: override.
      head_dim: override.
      num_experts: override.
      num_experts_per_token: override.
      moe_intermediate_size: override.
      dense_intermediate_size: override.
      capacity_factor: expert capacity in training (0: dropless, as the sampler routes).
      initializer_range: override of the init stddev.
      scan_layers: run runs of same-kind layers under one `lax.scan` (compile time independent
        of depth; `sao_jax.models.ModelConfig.scan_layers`).
      remat: per-layer rematerialisation policy: none, full, dots_with_no_batch_dims
        (`ModelConfig.remat`; `launch_tpu --remat` passes it here).
    """

    preset: str = "tiny"
    hf_path: str | None = None
    d_model: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    dense_intermediate_size: int | None = None
    capacity_factor: float | None = None
    initializer_range: float | None = None
    scan_layers: bool | None = None
    remat: str | None = None

    def overrides(self) -> dict:
        skip = {"preset", "hf_path"}
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in skip and getattr(self, f.name) is not None
        }


@dataclasses.dataclass
class WarmStartSpec:
    """Behaviour cloning on expert demonstrations (a random tiny model never wins by chance).

    Attributes:
      demo_episodes: expert episodes written to the `demos` tenant.
      heldout_episodes: expert episodes of train games kept out of the demos (the last
        `heldout_episodes` games of the split), on which teacher-forced imitation accuracy is
        measured (`bc/heldout_*`; 0: none).
      heldout_every: cloning steps between held-out measurements (also at the end; 0: at the
        end only).
      epochs: cloning length in passes over the demonstrations' rows (0: `steps` decides);
        `bc/epoch` logs how far it got.
      steps: behaviour-cloning steps when `epochs` is 0 (`epochs=0 steps=0`: no cloning).
      rows: rows per cloning batch.
      seq_len: tokens per row (0: sized to the longest demonstrated row of this run's prompts,
        measured on expert games before anything runs, so no demonstration is dropped).
      optimizer: AdamW of the cloning phase.
      decay: the cloning rate follows a cosine from its peak (after the warm-up) down to
        `optimizer.final_fraction` of it over the cloning steps (DAgger steps continue there).
      context_weight: weight of the NLL of prompt / observation tokens during cloning (a small
        model from scratch learns to read and copy the prompt much sooner with it).
      dagger_rounds: DAgger rounds after cloning: the cloned policy plays, the expert relabels
        every turn it played, and cloning continues on demos + relabelled turns.
      dagger_episodes: episodes the policy plays per DAgger round.
      dagger_steps: cloning steps after each DAgger round.
      from_run: directory of an earlier run of this experiment whose cloned policy and start
        evaluation are reused (demos, cloning and that evaluation are skipped); the model
        config must match.
    """

    demo_episodes: int = 1000
    heldout_episodes: int = 64
    heldout_every: int = 200
    epochs: float = 0.0
    steps: int = 300
    rows: int = 32
    seq_len: int = 320
    optimizer: OptimizerConfig = dataclasses.field(
        default_factory=lambda: OptimizerConfig(learning_rate=3e-3, warmup_steps=20)
    )
    decay: bool = True
    context_weight: float = 1.0
    dagger_rounds: int = 0
    dagger_episodes: int = 64
    dagger_steps: int = 100
    from_run: str | None = None


@dataclasses.dataclass
class RLSpec:
    """The online phase.

    Attributes:
      policy_steps: stop after this many policy updates.
      env_steps: also stop once the rollouts took this many environment steps (0: no limit).
      asynchronous: rollouts overlap training (False: the synchronous schedule).
      num_workers: rollout workers (threads; hosts on a pod).
      envs_per_worker: KV-cache slots (concurrent episodes) per worker.
      max_staleness: versions a sample may lag (engine admission and loader filter).
      episodes_per_version: episodes per policy version (engine admission; a sync round).
      rows: rows per learner batch (windowed layout: one row per turn).
      batch_episodes: a policy step trains on at most this many episodes, however few rows
        they fill (0: as many as `rows` holds). Set to `episodes_per_version`, every step
        trains on a version's worth of episodes, so the few long failures that finish last are
        not a batch, and a full-size Adam step, of their own. Off by default: asynchronously
        the batches then sit at the staleness bound (experiments/README.md, 2 seeds worse).
      seq_len: tokens per row (0: the longest expert prompt of this run's settings plus
        `rollout.max_new_tokens`, measured before anything runs).
      warmup_episodes: rollouts of the cloned policy for the critic warm-up.
      critic_head_fit: before the critic's warm-up steps, set its value head to the
        least-squares fit of the warm-up rollouts' Monte-Carlo returns on the critic's
        features (a zero head needs many Adam steps to reach even the mean return).
      idle_timeout_s: a stream idle this long hands over its partial batch.
    """

    policy_steps: int = 100
    env_steps: int = 0
    asynchronous: bool = True
    num_workers: int = 1
    envs_per_worker: int = 16
    max_staleness: int = 2
    episodes_per_version: int = 8
    rows: int = 64
    batch_episodes: int = 0
    seq_len: int = 320
    warmup_episodes: int = 16
    critic_head_fit: bool = False
    idle_timeout_s: float = 5.0

    def __post_init__(self):
        if self.batch_episodes < 0:
            raise ValueError(f"rl.batch_episodes must be >= 0, got {self.batch_episodes}")


@dataclasses.dataclass
class EvalSpec:
    """Greedy evaluation on valid_seen and valid_unseen.

    Attributes:
      num_games: games per split (None: the whole split, 140 / 134).
      num_envs: games played at once.
      every_policy_steps: also evaluate valid_unseen every this many policy steps (0: never).
    """

    num_games: int | None = None
    num_envs: int = 64
    every_policy_steps: int = 0


@dataclasses.dataclass
class ExperimentConfig:
    """One ALFWorld RL run.

    Attributes:
      out_dir: run directory (default: runs/alfworld_sao/<timestamp>).
      resume: continue the run in out_dir from its latest checkpoint.
      seed: offsets every seed of the run (model init, games, sampling, data order).
      model: the policy (preset + overrides, or a HF checkpoint).
      rollout: prompts, layout, decoding and rewards of the agent.
      env: ALFWorld games the agent trains on (split train).
      learner: the RL algorithm and its optimisers.
      warm_start: expert demonstrations and behaviour cloning.
      rl: the online phase: schedule, engine, batches, length.
      eval: greedy evaluation before and after RL.
      checkpoint_every: policy steps between checkpoints.
      checkpoint_keep: checkpoints kept on disk.
      progress: show progress bars.
      tensorboard: also write TensorBoard event files.
      mesh: device mesh (ici x dcn axis sizes); none given on one process: nothing sharded.
      atdp_path: ATDP buffer location, a path or gs:// URL shared by every host (default:
        DIR/atdp).
      checkpoint_dir: checkpoint directory, a path or gs:// URL shared by every host
        (default: DIR/checkpoints).
      atdp_purge_every_s: seconds between retention passes over this process's rollout
        partition during RL (expired trajectories erased; readers refuse them at read time
        regardless); 0 turns the schedule off.
    """

    out_dir: str = ""
    resume: bool = False
    seed: int = 0
    model: ModelSpec = dataclasses.field(default_factory=ModelSpec)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    warm_start: WarmStartSpec = dataclasses.field(default_factory=WarmStartSpec)
    rl: RLSpec = dataclasses.field(default_factory=RLSpec)
    eval: EvalSpec = dataclasses.field(default_factory=EvalSpec)
    checkpoint_every: int = 25
    checkpoint_keep: int = 2
    progress: bool = True
    tensorboard: bool = True
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    atdp_path: str = ""
    checkpoint_dir: str = ""
    atdp_purge_every_s: float = 600.0


def tiny() -> ExperimentConfig:
    """The 2-core CPU demo: the tiny MoE preset with 4 experts on small games, ~20 minutes.

    Clone 2000 episodes of the observation-only search expert for 2 epochs (~1,080 steps, rows
    sized to every demo, compact prompts), then 50 policy steps of SAO on 12 episodes each (a
    command the room does not admit costs -1) on the synchronous schedule: where rollout and
    learner share two cores the overlap buys nothing, and
    synchronous RL was 1.46x faster with a smaller spread over seeds (experiments/README.md).
    `rl.asynchronous=true` overlaps them (the `small` preset does, for an accelerator).
    """
    return ExperimentConfig(
        model=ModelSpec(
            preset="tiny",
            num_experts=4,
            moe_intermediate_size=128,
            capacity_factor=0.0,
        ),
        rollout=RolloutConfig(
            history_length=1,
            prompt_style="compact",  # the papers' facts in ~half the tokens (a model from scratch)
            max_new_tokens=12,
            max_context_tokens=512,
            decode_chunk=8,
            # a command the room does not admit costs a point: the cloned policy's unseen
            # failures are mostly loops of such commands (experiments/README.md)
            inadmissible_penalty=-1.0,
        ),
        env=EnvConfig(size="small", max_steps=20),
        learner=LearnerConfig(
            policy_optimizer=OptimizerConfig(learning_rate=1e-4),
            critic_optimizer=OptimizerConfig(learning_rate=1e-3),
            critic=CriticConfig(warmup_steps=6),
        ),
        warm_start=WarmStartSpec(demo_episodes=2000, epochs=2.0, rows=32, seq_len=0),
        rl=RLSpec(
            policy_steps=50,
            asynchronous=False,  # 2 cores: see the docstring
            envs_per_worker=16,
            episodes_per_version=12,  # packed rows make the 256-row batch cheap
            rows=256,
            seq_len=0,
            warmup_episodes=32,
        ),
        eval=EvalSpec(num_envs=64),
    )


def small() -> ExperimentConfig:
    """The `small` model preset on small games: one accelerator, or a patient CPU."""
    config = tiny()
    return dataclasses.replace(
        config,
        model=ModelSpec(preset="small", capacity_factor=0.0),
        rollout=dataclasses.replace(config.rollout, max_context_tokens=1024, max_new_tokens=16),
        env=EnvConfig(size="small", max_steps=30),
        warm_start=dataclasses.replace(config.warm_start, steps=1000, rows=64, seq_len=512),
        rl=dataclasses.replace(
            config.rl, policy_steps=500, asynchronous=True, envs_per_worker=64,
            episodes_per_version=16, rows=128, seq_len=512,
        ),
    )  # fmt: skip


def micro() -> ExperimentConfig:
    """A smoke test: a few steps of every phase (tests; first check of a new machine)."""
    config = tiny()
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, d_model=32, head_dim=8, moe_intermediate_size=32),
        rollout=dataclasses.replace(config.rollout, max_context_tokens=320),
        env=EnvConfig(size="small", max_steps=4),
        learner=dataclasses.replace(
            config.learner, critic=dataclasses.replace(config.learner.critic, warmup_steps=1)
        ),
        warm_start=dataclasses.replace(
            config.warm_start, demo_episodes=8, heldout_episodes=4, steps=2, epochs=0.0, rows=16,
            dagger_rounds=1, dagger_episodes=2, dagger_steps=1,
        ),
        rl=dataclasses.replace(
            config.rl, policy_steps=2, asynchronous=True, envs_per_worker=4,
            episodes_per_version=2, rows=16, seq_len=320, warmup_episodes=2, idle_timeout_s=1.0,
        ),
        eval=EvalSpec(num_games=4, num_envs=4),
        checkpoint_every=1,
    )  # fmt: skip


PRESETS = {"tiny": tiny(), "small": small(), "micro": micro()}


def parse(argv: list[str] | None = None) -> ExperimentConfig:
    """The run's config from the command line; `out_dir` defaults to a fresh timestamped dir
    (written into DIR/config.yaml so `--resume` finds it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    has_out = any(a == "--out" or a.startswith("--out=") for a in argv)
    if not has_out and not any(a in ("-h", "--help") for a in argv):
        argv = ["--out", str(Path("runs/alfworld_sao") / time.strftime("%Y%m%d-%H%M%S")), *argv]
    return parse_cli(
        argv, PRESETS, prog="python -m experiments.alfworld_sao", description=__doc__.split("\n")[0]
    )


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary.

    `--coordinator_address`, `--num_processes`, `--process_id` (or `SAO_*` variables) join a
    multi-process job (`sao_jax.distributed`)."""
    try:
        distributed, argv = split_flags(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    config = parse(argv)
    from experiments.alfworld_run import run  # heavy imports once the command line is valid

    return run(check_lengths(config), distributed=distributed)


def check_lengths(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with every `seq_len` left at 0 sized to the prompts `rollout` builds
    (`history_length`, `layout`, `think`), measured on expert games in a few seconds. Exits 2
    when the batches (`warm_start.seq_len` / `rows`, `rl.seq_len` / `rows`) fit none of them:
    such a run would drop every episode and wait forever. Prints a warning for a phase that
    drops only some."""
    from experiments.alfworld_lengths import (
        check_sequence_lengths,
        measure_demonstrations,
        size_sequences,
    )
    from experiments.alfworld_run import build_tokenizer

    try:
        lengths = measure_demonstrations(
            build_tokenizer(config), config.rollout, config.env, num_episodes=512
        )
        config = size_sequences(config, lengths)
        warnings = check_sequence_lengths(config, lengths)
    except ValueError as error:  # SequenceLengthError, or a prompt past max_context_tokens
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return config


if __name__ == "__main__":
    main()
