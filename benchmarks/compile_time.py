"""Compile time of one training step at two depths, layers looped vs scanned, side by side.

The looped model (`ModelConfig.scan_layers=False`) hands XLA one copy of every layer, so its
program and compile time grow with depth; the scanned one (`scan_layers=True`) compiles each
group of layers once, whatever its length. This lowers and compiles `value_and_grad` of the
next-token loss (`sao_jax.models.steps.next_token_loss`) of the `preset` model at
`layers_small` and `layers_large` layers, for both layouts, from abstract shapes (no weights are
allocated), and prints the time and the ratio large / small of each (target <= 1.5 with scan).
Each model is compiled `repeats` times, interleaved, and the run with the least CPU time is
kept; ratios are of CPU seconds (all threads of this process), which other jobs sharing the
cores disturb far less than wall time.

    python benchmarks/compile_time.py [preset=small] [layers_small=6] [layers_large=24] \\
        [batch=2] [seq_len=256] [remat=none] [repeats=3]
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax.config_cli import parse_cli
from sao_jax.models import Transformer, get_model_config
from sao_jax.models.steps import next_token_loss


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset (`sao_jax.models.config`); its depth is replaced by the two below.
    layers_small, layers_large: decoder layers of the two models compared.
    batch, seq_len: shape of the step's [B, T] token batch.
    remat: `ModelConfig.remat` of every model (none, full, dots_with_no_batch_dims).
    chunk_size: positions per chunk of the log-prob head.
    repeats: compiles per model, interleaved (caches cleared before each; the fastest is
      reported).
    """

    preset: str = "small"
    layers_small: int = 6
    layers_large: int = 24
    batch: int = 2
    seq_len: int = 256
    remat: str = "none"
    chunk_size: int = 256
    repeats: int = 3


def compile_step(cfg: BenchConfig, num_layers: int, scan_layers: bool) -> dict[str, float]:
    """Seconds to trace + lower and to compile the step, and the optimised program's size."""
    config = get_model_config(
        cfg.preset, num_layers=num_layers, scan_layers=scan_layers, remat=cfg.remat
    )
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq_len), jnp.int32)

    def step(params, tokens, mask):
        def loss(p):
            return next_token_loss(nnx.merge(graphdef, p), tokens, mask, chunk_size=cfg.chunk_size)

        return jax.value_and_grad(loss, has_aux=True)(params)

    jax.clear_caches()  # compile from scratch, whatever ran before
    start, start_cpu = time.perf_counter(), time.process_time()
    lowered = jax.jit(step).lower(params, tokens, tokens)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done, done_cpu = time.perf_counter(), time.process_time()
    return {
        "lower": lowered_at - start,
        "compile": done - lowered_at,
        "total": done - start,
        # CPU seconds of this process (every thread): what other jobs on the cores change least
        "cpu": done_cpu - start_cpu,
        "hlo_lines": len(compiled.as_text().splitlines()),
    }


def main(argv: list[str]) -> None:
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    depths = (cfg.layers_small, cfg.layers_large)
    print(
        f"value_and_grad of the LM loss, preset {cfg.preset}, batch {cfg.batch} x {cfg.seq_len}, "
        f"remat={cfg.remat}; {jax.device_count()} {jax.default_backend()} device(s)"
    )
    print(
        f"{'layers':6} {'layout':6} {'lower (s)':>9} {'compile (s)':>11} {'total (s)':>9} "
        f"{'CPU (s)':>8} {'HLO lines':>9}"
    )
    compile_step(cfg, 1, False)  # warm-up: XLA's one-off start-up costs land on no row
    models = [(layout, layers) for layout in ("loop", "scan") for layers in depths]
    runs: dict[tuple[str, int], list[dict[str, float]]] = {m: [] for m in models}
    for _ in range(cfg.repeats):  # interleaved, so a change in load hits every model alike
        for layout, layers in models:
            runs[layout, layers].append(compile_step(cfg, layers, layout == "scan"))
    results = {}
    for layout, layers in models:
        r = results[layout, layers] = min(runs[layout, layers], key=lambda run: run["cpu"])
        print(
            f"{layers:6d} {layout:6} {r['lower']:9.2f} {r['compile']:11.2f} "
            f"{r['total']:9.2f} {r['cpu']:8.2f} {r['hlo_lines']:9d}"
        )
    for layout in ("loop", "scan"):
        small, large = results[layout, depths[0]], results[layout, depths[1]]
        print(
            f"{layout}: {depths[1]}/{depths[0]} layers = {large['cpu'] / small['cpu']:.2f}x CPU "
            f"time ({large['total'] / small['total']:.2f}x wall, HLO lines "
            f"{large['hlo_lines'] / small['hlo_lines']:.2f}x)"
        )
    scan, loop = results["scan", depths[1]]["cpu"], results["loop", depths[1]]["cpu"]
    print(f"at {depths[1]} layers, scan compiles in {scan / loop:.2f}x the loop's CPU time")


if __name__ == "__main__":
    main(sys.argv[1:])
