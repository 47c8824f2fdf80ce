"""token_logprobs: log-softmax of logits / temperature gathered at the tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import token_logprobs


def _numpy_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_matches_log_softmax_gather_with_temperature():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32) * 3
    tokens = rng.integers(0, 7, size=(2, 5)).astype(np.int32)
    for temperature in (1.0, 0.7):
        expected = np.take_along_axis(
            _numpy_log_softmax(logits / temperature), tokens[..., None], -1
        )
        got = jax.jit(token_logprobs)(logits, tokens, temperature)
        assert got.dtype == jnp.float32 and got.shape == (2, 5)
        np.testing.assert_allclose(got, expected[..., 0], rtol=1e-5, atol=1e-5)


def test_uniform_logits_give_minus_log_vocab():
    got = token_logprobs(jnp.zeros((1, 3, 4)), jnp.array([[0, 1, 3]]))
    np.testing.assert_allclose(got, np.full((1, 3), -np.log(4.0)), rtol=1e-6)


def test_gradient_is_onehot_minus_softmax():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(1, 3, 5)), jnp.float32)
    tokens = jnp.array([[4, 0, 2]])
    grad = jax.grad(lambda x: token_logprobs(x, tokens).sum())(logits)
    expected = jax.nn.one_hot(tokens, 5) - jax.nn.softmax(logits, axis=-1)
    np.testing.assert_allclose(grad, expected, atol=1e-6)


def test_bf16_logits_reduce_in_float32():
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(2, 3, 4096)) * 4, jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, 4096, size=(2, 3)))
    got = token_logprobs(logits, tokens)
    assert got.dtype == jnp.float32
    reference = token_logprobs(logits.astype(jnp.float32), tokens)
    np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-6)


def test_out_of_range_token_is_nan_not_a_silent_wrong_value():
    got = token_logprobs(jnp.zeros((1, 2, 4)), jnp.array([[1, 4]]))
    assert np.isfinite(got[0, 0]) and np.isnan(got[0, 1])


@pytest.mark.parametrize(
    ("logits_shape", "tokens_shape", "tokens_dtype", "temperature", "match"),
    [
        ((2, 3), (2, 3), jnp.int32, 1.0, "logits must be"),
        ((2, 3, 4), (2, 4), jnp.int32, 1.0, "disagree"),
        ((2, 3, 4), (2, 3), jnp.float32, 1.0, "integer"),
        ((2, 3, 4), (2, 3), jnp.int32, 0.0, "temperature"),
    ],
)
def test_bad_input_names_the_problem(logits_shape, tokens_shape, tokens_dtype, temperature, match):
    with pytest.raises((ValueError, AssertionError), match=match):
        token_logprobs(jnp.zeros(logits_shape), jnp.zeros(tokens_shape, tokens_dtype), temperature)
