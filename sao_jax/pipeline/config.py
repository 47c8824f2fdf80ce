"""The job's configuration: the policy, warm start, RL phase, evaluation and the run's storage.

`ExperimentConfig` is one run of `sao_jax.pipeline.run` (presets: `experiments.alfworld_sao`);
every field is settable from a command line through `sao_jax.config_cli`.
"""

from __future__ import annotations

import dataclasses

from sao_jax.distributed.job import MeshSpec
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.train import LearnerConfig, OptimizerConfig


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
      attention_query_block: query tokens per block of causal self-attention in training
        (`ModelConfig.attention_query_block`; 0: the whole row at once).
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
    attention_query_block: int | None = None

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
      pack_factor: the cloner packs demonstrated turns into rows this many times `seq_len`
        long (2: pairs of short turns share a row; 1: rows of `seq_len`). The same loss either
        way; longer rows fill more positions and cost more attention per token
        (`docs/training.md`, "Packed rows").
      dagger_rounds: DAgger rounds after cloning: the cloned policy plays, the expert relabels
        every turn it played, and cloning continues on demos + relabelled turns.
      dagger_episodes: episodes the policy plays per DAgger round.
      dagger_steps: cloning steps after each DAgger round.
      dagger_temperature: the policy's sampling temperature in DAgger rounds (1: as RL samples;
        0: greedy, as evaluation plays, so the expert relabels the states evaluation reaches,
        such as a refused command repeated until the step limit).
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
    pack_factor: int = 2
    dagger_rounds: int = 0
    dagger_episodes: int = 64
    dagger_steps: int = 100
    dagger_temperature: float = 1.0
    from_run: str | None = None

    def __post_init__(self):
        if isinstance(self.pack_factor, bool) or self.pack_factor < 1:
            raise ValueError(f"warm_start.pack_factor must be an int >= 1, got {self.pack_factor}")
        if self.dagger_temperature < 0:
            raise ValueError(
                f"warm_start.dagger_temperature must be >= 0 (0: greedy), got "
                f"{self.dagger_temperature}"
            )


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
      final_temperature: the rollouts' temperature moves linearly from `rollout.temperature`
        at policy step 0 to this at `policy_steps` (each episode keeps the temperature it
        started with and is trained against it); None: `rollout.temperature` throughout.
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
    final_temperature: float | None = None

    def __post_init__(self):
        if self.batch_episodes < 0:
            raise ValueError(f"rl.batch_episodes must be >= 0, got {self.batch_episodes}")
        final = self.final_temperature
        if final is not None and (
            isinstance(final, bool) or not isinstance(final, int | float) or not final > 0
        ):
            raise ValueError(
                f"rl.final_temperature must be a number > 0 (or none: no schedule), got {final!r}"
            )

    def rollout_temperature(self, start: float, policy_step: int) -> float:
        """The temperature of rollouts that start at `policy_step` (`final_temperature`)."""
        if self.final_temperature is None:
            return start
        progress = min(max(policy_step / max(self.policy_steps, 1), 0.0), 1.0)
        return start + (self.final_temperature - start) * progress


@dataclasses.dataclass
class EvalSpec:
    """Greedy evaluation before and after RL on the env's evaluation splits.

    Attributes:
      num_games: games per split (None: the whole split; ALFWorld's valid_seen / valid_unseen
        hold 140 / 134).
      num_envs: games played at once.
      every_policy_steps: also evaluate the last split (the held-out one: ALFWorld's
        valid_unseen) every this many policy steps (0: never).
      splits: the splits evaluated, held-out last (empty: every split of the env other than
        the one it trains on, in the env's order: ALFWorld's valid_seen, valid_unseen).
    """

    num_games: int | None = None
    num_envs: int = 64
    every_policy_steps: int = 0
    splits: tuple[str, ...] = ()


@dataclasses.dataclass
class ExperimentConfig:
    """One RL job on a text env (`env.name`: ALFWorld by default).

    Attributes:
      out_dir: run directory (the command lines default to runs/<experiment>/<timestamp>).
      resume: continue the run in out_dir from its latest checkpoint.
      seed: offsets every seed of the run (model init, games, sampling, data order).
      model: the policy (preset + overrides, or a HF checkpoint).
      rollout: prompts, layout, decoding and rewards of the agent.
      env: the env and the tasks the agent trains on (`env.split`; any registered env).
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

    def __post_init__(self):
        self.eval_splits  # noqa: B018  (checked here, not after hours of training)
        if self.rl.final_temperature is not None and self.rollout.temperature <= 0:
            raise ValueError(
                "rl.final_temperature schedules sampled rollouts; rollout.temperature is "
                f"{self.rollout.temperature} (greedy): set it > 0 or rl.final_temperature=none"
            )

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """The splits evaluation plays, held-out last: `eval.splits`, or every split of the env
        (`TextEnv.splits`) but the one it trains on."""
        splits = self.env.env_class.splits
        chosen = self.eval.splits or tuple(s for s in splits if s != self.env.split)
        if not chosen or any(s not in splits for s in chosen):
            raise ValueError(
                f"eval.splits must name splits of the env {self.env.name!r} ({sorted(splits)}), "
                f"got {list(chosen)}"
            )
        return tuple(chosen)
