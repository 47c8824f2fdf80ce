"""Per-row token selection: greedy, temperature, top-k and top-p supports and frequencies."""

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.rollout import sample_tokens, token_logprob

LOGITS = jnp.log(jnp.array([0.30, 0.25, 0.15, 0.10, 0.08, 0.05, 0.04, 0.02, 0.007, 0.003]))
DRAWS = 4000


def _draw(temperature, top_k, top_p, logits=LOGITS):
    """DRAWS samples of 4 rows with the given per-row settings -> [DRAWS, 4]."""
    logits = jnp.tile(logits, (4, 1))
    settings = (jnp.array(temperature, jnp.float32), jnp.array(top_k), jnp.array(top_p))

    @jax.jit
    def many(keys):
        return jax.vmap(lambda k: sample_tokens(logits, jax.random.split(k, 4), *settings))(keys)

    return np.asarray(many(jax.random.split(jax.random.key(0), DRAWS)))


def test_supports_and_frequencies():
    probs = np.asarray(jax.nn.softmax(LOGITS))
    draws = _draw([0.0, 1.0, 1.0, 2.0], [0, 3, 0, 0], [1.0, 1.0, 0.6, 1.0])
    assert np.all(draws[:, 0] == 0)  # greedy
    assert set(np.unique(draws[:, 1])) == {0, 1, 2}  # top-3
    # top-p 0.6: 0.30 + 0.25 < 0.6 <= 0.30 + 0.25 + 0.15, so exactly three tokens survive.
    assert set(np.unique(draws[:, 2])) == {0, 1, 2}
    frequencies = np.bincount(draws[:, 1], minlength=10)[:3] / DRAWS
    np.testing.assert_allclose(frequencies, probs[:3] / probs[:3].sum(), atol=0.03)
    hot = np.exp(np.log(probs) / 2.0)
    hot /= hot.sum()
    np.testing.assert_allclose(np.bincount(draws[:, 3], minlength=10) / DRAWS, hot, atol=0.03)


def test_top_k_and_top_p_combine_in_hf_order():
    # top-k 5 renormalises to 0.30/0.88 ... ; top-p 0.5 then keeps {0, 1}.
    draws = _draw([1.0] * 4, [5, 5, 1, 0], [0.5, 1.0, 1.0, 0.98])
    assert set(np.unique(draws[:, 0])) == {0, 1}
    assert set(np.unique(draws[:, 1])) == {0, 1, 2, 3, 4}
    assert np.all(draws[:, 2] == 0)
    assert set(np.unique(draws[:, 3])) == set(range(8))  # mass before token 8 is 0.99


def test_a_rows_draw_does_not_depend_on_its_neighbours_settings():
    # Same keys, same row 0 / row 1 settings; only the other rows' filters change. A row that
    # does not filter must draw from its plain softmax even when a neighbour filters (the
    # neighbours' sort must not reorder its CDF), and a filtering row likewise.
    shuffled = LOGITS[jnp.array([3, 0, 7, 1, 9, 2, 5, 8, 4, 6])]  # not already in sorted order
    alone = _draw([1.0, 1.0, 1.0, 1.0], [0, 3, 0, 0], [1.0, 1.0, 1.0, 1.0], shuffled)
    mixed = _draw([1.0, 1.0, 0.0, 1.0], [0, 3, 2, 0], [1.0, 1.0, 1.0, 0.5], shuffled)
    np.testing.assert_array_equal(mixed[:, :2], alone[:, :2])
    plain = _draw([1.0] * 4, [0] * 4, [1.0] * 4, shuffled)  # no row filters: no sort runs
    np.testing.assert_array_equal(alone[:, 0], plain[:, 0])


def test_token_logprob_is_temperature_one_log_softmax():
    logits = jax.random.normal(jax.random.key(1), (3, 7)) * 3
    tokens = jnp.array([0, 6, 3])
    expected = jax.nn.log_softmax(logits)[jnp.arange(3), tokens]
    np.testing.assert_allclose(token_logprob(logits, tokens), expected, rtol=1e-6)
