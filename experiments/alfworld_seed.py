"""SEED on ALFWorld: hindsight-skill SFT, then SAO (or GRPO) with self-evolving OPD.

    python -m experiments.alfworld_seed                          # tiny preset, SAO + SEED
    python -m experiments.alfworld_seed learner.algorithm=grpo_seed --out runs/grpo_seed
    python -m experiments.alfworld_seed --config micro hindsight.opd_analyzer=rule_alfworld

Phases: the `alfworld_sao` warm start (demos -> cloning -> evaluation) -> stage 1: the cloned
policy plays `hindsight.sft_episodes`, an analyzer writes one skill per episode (rule-based on
the game's ground truth by default), skills (analysis prompt -> skill) and acting data (won
episodes as played, lost ones relabelled by the expert) go to the `seed_sft` tenant, and one
cloner fine-tunes on both -> critic warm-up -> RL where every learner iteration lets the
current policy write a skill per trajectory, re-scores the sampled actions with it in context
and adds `learner.opd.weight * seed_opd_loss` (`SeedLearner`) -> evaluation without skills.
Same outputs and summary keys as `alfworld_sao`, plus `seed_*` keys (stage-1 counts, seconds of
analysis and re-scoring per iteration, mean delta and gate). Stage-2 skills go to the `skills`
tenant: `python -m sao_jax.seed inspect DIR/atdp`.
"""

from __future__ import annotations

from experiments import alfworld_sao
from sao_jax.pipeline import cli
from sao_jax.pipeline.seed import with_seed
from sao_jax.seed.config import SeedConfig

TITLE = __doc__.split("\n")[0]
PRESETS = {
    "tiny": with_seed(alfworld_sao.tiny(), SeedConfig()),
    "small": with_seed(alfworld_sao.small(), SeedConfig(sft_episodes=256, sft_steps=200)),
    "micro": with_seed(
        alfworld_sao.micro(),
        SeedConfig(sft_episodes=2, sft_steps=1, max_skill_new_tokens=8, max_skill_tokens=48),
    ),
}


def parse(argv: list[str] | None = None):
    """The run's config from the command line (`sao_jax.pipeline.cli.parse`)."""
    return cli.parse(
        argv,
        PRESETS,
        prog="python -m experiments.alfworld_seed",
        runs_dir="runs/alfworld_seed",
        description=TITLE,
    )


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary."""
    from sao_jax.pipeline.seed import run

    return run(parse(argv))


if __name__ == "__main__":
    main()
