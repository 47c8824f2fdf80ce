"""Shared pieces of the rollout tests: one word tokenizer, one tiny random MoE policy, one
sampler (cached per process so every test module reuses its compiled kernels), a full-forward
log-prob reference, and ATDP store / loader helpers."""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.envs.alfworld import vocabulary
from sao_jax.models import Transformer, get_model_config, init_model, token_logprobs_from_logits
from sao_jax.rollout import EnvConfig, RolloutConfig, Sampler
from sao_jax.tokenizers import WordTokenizer

NUM_ENVS = 4
CONTEXT = 1024  # one cache length for every test: the sampler compiles each shape once
SEQ_LEN = 1024


@functools.cache
def tokenizer() -> WordTokenizer:
    return WordTokenizer.from_texts([" ".join(vocabulary())])


def small_moe_config(vocab_size: int, **overrides):
    """The rollout tests' random policy: the tiny preset at width 32 with 4 experts, weights
    large enough (initializer 0.3) that sampling is far from uniform."""
    widths = dict(
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        num_experts=4,
        moe_intermediate_size=16,
        initializer_range=0.3,
    )
    return get_model_config("tiny", vocab_size=vocab_size, **{**widths, **overrides})


@functools.cache
def model_config():
    return small_moe_config(tokenizer().vocab_size, dense_intermediate_size=64)


@functools.cache
def model() -> Transformer:
    return init_model(model_config())


@functools.cache
def sampler() -> Sampler:
    """The shared sampler (compiled once per process); at version 0 between tests."""
    # One prompt bucket below the cache length: few shapes, few compiles.
    return Sampler(model(), pad_id=tokenizer().pad_id, min_prompt_bucket=512)


@functools.cache
def dis_learner():
    """A GRPO+DIS learner holding the rollout policy's weights, dropless like the sampler (so a
    token's log-prob never depends on what shares its batch)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from train_factories import exact_learner_config

    from sao_jax.train import Learner

    dropless = model_config().replace(capacity_factor=0.0)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(dropless, rngs=nnx.Rngs(0))))
    policy = nnx.merge(graphdef, nnx.clone(nnx.state(model())))
    return Learner(exact_learner_config(algorithm="grpo_dis"), policy)


@contextlib.contextmanager
def borrowed_sampler():
    """The shared sampler for a test that changes its weights; restored to version 0 after."""
    try:
        yield sampler()
    finally:
        sampler().update_weights(model(), 0)


def rollout_config(**overrides) -> RolloutConfig:
    base = dict(max_new_tokens=12, max_context_tokens=CONTEXT, decode_chunk=4)
    return RolloutConfig(**{**base, **overrides})


def env_config(**overrides) -> EnvConfig:
    return EnvConfig(**{"max_steps": 3, **overrides})


def other_weights():
    """A second parameter set of the same shapes (no new compile, unlike a second init)."""
    return jax.tree.map(lambda x: -1.5 * x, nnx.state(model()))


@functools.cache
def _logprob_fn():
    dropless = model_config().replace(capacity_factor=0.0)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(dropless, rngs=nnx.Rngs(0))))

    @jax.jit
    def logprobs(params, tokens, segment_ids):
        logits = nnx.merge(graphdef, params)(tokens, segment_ids=segment_ids)
        return token_logprobs_from_logits(logits[:, :-1], tokens[:, 1:])[0]

    return logprobs


def forward_logprobs(tokens: np.ndarray, segment_ids: np.ndarray, params=None) -> np.ndarray:
    """[R, T] batch -> [R, T] log p(token t | tokens < t) by a full forward pass (0 at t=0)
    under `params` (default: the shared model's).

    Row by row, padded to one width, so every test shares one compiled shape.
    """
    params = nnx.state(model()) if params is None else params
    out = np.zeros(tokens.shape, np.float32)
    for r in range(tokens.shape[0]):
        n = int(segment_ids[r].sum())
        if n < 2:
            continue
        row = np.zeros((1, SEQ_LEN), np.int32)
        row[0, :n] = tokens[r, :n]
        segments = (np.arange(SEQ_LEN) < n).astype(np.int32)[None]
        logp = np.asarray(_logprob_fn()(params, row, segments))[0]
        out[r, 1:n] = logp[: n - 1]
    return out


def open_store(path) -> AtdpStore:
    return AtdpStore.open(str(path))


def read_batches(
    store: AtdpStore, tenant: str, layout: str, *, rows: int = 64, mask_replay=None, **config
) -> list:
    """Every batch of one unshuffled epoch over `tenant`, plus the loader (for its stats);
    `mask_replay` rebuilds constrained calls' masks."""
    loader = AtdpLoader(
        store,
        [tenant],
        principal=tenant,
        config=LoaderConfig(rows=rows, seq_len=SEQ_LEN, layout=layout, **config),
        mask_replay=mask_replay,
    )
    return list(loader.epoch(shuffle=False)), loader
