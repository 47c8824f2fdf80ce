"""kl_estimate: Schulman's k1 / k2 / k3 estimators, token-averaged."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sao_jax.losses import kl_estimate

LOGP = np.array([[-1.0, -2.0, -0.5]], np.float32)
REF_LOGP = np.array([[-1.5, -1.0, -9.0]], np.float32)
MASK = np.array([[1, 1, 0]], np.float32)
X = np.array([0.5, -1.0])  # logp - ref on the two action tokens


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("k1", X.mean()), ("k2", (0.5 * X**2).mean()), ("k3", (np.exp(-X) + X - 1).mean())],
)
def test_hand_computed(kind, expected):
    kl, metrics = kl_estimate(LOGP, REF_LOGP, MASK, kind=kind)
    np.testing.assert_allclose(kl, expected, rtol=1e-6)
    np.testing.assert_allclose(metrics[f"kl_{kind}"], expected, rtol=1e-6)
    assert set(metrics) == {"kl_k1", "kl_k2", "kl_k3"}


def test_k3_gradient_is_one_minus_inverse_ratio():
    grad = jax.grad(lambda x: kl_estimate(x, REF_LOGP, MASK)[0])(LOGP)
    np.testing.assert_allclose(grad, [[*((1 - np.exp(-X)) / 2), 0.0]], rtol=1e-6)


_kl = jax.jit(kl_estimate, static_argnames=("kind",))


@settings(max_examples=30, deadline=None)
@given(
    log_ratio=hnp.arrays(np.float32, (2, 5), elements=st.floats(-5, 5, width=32)),
    mask=hnp.arrays(np.bool_, (2, 5)),
)
def test_k2_and_k3_are_nonnegative_and_vanish_at_the_reference(log_ratio, mask):
    ref = np.full((2, 5), -2.0, np.float32)
    for kind in ("k2", "k3"):
        assert _kl(ref + log_ratio, ref, mask, kind=kind)[0] >= 0.0
        assert _kl(ref, ref, mask, kind=kind)[0] == 0.0


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="kind must be one of"):
        kl_estimate(LOGP, REF_LOGP, MASK, kind="k4")
