"""Properties every per-token objective shares, checked across all of them.

Padding (rows or columns with mask 0 holding NaN / inf / junk) changes nothing; bf16 inputs give
float32 outputs that accumulate in float32; an all-zero mask gives finite values and exactly zero
gradients; jit and eager agree.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sao_jax.losses import (
    kl_estimate,
    masked_token_mean,
    ppo_clip_loss,
    sao_policy_loss,
    sao_value_loss,
    seed_opd_loss,
)

# Each case: loss(x, y, z, mask) -> (loss, metrics), differentiated in x. x and y play the two
# log-prob (or value / return) arguments, z the advantages or old values.
CASES = {
    "sao_policy_loss": lambda x, y, z, m: sao_policy_loss(x, y, z, m),
    "sao_value_loss": lambda x, y, z, m: sao_value_loss(x, y, m),
    "sao_value_loss_clipped": lambda x, y, z, m: sao_value_loss(
        x, y, m, old_values=z, value_clip=0.2
    ),
    "ppo_clip_loss": lambda x, y, z, m: ppo_clip_loss(x, y, z, m, dual_clip=3.0),
    "seed_opd_gated": lambda x, y, z, m: seed_opd_loss(x, y, m),
    "seed_opd_signed": lambda x, y, z, m: seed_opd_loss(x, y, m, mode="signed", clip=0.3),
    "kl_k1": lambda x, y, z, m: kl_estimate(x, y, m, kind="k1"),
    "kl_k2": lambda x, y, z, m: kl_estimate(x, y, m, kind="k2"),
    "kl_k3": lambda x, y, z, m: kl_estimate(x, y, m, kind="k3"),
    "masked_token_mean": lambda x, y, z, m: (masked_token_mean(x, m), {}),
}
B, T = 3, 8
PADDED_B, PADDED_T = 5, 12
JUNK = np.array([np.nan, np.inf, -np.inf, 1e30, -7.0], np.float32)


@functools.cache
def value_and_grad(name):
    """jit(value_and_grad) of a case, built once per case so each shape compiles once."""
    return jax.jit(jax.value_and_grad(CASES[name], has_aux=True))


def make_inputs(seed, mask):
    """x, y near -1 with log-ratios mostly inside every clip window, z of either sign."""
    rng = np.random.default_rng(seed)
    x = rng.normal(-1.0, 0.3, size=mask.shape).astype(np.float32)
    y = (x + rng.normal(0.0, 0.3, size=mask.shape)).astype(np.float32)
    z = rng.normal(0.0, 1.0, size=mask.shape).astype(np.float32)
    return x, y, z


def pad_with_junk(array, rng):
    padded = rng.choice(JUNK, size=(PADDED_B, PADDED_T)).astype(array.dtype)
    padded[:B, :T] = array
    return padded


def assert_same_results(got, expected, rtol=1e-6, atol=1e-6):
    (loss, metrics), grad = got
    (expected_loss, expected_metrics), expected_grad = expected
    np.testing.assert_allclose(loss, expected_loss, rtol=rtol, atol=atol)
    assert metrics.keys() == expected_metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(metrics[key], expected_metrics[key], rtol=rtol, atol=atol)
    np.testing.assert_allclose(grad, expected_grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mask=hnp.arrays(np.bool_, (B, T)))
def test_padding_changes_nothing(name, seed, mask):
    x, y, z = make_inputs(seed, mask)
    mask = mask.astype(np.float32)
    expected = value_and_grad(name)(x, y, z, mask)
    rng = np.random.default_rng(seed)
    padded_mask = np.zeros((PADDED_B, PADDED_T), np.float32)
    padded_mask[:B, :T] = mask
    padded_x, padded_y, padded_z = (pad_with_junk(a, rng) for a in (x, y, z))
    # Inside the original block, masked-out tokens get junk too.
    padded_x[:B, :T] = np.where(mask > 0, x, rng.choice(JUNK, size=(B, T)))
    (loss, metrics), grad = value_and_grad(name)(padded_x, padded_y, padded_z, padded_mask)
    grad = np.asarray(grad)
    assert np.all(grad[padded_mask == 0] == 0.0), "padding must get exactly zero gradient"
    assert_same_results(((loss, metrics), grad[:B, :T]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", CASES)
def test_all_zero_mask_is_finite_with_zero_gradients(name):
    rng = np.random.default_rng(0)
    x, y, z = (rng.choice(JUNK, size=(B, T)) for _ in range(3))
    (loss, metrics), grad = value_and_grad(name)(x, y, z, np.zeros((B, T), np.float32))
    assert loss == 0.0
    assert all(np.isfinite(value) for value in metrics.values())
    assert np.all(grad == 0.0)


@pytest.mark.parametrize("name", CASES)
def test_bf16_inputs_give_float32_outputs_accumulated_in_float32(name):
    mask = np.random.default_rng(1).random((B, T)) < 0.7
    x, y, z = (jnp.asarray(a, jnp.bfloat16) for a in make_inputs(1, mask))
    bf16_mask = jnp.asarray(mask, jnp.bfloat16)
    (loss, metrics), grad = value_and_grad(name)(x, y, z, bf16_mask)
    assert loss.dtype == jnp.float32
    assert all(value.dtype == jnp.float32 for value in metrics.values())
    assert grad.dtype == jnp.bfloat16, "the gradient comes back in the dtype of its input"
    upcast = [a.astype(jnp.float32) for a in (x, y, z)]
    expected = value_and_grad(name)(*upcast, mask.astype(np.float32))
    # Same numbers as float32 inputs of the same values; the gradient was rounded to bf16.
    (expected_loss, expected_metrics), expected_grad = expected
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6, atol=1e-6)
    for key in metrics:
        np.testing.assert_allclose(metrics[key], expected_metrics[key], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad.astype(np.float32), expected_grad, rtol=1e-2, atol=1e-4)


def test_long_bf16_token_sums_do_not_stall():
    # In bf16, 256 + 1 rounds back to 256: a bf16 accumulator would report a mean of 1/16 here.
    tokens = 4096
    logp = jnp.full((1, tokens), -1.0, jnp.bfloat16)
    advantages = jnp.ones((1, tokens), jnp.bfloat16)
    mask = jnp.ones((1, tokens), jnp.bfloat16)
    loss, metrics = sao_policy_loss(logp, logp, advantages, mask)
    assert loss == 1.0 and metrics["num_tokens"] == tokens
    np.testing.assert_allclose(masked_token_mean(-logp, mask), 1.0)


@pytest.mark.parametrize("name", CASES)
def test_jit_matches_eager(name):
    mask = (np.random.default_rng(2).random((B, T)) < 0.6).astype(np.float32)
    inputs = make_inputs(2, mask)
    eager = jax.value_and_grad(CASES[name], has_aux=True)(*inputs, mask)
    assert_same_results(value_and_grad(name)(*inputs, mask), eager, rtol=1e-5, atol=1e-6)
