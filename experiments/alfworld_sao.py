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

from sao_jax.pipeline import cli
from sao_jax.pipeline.config import (
    EvalSpec,
    ExperimentConfig,
    ModelSpec,
    RLSpec,
    WarmStartSpec,
)
from sao_jax.rollout import EnvConfig, RolloutConfig
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig

PROG, TITLE = "python -m experiments.alfworld_sao", __doc__.split("\n")[0]


def tiny() -> ExperimentConfig:
    """The 2-core CPU demo: the tiny MoE preset with 4 experts on small games, ~20 minutes.

    Clone 2000 episodes of the observation-only search expert for 2 epochs (~1,080 steps, rows
    sized to every demo, compact prompts), then 2 DAgger rounds (the cloned policy plays 64
    train games greedily, as evaluation does; the expert relabels every turn; 150 more cloning
    steps each: +13 unseen points over 3 seeds, experiments/README.md), then 50 policy steps of
    SAO on 12 episodes each (a
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
        # greedy DAgger: the expert relabels the refused-command loops greedy decoding falls
        # into (most of the cloned policy's unseen failures)
        warm_start=WarmStartSpec(
            demo_episodes=2000,
            epochs=2.0,
            rows=32,
            seq_len=0,
            dagger_rounds=2,
            dagger_episodes=64,
            dagger_steps=150,
            dagger_temperature=0.0,
        ),
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


def policy_parts(config: ExperimentConfig) -> dict:
    """The parts of a preset that make its agent (model, rollout, environment, learner, warm
    start), as keyword arguments: the experiments that deploy this agent (`online_sao`,
    `evolve_alfworld`) build their configs on them."""
    names = ("model", "rollout", "env", "learner", "warm_start")
    return {name: getattr(config, name) for name in names}


def parse(argv: list[str] | None = None) -> ExperimentConfig:
    """The run's config from the command line (`sao_jax.pipeline.cli.parse`)."""
    return cli.parse(argv, PRESETS, prog=PROG, runs_dir="runs/alfworld_sao", description=TITLE)


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary
    (`sao_jax.pipeline.cli.main`: multi-process flags join a job)."""
    return cli.main(argv, PRESETS, prog=PROG, runs_dir="runs/alfworld_sao", description=TITLE)


if __name__ == "__main__":
    main()
