"""Train-step time with many more experts at the same active size (top-k and expert width).

A sorted dispatch should cost what the top-k experts cost, whatever the number of experts;
only the router, the parameter count and the optimizer update grow with it. This runs the same
jitted training step (forward + backward + AdamW) at `experts_small` and `experts_large`
routed experts, top-k fixed, side by side, for each dispatch in `dispatches`, and prints the
time ratio (target <= 1.3 for the CPU default, "sorted_capacity").

    python benchmarks/moe_scaling.py [experts_small=8] [experts_large=64] [batch=16]
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sao_jax.config_cli import parse_cli
from sao_jax.models import get_model_config, init_model
from sao_jax.models.steps import make_lm_train_step


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    experts_small, experts_large: routed experts of the two models compared.
    top_k: experts per token (both models). d_model, expert_hidden, layers, vocab: model size.
    capacity_factor: expert capacity of the capacity-bounded dispatch.
    dispatches: MoE dispatch implementations to compare.
    batch, seq_len: tokens per step. repeats: timed steps per model (the best is reported).
    """

    experts_small: int = 8
    experts_large: int = 64
    top_k: int = 2
    d_model: int = 256
    expert_hidden: int = 256
    layers: int = 4
    vocab: int = 4096
    capacity_factor: float = 1.25
    dispatches: list[str] = dataclasses.field(default_factory=lambda: ["sorted_capacity"])
    batch: int = 16
    seq_len: int = 256
    repeats: int = 3


def make_step(cfg: BenchConfig, num_experts: int, dispatch: str):
    config = get_model_config(
        "tiny",
        vocab_size=cfg.vocab,
        d_model=cfg.d_model,
        num_heads=8,
        num_kv_heads=4,
        head_dim=cfg.d_model // 8,
        num_layers=cfg.layers,
        num_experts=num_experts,
        num_experts_per_token=cfg.top_k,
        moe_intermediate_size=cfg.expert_hidden,
        capacity_factor=cfg.capacity_factor,
        moe_dispatch=dispatch,
    )
    (params, opt_state), step = make_lm_train_step(
        init_model(config), optax.adamw(1e-4), chunk_size=128
    )
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return {"state": (params, opt_state), "step": step, "params": n_params}


def main(argv: list[str]) -> None:
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab, (cfg.batch, cfg.seq_len)), jnp.int32)
    mask = jnp.ones_like(tokens)
    print(
        f"train step, {cfg.layers} layers, d={cfg.d_model}, expert hidden {cfg.expert_hidden}, "
        f"top-{cfg.top_k}, batch {cfg.batch} x {cfg.seq_len}, AdamW; best of {cfg.repeats}, "
        f"interleaved; {jax.device_count()} {jax.default_backend()} device(s)"
    )
    print(f"{'dispatch':16} {'experts':>8} {'params':>9} {'step (s)':>9} {'ratio':>7}")
    for dispatch in cfg.dispatches:
        runs = {e: make_step(cfg, e, dispatch) for e in (cfg.experts_small, cfg.experts_large)}
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(cfg.repeats + 1):  # the first round compiles
            for e, run in runs.items():
                start = time.perf_counter()
                params, opt_state, metrics = run["step"](*run["state"], tokens, mask)
                jax.block_until_ready((params, metrics))
                run["state"] = (params, opt_state)
                best[e] = min(best[e], time.perf_counter() - start)
        for e, run in runs.items():
            ratio = best[e] / best[cfg.experts_small]
            print(f"{dispatch:16} {e:8d} {run['params'] / 1e6:8.1f}M {best[e]:9.3f} {ratio:6.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
