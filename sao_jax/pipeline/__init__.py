"""The training job as a library: warm start, critic warm-up, RL, evaluation, checkpoints.

    from sao_jax.pipeline import ExperimentConfig, run
    summary = run(ExperimentConfig(out_dir="runs/x"))     # or Job(config), phase by phase

Modules, one job each: `config` (the dataclasses), `setup` (`Run`: tokenizer, model, store,
meshes, per-process tenants and shares), `lengths` (batch shapes from expert episodes),
`warm_start` (demos, behaviour cloning, DAgger; `relabel`), `rl` (critic warm-up, RL phase),
`evaluation`, `checkpoints` (checkpoint / resume with the stream position), `summary`, `job`
(`Job`, `run`). Jobs built on it: `seed` (`SeedJob`), `online` (`OnlineJob`, serving a live
agent: `online_config`, `online_serving`, `online_agent`); import those modules directly.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sao_jax.pipeline.config import (
        EvalSpec,
        ExperimentConfig,
        ModelSpec,
        RLSpec,
        WarmStartSpec,
    )
    from sao_jax.pipeline.job import Job, run

# Imported on first use: the online agent process (`sao_jax.pipeline.online_agent`) lives in
# this package and must start without JAX.
_EXPORTS = {
    "EvalSpec": "config",
    "ExperimentConfig": "config",
    "ModelSpec": "config",
    "RLSpec": "config",
    "WarmStartSpec": "config",
    "Job": "job",
    "run": "job",
}
__all__ = ["EvalSpec", "ExperimentConfig", "Job", "ModelSpec", "RLSpec", "WarmStartSpec", "run"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
