"""A job's command line: a preset, `key=value` overrides, multi-process flags -> run -> summary.

    # my_presets.py
    from sao_jax.pipeline import cli
    PRESETS = {"tiny": ExperimentConfig(...), ...}
    if __name__ == "__main__":
        cli.main(None, PRESETS, prog="python -m my_presets", runs_dir="runs/mine")

`--config NAME` picks a preset, `--out DIR` the run directory (default: a fresh timestamped
one under `runs_dir`, written into DIR/config.yaml so `--resume` finds it), `--help` lists
every key. `--coordinator_address`, `--num_processes`, `--process_id` (or `SAO_*` variables)
join a multi-process job (`sao_jax.distributed`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sao_jax.config_cli import parse_cli
from sao_jax.distributed.runtime import split_flags
from sao_jax.pipeline.config import ExperimentConfig


def parse(
    argv: Sequence[str] | None,
    presets: Mapping[str, Any],
    *,
    prog: str,
    runs_dir: str,
    description: str = "",
) -> Any:
    """The run's config from the command line (`sys.argv[1:]` when `argv` is None); `out_dir`
    defaults to `runs_dir/<timestamp>`. Bad input exits 2 with a message naming it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    has_out = any(a == "--out" or a.startswith("--out=") for a in argv)
    if not has_out and not any(a in ("-h", "--help") for a in argv):
        argv = ["--out", str(Path(runs_dir) / time.strftime("%Y%m%d-%H%M%S")), *argv]
    return parse_cli(argv, presets, prog=prog, description=description)


def check_lengths(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with every `seq_len` left at 0 sized to the prompts `rollout` builds
    (`history_length`, `layout`, `think`), measured on expert games in a few seconds. Exits 2
    when the batches (`warm_start.seq_len` / `rows`, `rl.seq_len` / `rows`) fit none of them:
    such a run would drop every episode and wait forever. Prints a warning for a phase that
    drops only some."""
    from sao_jax.pipeline.lengths import (
        check_sequence_lengths,
        measure_demonstrations,
        size_sequences,
    )
    from sao_jax.pipeline.setup import build_tokenizer

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


def main(
    argv: Sequence[str] | None,
    presets: Mapping[str, ExperimentConfig],
    *,
    prog: str,
    runs_dir: str,
    description: str = "",
    run: Callable[..., dict] | None = None,
) -> dict:
    """Parse the command line, check the batch shapes, run (default: `sao_jax.pipeline.run`),
    print the summary table; returns the summary."""
    try:
        distributed, argv = split_flags(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error
    config = parse(argv, presets, prog=prog, runs_dir=runs_dir, description=description)
    if run is None:
        from sao_jax.pipeline.job import run  # heavy imports once the command line is valid
    return run(check_lengths(config), distributed=distributed)
