"""seed_opd_loss: gated and signed self-distillation from skill-conditioned log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import seed_opd_loss

LOGP = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
SKILL_LOGP = np.array([[-0.5, -2.5, -0.5, 0.0]], np.float32)
MASK = np.array([[1, 1, 1, 0]], np.float32)
DELTA = (SKILL_LOGP - LOGP)[0, :3]  # 0.5, -0.5, 0.0 on the three action tokens


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_gated_value_gradient_and_metrics():
    loss, metrics = seed_opd_loss(LOGP, SKILL_LOGP, MASK, beta=2.0)
    gate = _sigmoid(2.0 * DELTA)
    np.testing.assert_allclose(loss, np.sum(gate * DELTA) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["gate_mean"], gate.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["delta_mean"], DELTA.mean(), atol=1e-7)
    np.testing.assert_allclose(metrics["delta_abs_mean"], np.abs(DELTA).mean(), rtol=1e-6)
    grads = jax.grad(lambda x, s: seed_opd_loss(x, s, MASK, beta=2.0)[0], argnums=(0, 1))(
        LOGP, SKILL_LOGP
    )
    # -g / N on action tokens: the gate never pushes a sampled token down; the teacher is frozen.
    np.testing.assert_allclose(grads[0], [[*(-gate / 3), 0.0]], rtol=1e-6)
    assert np.all(grads[1] == 0.0)


def test_signed_with_and_without_clip():
    loss, _ = seed_opd_loss(LOGP, SKILL_LOGP, MASK, mode="signed")
    np.testing.assert_allclose(loss, -np.sum(DELTA * LOGP[0, :3]) / 3, rtol=1e-6)
    clipped_loss, metrics = seed_opd_loss(LOGP, SKILL_LOGP, MASK, mode="signed", clip=0.25)
    clipped = np.clip(DELTA, -0.25, 0.25)
    np.testing.assert_allclose(clipped_loss, -np.sum(clipped * LOGP[0, :3]) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_frac"], 2 / 3)
    grad = jax.grad(lambda x: seed_opd_loss(x, SKILL_LOGP, MASK, mode="signed", clip=0.25)[0])(LOGP)
    np.testing.assert_allclose(grad, [[*(-clipped / 3), 0.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "hard"}, "mode must be one of"),
        ({"clip": 1.0}, "only to mode='signed'"),
        ({"mode": "signed", "clip": 0.0}, "clip"),
        ({"beta": -1.0}, "beta"),
    ],
)
def test_bad_options_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        seed_opd_loss(LOGP, SKILL_LOGP, MASK, **kwargs)


def test_jit_with_static_mode():
    fn = jax.jit(seed_opd_loss, static_argnames=("mode",))
    for mode in ("gated", "signed"):
        np.testing.assert_allclose(
            fn(LOGP, SKILL_LOGP, MASK, mode=mode)[0],
            seed_opd_loss(LOGP, SKILL_LOGP, MASK, mode=mode)[0],
            rtol=1e-6,
        )
    assert jnp.asarray(fn(LOGP, SKILL_LOGP, MASK)[0]).dtype == jnp.float32
