"""Grouped-query attention on XLA:CPU: query heads stacked per kv head vs K/V repeated per head.

`sao_jax.models.layers.attend` has two layouts: `attend_stacked` (the G query heads sharing a kv
head stacked along the query axis; K/V read once) and `attend_repeated` (K/V repeated to every
query head; one [T, S] block per head). This jits forward + backward of each on the same
random [B, T, H, Dh] queries and [B, K, T, Dh] keys / values under a causal mask (the learner's
and the cloner's case, T > 1), checks they agree, and times them alternately, best of
`repeats`; it prints the seconds of each and the ratio stacked / repeated.

    python benchmarks/attention_layout.py [batch=32] [seq_len=224] [heads=4] [kv_heads=2] \\
        [head_dim=32] [repeats=10]
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.config_cli import parse_cli
from sao_jax.models.layers import attend_repeated, attend_stacked


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    batch, seq_len: rows and tokens per row (defaults: a tiny-preset learner batch's shape).
    heads, kv_heads, head_dim: the attention's shape (defaults: the tiny preset's).
    repeats: timed calls per layout, alternating; the fastest is reported.
    """

    batch: int = 32
    seq_len: int = 224
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    repeats: int = 10


def forward_backward(attention):
    """jit(grad of a scalar of the attention output w.r.t. q, k, v), and the output itself."""

    def loss(q, k, v, mask):
        return jnp.sum(jnp.sin(attention(q, k, v, mask)))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def main(argv: list[str] | None = None) -> dict[str, float]:
    cfg = parse_cli(argv, {"default": BenchConfig()}, prog="attention_layout.py", save=False)
    rng = np.random.default_rng(0)
    b, t, h, k, d = cfg.batch, cfg.seq_len, cfg.heads, cfg.kv_heads, cfg.head_dim
    q = jnp.asarray(rng.standard_normal((b, t, h, d)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((b, k, t, d)), jnp.float32)
    values = jnp.asarray(rng.standard_normal((b, k, t, d)), jnp.float32)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    layouts = {
        "stacked": forward_backward(attend_stacked),
        "repeated": forward_backward(attend_repeated),
    }
    outputs = {
        name: jax.block_until_ready(fn(q, keys, values, mask)) for name, fn in layouts.items()
    }
    stacked, repeated = (jax.tree.leaves(outputs[name]) for name in ("stacked", "repeated"))
    for a, b_ in zip(stacked, repeated, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=2e-4, atol=2e-4)
    best = dict.fromkeys(layouts, float("inf"))
    for _ in range(cfg.repeats):
        for name, fn in layouts.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, keys, values, mask))
            best[name] = min(best[name], time.perf_counter() - start)
    print(f"attention fwd+bwd [{b}, {t}] H={h} K={k} Dh={d}, best of {cfg.repeats}:")
    for name, seconds in best.items():
        print(f"  {name:9s} {seconds * 1e3:8.2f} ms")
    ratio = best["stacked"] / best["repeated"]
    print(f"  stacked / repeated: {ratio:.2f}x")
    return {**best, "ratio": ratio}


if __name__ == "__main__":
    main()
