"""Our Qwen3-MoE vs transformers' Qwen3MoeForCausalLM (torch CPU) on the same weights.

Builds a random Qwen3-MoE (default 4 layers, d=256, 16 experts, top-2), saves it in HF format,
loads it with `load_hf_qwen3_moe`, and measures side by side in one run:
- forward tokens/s on a [batch, seq_len] batch (ours: one jitted call; theirs: no_grad forward);
- greedy generation tokens/s, `batch` prompts of `prompt_len` tokens, `new_tokens` new tokens
  each (ours: `Sampler.generate`; theirs: `model.generate(do_sample=False)`).
Compilation and torch warm-up are excluded (one untimed run each). Prints the ratios and how
many greedy tokens agree. `parts=true` also times the forward's parts side by side on the same
[batch, seq_len] activations -- the backbone (embedding, layers, final norm), the LM head, one
attention block and one MoE block (router + experts), and the four MoE blocks chained -- to
show where one framework's forward loses to the other's.

    python benchmarks/model_vs_hf.py [batch=8] [new_tokens=128] [repeats=5] [parts=false]
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from sao_jax.config_cli import parse_cli
from sao_jax.models import load_hf_qwen3_moe
from sao_jax.rollout import Sampler, SamplingParams


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    layers: decoder layers. d_model: hidden size. experts: routed experts. top_k: experts per
    token. moe_hidden: expert hidden width. vocab: vocabulary size.
    batch: rows per forward / generation batch. seq_len: forward sequence length.
    prompt_len: generation prompt length. new_tokens: greedy tokens generated per row.
    repeats: timed repetitions (the best is reported).
    threads: 0 = each framework's default (all cores); n > 0 = n intra-op threads for both
    (use threads=1 under `taskset -c 0` when other jobs share the machine: oversubscribed
    OpenMP threads make torch's multi-threaded timings meaningless).
    parts: also time the forward's parts (backbone, LM head, attention, MoE) side by side.
    """

    layers: int = 4
    d_model: int = 256
    experts: int = 16
    top_k: int = 2
    moe_hidden: int = 256
    vocab: int = 8192
    batch: int = 8
    seq_len: int = 128
    prompt_len: int = 32
    new_tokens: int = 128
    repeats: int = 5
    threads: int = 0
    parts: bool = False


