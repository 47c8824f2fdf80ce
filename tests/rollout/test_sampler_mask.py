"""Constrained decoding in the sampler: a per-row token bitmask applied inside the jitted
prefill and decode, and behaviour log-probs (the distribution actually sampled: temperature,
top-k, top-p, mask) checked against a NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_testlib import small_moe_config

from sao_jax.models import init_model
from sao_jax.rollout import Sampler, SamplingParams
from sao_jax.rollout.sampling import allowed_tokens, behaviour_logprob, token_logprob

VOCAB = 61
CONFIG = small_moe_config(VOCAB)


def bitmask(rows: list[list[int] | None]) -> np.ndarray:
    """[n, ceil(V/32)] int32 allowing the listed ids per row (None: every id)."""
    words = (VOCAB + 31) // 32
    mask = np.zeros((len(rows), words), np.uint32)
    for r, ids in enumerate(rows):
        if ids is None:
            mask[r] = 0xFFFFFFFF
        for i in ids or ():
            mask[r, i // 32] |= np.uint32(1 << (i % 32))
    return mask.view(np.int32)


def reference_behaviour(logits, token, temperature, top_k, top_p, allowed):
    """The sampled distribution in NumPy: mask, temperature, top-k, then top-p (HF order)."""
    if temperature == 0:
        return 0.0
    z = np.where(allowed, logits / temperature, -np.inf)
    order = np.argsort(-z, kind="stable")
    p = np.exp(z[order] - z[order][0])
    p /= p.sum()
    keep = np.ones_like(p, bool) if top_k == 0 else np.arange(len(p)) < top_k
    p = np.where(keep, p, 0.0)
    p /= p.sum()
    before = np.cumsum(p) - p
    p = np.where(keep & (before < top_p), p, 0.0)
    probs = np.zeros_like(p)
    probs[order] = p
    with np.errstate(divide="ignore"):  # a token outside the kept set: -inf, as expected
        return float(np.log(probs[token] / probs.sum()))


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "allowed"),
    [
        (1.0, 0, 1.0, None),
        (0.7, 0, 1.0, None),
        (1.3, 5, 1.0, None),
        (0.8, 0, 0.6, None),
        (1.0, 4, 0.9, [1, 2, 3, 5, 8, 13, 21, 34]),
        (0.0, 0, 1.0, [7, 9]),
    ],
)
def test_behaviour_logprob_is_the_sampled_distribution(temperature, top_k, top_p, allowed):
    logits = jax.random.normal(jax.random.key(0), (1, VOCAB)) * 3
    mask = bitmask([allowed])
    allowed_row = np.asarray(allowed_tokens(jnp.asarray(mask), VOCAB))[0]
    masked = jnp.where(allowed_row, logits, -jnp.inf)
    row = lambda v, dt: jnp.asarray([v], dt)  # noqa: E731
    args = (row(temperature, jnp.float32), row(top_k, jnp.int32), row(top_p, jnp.float32))
    for token in np.flatnonzero(allowed_row)[:6]:
        got = float(behaviour_logprob(masked, jnp.asarray([token]), *args)[0])
        want = reference_behaviour(
            np.asarray(logits[0]), token, temperature, top_k, top_p, allowed_row
        )
        if np.isfinite(want):
            assert got == pytest.approx(want, abs=1e-5)
        else:
            assert got == -np.inf
    if allowed is None and temperature == 1.0 and top_k == 0 and top_p == 1.0:
        tokens = jnp.arange(5)
        plain = jnp.repeat(logits, 5, axis=0)
        rows5 = (jnp.ones(5), jnp.zeros(5, jnp.int32), jnp.ones(5))
        np.testing.assert_allclose(
            behaviour_logprob(plain, tokens, *rows5), token_logprob(plain, tokens), atol=1e-5
        )


def test_masked_prefill_and_decode_sample_only_allowed_ids():
    sampler = Sampler(init_model(CONFIG), pad_id=0)
    state = sampler.init_state(4, 64)
    sampling = [SamplingParams(temperature=1.0, max_new_tokens=20, seed=s) for s in range(3)]
    allowed = [[3, 7], [11], None]
    state, first, logp, _, behaviour = sampler.prefill(
        state,
        [[5, 9, 2], [33], [10, 11]],
        [0, 1, 2],
        sampling,
        token_mask=bitmask(allowed),
        behaviour=True,
    )
    assert first[0] in (3, 7) and first[1] == 11
    assert behaviour[1] == pytest.approx(0.0, abs=1e-6)  # one allowed id: all the mass
    assert logp[1] < -1e-3  # the policy's own log-prob (temperature 1, unmasked) is kept
    assert behaviour[2] == pytest.approx(logp[2], abs=1e-5)  # unmasked, temperature 1
    for _ in range(5):
        slot_mask = bitmask([[3, 7], [11], None, None])
        state, tokens, logp, _, behaviour = sampler.decode(
            state, 1, token_mask=slot_mask, behaviour=True
        )
        assert tokens[0, 0] in (3, 7) and tokens[1, 0] == 11
        assert behaviour[0, 0] <= 0 and behaviour[0, 0] > logp[0, 0] - 1e-6
    with pytest.raises(ValueError, match="num_steps=1"):
        sampler.decode(state, 2, token_mask=bitmask([None] * 4))
    with pytest.raises(ValueError, match="int32"):
        sampler.decode(state, 1, token_mask=np.zeros((4, 2), np.int64))
