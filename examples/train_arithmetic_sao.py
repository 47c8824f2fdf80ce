"""Train SAO on the built-in arithmetic env (a calculator tool) through the library API.

python examples/train_arithmetic_sao.py runs/arithmetic     # ~minutes on a laptop CPU
"""

import sys

from sao_jax.envs import EnvConfig
from sao_jax.pipeline import EvalSpec, ExperimentConfig, ModelSpec, RLSpec, WarmStartSpec, run
from sao_jax.rollout import RolloutConfig


def train(out_dir: str, *, clone_steps: int = 200, policy_steps: int = 20, games: int = 50):
    """Clone the env's expert, then SAO; returns the summary (also in out_dir/summary.json)."""
    config = ExperimentConfig(
        out_dir=out_dir,
        model=ModelSpec(d_model=64, num_experts=4, moe_intermediate_size=64, capacity_factor=0.0),
        env=EnvConfig(name="arithmetic", max_steps=4),
        rollout=RolloutConfig(history_length=2, max_new_tokens=16, max_context_tokens=256),
        warm_start=WarmStartSpec(demo_episodes=256, steps=clone_steps, seq_len=0),
        rl=RLSpec(policy_steps=policy_steps, asynchronous=False, rows=64, seq_len=192),
        eval=EvalSpec(num_games=games, num_envs=min(games, 32)),
    )
    return run(config)


if __name__ == "__main__":
    summary = train(sys.argv[1] if len(sys.argv) > 1 else "runs/arithmetic")
    print(f"unseen success: {summary['unseen_success_start']} -> {summary['unseen_success_end']}")
