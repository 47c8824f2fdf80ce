"""An MoE LLM agent learns tool-using arithmetic with SAO (or a baseline): the same job as
`experiments.alfworld_sao` on the built-in arithmetic env (`sao_jax.envs.arithmetic`).

    python -m experiments.arithmetic_sao                       # the tiny preset, minutes on a CPU
    python -m experiments.arithmetic_sao --config micro --out /tmp/arith     # seconds: smoke test
    python -m experiments.arithmetic_sao --out runs/x --resume rl.policy_steps=60

The agent answers arithmetic questions, optionally asking a calculator first (`calc <expr>`,
then `answer <number>`); the env's expert (it computes the answer and uses the calculator for
anything past one operation) is cloned first. Evaluation: valid_seen (the training operand
ranges) and valid_unseen (larger operands, longer expressions). Same outputs as alfworld_sao.
"""

from __future__ import annotations

import dataclasses

from sao_jax.envs import EnvConfig
from sao_jax.pipeline import cli
from sao_jax.pipeline.config import EvalSpec, ExperimentConfig, ModelSpec, RLSpec, WarmStartSpec
from sao_jax.rollout import RolloutConfig
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig

PROG, TITLE = "python -m experiments.arithmetic_sao", __doc__.split("\n")[0]


def tiny() -> ExperimentConfig:
    """The 2-core CPU demo: a small MoE (4 experts) clones the expert, then 30 SAO steps."""
    return ExperimentConfig(
        model=ModelSpec(preset="tiny", d_model=64, num_experts=4, moe_intermediate_size=64,
                        capacity_factor=0.0),
        rollout=RolloutConfig(history_length=2, prompt_style="compact", max_new_tokens=16,
                              max_context_tokens=256, decode_chunk=8),
        env=EnvConfig(name="arithmetic", max_steps=4),
        learner=LearnerConfig(
            policy_optimizer=OptimizerConfig(learning_rate=1e-4),
            critic_optimizer=OptimizerConfig(learning_rate=1e-3),
            critic=CriticConfig(warmup_steps=4),
        ),
        warm_start=WarmStartSpec(demo_episodes=512, heldout_episodes=32, steps=300, rows=32,
                                 seq_len=0),
        # RL rows: a policy's own replies in the history can outgrow the expert's (seq_len 0
        # would size them to the expert's prompts), so room for two whole replies more
        rl=RLSpec(policy_steps=30, asynchronous=False, envs_per_worker=16,
                  episodes_per_version=16, rows=64, seq_len=192, warmup_episodes=16),
        eval=EvalSpec(num_games=50, num_envs=25),
        checkpoint_every=10,
    )  # fmt: skip


def micro() -> ExperimentConfig:
    """A smoke test: a few steps of every phase (tests)."""
    config = tiny()
    return dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, d_model=32, head_dim=8, moe_intermediate_size=32),
        learner=dataclasses.replace(
            config.learner, critic=dataclasses.replace(config.learner.critic, warmup_steps=1)
        ),
        warm_start=dataclasses.replace(
            config.warm_start, demo_episodes=8, heldout_episodes=4, steps=2, rows=16,
            dagger_rounds=1, dagger_episodes=2, dagger_steps=1,
        ),
        rl=dataclasses.replace(
            config.rl, policy_steps=2, asynchronous=True, envs_per_worker=4,
            episodes_per_version=2, rows=16, warmup_episodes=2, idle_timeout_s=1.0,
        ),
        eval=EvalSpec(num_games=4, num_envs=4),
        checkpoint_every=1,
    )  # fmt: skip


PRESETS = {"tiny": tiny(), "micro": micro()}


def parse(argv: list[str] | None = None) -> ExperimentConfig:
    """The run's config from the command line (`sao_jax.pipeline.cli.parse`)."""
    return cli.parse(argv, PRESETS, prog=PROG, runs_dir="runs/arithmetic_sao", description=TITLE)


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary."""
    return cli.main(argv, PRESETS, prog=PROG, runs_dir="runs/arithmetic_sao", description=TITLE)


if __name__ == "__main__":
    main()