def best_times(fns: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each function; repetitions interleave the contenders so that load
    from other processes hits both sides alike."""
    for fn in fns.values():
        fn()  # warm-up / compile
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def part_times(cfg: BenchConfig, ours, theirs, ids: np.ndarray) -> dict[str, tuple[float, float]]:
    """Best seconds of each part of the forward, (ours, theirs), on the same inputs: token ids
    for the backbone, random [batch, seq_len, d_model] activations for the rest."""
    from transformers.masking_utils import create_causal_mask

    from sao_jax.models.layers import attention_context

    b, t = ids.shape
    hidden = np.random.default_rng(1).standard_normal((b, t, cfg.d_model)).astype(np.float32)
    graphdef, params = nnx.split(ours)

    def jitted(fn):
        compiled = jax.jit(lambda p, x: fn(nnx.merge(graphdef, p), x))
        return lambda x: lambda: jax.block_until_ready(compiled(params, x))

    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    valid = jnp.ones((b, t), bool)

    def attention(model, x):
        ctx = attention_context(
            positions,
            jnp.ones((b, t), jnp.int32),
            head_dim=model.config.head_dim,
            rope_theta=model.config.rope_theta,
        )
        return model.layers[0].attn(x, ctx, None)[0]

    def moe_chain(model, x):
        for layer in model.layers:
            x = layer.moe(x, valid)[0]
        return x

    h_jax, h_torch = jnp.asarray(hidden), torch.tensor(hidden)
    ids_jax, ids_torch = jnp.asarray(ids), torch.tensor(ids, dtype=torch.long)
    position_ids = torch.arange(t)[None].expand(b, t)
    rope = theirs.model.rotary_emb(h_torch, position_ids=position_ids)
    mask = create_causal_mask(
        config=theirs.config,
        inputs_embeds=h_torch,
        attention_mask=torch.ones(b, t, dtype=torch.long),
        cache=None,
        position_ids=position_ids,
    )
    first = theirs.model.layers[0]

    def torch_moe_chain():
        x = h_torch
        for layer in theirs.model.layers:
            x = layer.mlp(x)
        return x

    parts = {
        "backbone": (
            jitted(lambda m, x: m.forward(x).hidden)(ids_jax),
            lambda: theirs.model(ids_torch).last_hidden_state,
        ),
        "LM head": (jitted(lambda m, x: m.logits(x))(h_jax), lambda: theirs.lm_head(h_torch)),
        "1 attention block": (
            jitted(attention)(h_jax),
            lambda: first.self_attn(h_torch, position_embeddings=rope, attention_mask=mask)[0],
        ),
        "1 MoE block": (
            jitted(lambda m, x: m.layers[0].moe(x, valid)[0])(h_jax),
            lambda: first.mlp(h_torch),
        ),
        f"{cfg.layers} MoE blocks": (jitted(moe_chain)(h_jax), torch_moe_chain),
    }
    with torch.no_grad():
        times = {}
        for name, (run_ours, run_theirs) in parts.items():
            best = best_times({"ours": run_ours, "theirs": run_theirs}, cfg.repeats)
            times[name] = (best["ours"], best["theirs"])
    return times


def main(argv: list[str]) -> None:
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    if cfg.threads > 0:  # before JAX creates its CPU client
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_cpu_multi_thread_eigen={str(cfg.threads > 1).lower()}"
            + f" intra_op_parallelism_threads={cfg.threads}"
        )
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(0)
    hf_config = Qwen3MoeConfig(
        vocab_size=cfg.vocab,
        hidden_size=cfg.d_model,
        intermediate_size=4 * cfg.d_model,
        moe_intermediate_size=cfg.moe_hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=cfg.d_model // 8,
        num_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    theirs = Qwen3MoeForCausalLM(hf_config).eval()
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = load_hf_qwen3_moe(tmp, dtype=jnp.float32)
    rng = np.random.default_rng(0)

    # Forward.
    ids = rng.integers(0, cfg.vocab, (cfg.batch, cfg.seq_len)).astype(np.int32)
    graphdef, params = nnx.split(ours)
    forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
    ids_jax, ids_torch = jnp.asarray(ids), torch.tensor(ids, dtype=torch.long)

    def run_ours():
        return forward(params, ids_jax).block_until_ready()

    def run_theirs():
        with torch.no_grad():
            return theirs(ids_torch).logits

    diff = float(np.abs(np.asarray(run_ours()) - run_theirs().numpy()).max())
    best = best_times({"ours": run_ours, "theirs": run_theirs}, cfg.repeats)
    tokens = cfg.batch * cfg.seq_len
    fwd = (tokens / best["ours"], tokens / best["theirs"])

    # Greedy generation.
    prompts = rng.integers(0, cfg.vocab, (cfg.batch, cfg.prompt_len))
    sampler = Sampler(ours)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=cfg.new_tokens)
    result = {}

    def gen_ours():
        result["ours"] = sampler.generate(prompts.tolist(), greedy).tokens

    prompt_torch = torch.tensor(prompts, dtype=torch.long)

    def gen_theirs():
        with torch.no_grad():
            out = theirs.generate(
                prompt_torch,
                attention_mask=torch.ones_like(prompt_torch),
                do_sample=False,
                max_new_tokens=cfg.new_tokens,
                min_new_tokens=cfg.new_tokens,
                pad_token_id=0,
            )
        result["theirs"] = out[:, cfg.prompt_len :].numpy()

    best = best_times({"ours": gen_ours, "theirs": gen_theirs}, cfg.repeats)
    generated = cfg.batch * cfg.new_tokens
    gen = (generated / best["ours"], generated / best["theirs"])
    agree = float(np.mean(result["ours"] == result["theirs"]))
    first_split = np.argmax(np.any(result["ours"] != result["theirs"], axis=0))

    print(
        f"Qwen3-MoE {cfg.layers} layers, d={cfg.d_model}, {cfg.experts} experts top-{cfg.top_k}, "
        f"vocab {cfg.vocab}; f32 on {jax.device_count()} {jax.default_backend()} device(s), "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads; best of {cfg.repeats}"
    )
    print(f"forward logits max |ours - transformers| = {diff:.2e}")
    print(f"{'':32} {'ours':>10} {'transformers':>13} {'ratio':>7}")
    print(
        f"{f'forward tok/s [{cfg.batch}x{cfg.seq_len}]':32} {fwd[0]:10.0f} {fwd[1]:13.0f} "
        f"{fwd[0] / fwd[1]:6.2f}x"
    )
    print(
        f"{f'greedy gen tok/s [{cfg.batch}x{cfg.new_tokens} new]':32} {gen[0]:10.0f} "
        f"{gen[1]:13.0f} {gen[0] / gen[1]:6.2f}x"
    )
    print(
        f"greedy tokens identical: {agree:.1%}"
        + ("" if agree == 1.0 else f" (first divergence at step {first_split})")
    )
    if cfg.parts:
        print(f"\n{'part of the forward':32} {'ours (ms)':>10} {'transformers':>13} {'ratio':>7}")
        for name, (t_ours, t_theirs) in part_times(cfg, ours, theirs, ids).items():
            print(
                f"{name:32} {t_ours * 1e3:10.2f} {t_theirs * 1e3:13.2f} {t_theirs / t_ours:6.2f}x"
            )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
