"""Model FLOPs utilisation of a training step against this CPU's own matmul throughput.

In one run: (1) the best f32 matmul FLOP/s this machine reaches through XLA (square matmuls,
the ceiling any model step could approach), (2) the best time of a jitted next-token training
step (forward + backward + AdamW, `sao_jax.models.steps.make_lm_train_step`) of each preset.
MFU = model FLOPs per step / step time / matmul FLOP/s. Model FLOPs count only useful work:
6 x (matmul parameters a token activates, top-k experts only) per token plus causal-attention
scores and mixing, not the capacity padding, routing or optimizer.

    python benchmarks/mfu.py [presets=[tiny,small]] [batch=8] [seq_len=256] [steps=3]
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sao_jax.config_cli import parse_cli
from sao_jax.models import ModelConfig, Transformer, get_model_config, init_model
from sao_jax.models.steps import make_lm_train_step


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    presets: model presets to measure.
    vocab: vocabulary size (presets are sized for a tokenizer that overrides it).
    batch: rows per step. seq_len: tokens per row. steps: timed steps (best is reported).
    matmul_size: side of the square matmuls that measure peak FLOP/s.
    """

    presets: list[str] = dataclasses.field(default_factory=lambda: ["tiny", "small"])
    vocab: int = 4096
    batch: int = 8
    seq_len: int = 256
    steps: int = 3
    matmul_size: int = 2048


def matmul_flops_per_s(size: int, repeats: int = 10) -> float:
    """Best f32 FLOP/s of a jitted [size, size] @ [size, size] on the default device."""
    a = jnp.asarray(np.random.default_rng(0).normal(size=(size, size)), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def model_flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 x active matmul parameters + causal attention (fwd x 3)."""
    d, h, k, dh = config.d_model, config.num_heads, config.num_kv_heads, config.head_dim
    attention = d * h * dh * 2 + 2 * d * k * dh
    dense = 3 * d * config.dense_intermediate_size
    moe = (
        d * config.num_experts + config.num_experts_per_token * 3 * d * config.moe_intermediate_size
    )
    per_layer = [
        attention + (moe if config.is_moe_layer(i) else dense) for i in range(config.num_layers)
    ]
    params = sum(per_layer) + d * config.vocab_size  # + LM head
    # QK^T and PV: 2 x 2 x h x dh flops per (query, key) pair; causal: (T + 1) / 2 keys.
    scores = config.num_layers * 4 * h * dh * (seq_len + 1) / 2
    return 6 * params + 3 * scores


def time_train_step(config: ModelConfig, batch: int, seq_len: int, steps: int) -> dict:
    model = init_model(config)
    (params, opt_state), step = make_lm_train_step(model, optax.adamw(1e-4), chunk_size=128)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (batch, seq_len)), jnp.int32)
    mask = jnp.ones_like(tokens)
    params, opt_state, metrics = step(params, opt_state, tokens, mask)  # compile
    jax.block_until_ready(metrics)
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        params, opt_state, metrics = step(params, opt_state, tokens, mask)
        jax.block_until_ready((params, metrics))
        best = min(best, time.perf_counter() - start)
    return {"step_s": best, "dropped": float(metrics["dropped_fraction"])}


def model_shapes(config: ModelConfig) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))


def main(argv: list[str]) -> None:
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    tokens = cfg.batch * cfg.seq_len
    peak = matmul_flops_per_s(cfg.matmul_size)
    rows = []
    for name in cfg.presets:
        config = get_model_config(name, vocab_size=cfg.vocab)
        result = time_train_step(config, cfg.batch, cfg.seq_len, cfg.steps)
        # Re-measure the ceiling next to each step so load from other jobs hits both alike;
        # the best of the run is the denominator.
        peak = max(peak, matmul_flops_per_s(cfg.matmul_size))
        flops = model_flops_per_token(config, cfg.seq_len) * tokens / result["step_s"]
        n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model_shapes(config))))
        rows.append((name, n_params, result, flops))
    print(
        f"{jax.device_count()} {jax.default_backend()} device(s); best f32 matmul "
        f"{cfg.matmul_size}^3 of the run: {peak / 1e9:.1f} GFLOP/s"
    )
    print(f"train step: batch {cfg.batch} x {cfg.seq_len} tokens, AdamW, best of {cfg.steps}")
    print(
        f"{'preset':8} {'params':>8} {'step (s)':>9} {'tok/s':>8} {'model GFLOP/s':>14} "
        f"{'MFU':>6} {'dropped':>8}"
    )
    for name, n_params, result, flops in rows:
        print(
            f"{name:8} {n_params / 1e6:7.1f}M {result['step_s']:9.3f} "
            f"{tokens / result['step_s']:8.0f} {flops / 1e9:14.1f} {flops / peak:6.1%} "
            f"{result['dropped']:8.1%}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
