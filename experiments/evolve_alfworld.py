"""The control plane evolves a live ALFWorld deployment, round by round, for two tenants.

    python -m experiments.evolve_alfworld --out runs/evolve warm_start.from_run=runs/alfworld_sao/X
    python -m experiments.evolve_alfworld --config micro --out /tmp/evolve   # a smoke test

A cloned ALFWorld policy (`warm_start.from_run` of an `alfworld_sao` run, or cloned here) is
served by the one-process server; each tenant's agent plays its games through the gateway
with the official `openai` client; after each round of windows the control plane
(`serving.control.plane.ControlPlane`) watches for a live regression (and rolls it back), then
analyses the windows, proposes memory / skill / harness / policy candidates, gates them by
replay and re-scoring, chooses and promotes. Planted on purpose: a reply-format-breaking
harness edit and a policy update on sign-flipped rewards (the gate must refuse both), a
harmful composite promoted past the gate (the watch must roll it back), and a candidate of one
tenant offered to the other (governance must refuse it). Outputs in DIR: summary.json,
evolution.png, metrics.jsonl (+ tensorboard/), live/ (ATDP store, composites, decision log),
agents/, and the round table on the terminal (`sao_jax.pipeline.evolve`).
"""

from __future__ import annotations

import dataclasses

from experiments import alfworld_sao
from sao_jax.pipeline import cli
from sao_jax.pipeline.config import EvalSpec
from sao_jax.pipeline.evolve_config import EvolveConfig, EvolveSpec
from sao_jax.pipeline.online_config import ServingSpec

PROG, TITLE = "python -m experiments.evolve_alfworld", __doc__.split("\n")[0]


def tiny() -> EvolveConfig:
    """The 2-core CPU demo: alfworld_sao's tiny policy (give `warm_start.from_run` to reuse a
    run's clone; otherwise it is cloned first, ~15 minutes more), 4 rounds of 16 games per
    tenant, greedy play."""
    base = alfworld_sao.tiny()
    return EvolveConfig(
        **alfworld_sao.policy_parts(base),
        serving=ServingSpec(num_slots=16),
        evolve=EvolveSpec(rounds=4, games_per_round=16, concurrency=8, replay_episodes=8),
        eval=base.eval,
    )


def micro() -> EvolveConfig:
    """Smoke test: a barely cloned micro model, short games, two rounds of four games."""
    base = alfworld_sao.micro()
    warm_start = dataclasses.replace(base.warm_start, demo_episodes=4, steps=2, dagger_rounds=0)
    return EvolveConfig(
        **alfworld_sao.policy_parts(dataclasses.replace(base, warm_start=warm_start)),
        serving=ServingSpec(num_slots=4, decode_steps=4, max_prefill_batch=2),
        evolve=EvolveSpec(
            rounds=2,
            games_per_round=4,
            concurrency=4,
            replay_episodes=2,
            policy_steps=1,
            policy_rows=32,
            plant_round=1,
            regression_round=2,
            watch_min_sessions=2,
        ),
        eval=EvalSpec(num_games=2, num_envs=2),
    )


PRESETS = {"tiny": tiny(), "micro": micro()}


def parse(argv: list[str] | None = None) -> EvolveConfig:
    """The run's config from the command line (`sao_jax.pipeline.cli.parse`)."""
    return cli.parse(argv, PRESETS, prog=PROG, runs_dir="runs/evolve_alfworld", description=TITLE)


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the round table; returns the summary."""
    config = parse(argv)
    from sao_jax.pipeline.evolve import run  # heavy imports once the command line is valid

    return run(config)


if __name__ == "__main__":
    main()
