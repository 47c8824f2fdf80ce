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


def test_gap_distribution_metrics_match_numpy():
    rng = np.random.default_rng(3)
    logp = rng.normal(size=(4, 9)).astype(np.float32)
    skill_logp = (logp + rng.normal(size=(4, 9))).astype(np.float32)
    mask = (rng.random((4, 9)) < 0.6).astype(np.float32)
    _, metrics = seed_opd_loss(logp, skill_logp, mask)
    delta = (skill_logp - logp)[mask > 0]
    np.testing.assert_allclose(metrics["delta_std"], delta.std(), rtol=1e-5)
    np.testing.assert_allclose(metrics["gate_rate"], (delta > 0).mean(), rtol=1e-6)
    for q in (10, 50, 90):
        np.testing.assert_allclose(metrics[f"delta_p{q}"], np.quantile(delta, q / 100), rtol=1e-5)
    # one action token: every quantile is its gap; none: all zero
    one = np.zeros_like(mask)
    one[2, 3] = 1.0
    _, single = seed_opd_loss(logp, skill_logp, one)
    gap = skill_logp[2, 3] - logp[2, 3]
    for q in (10, 50, 90):
        np.testing.assert_allclose(single[f"delta_p{q}"], gap, rtol=1e-6)
    _, empty = seed_opd_loss(logp, skill_logp, np.zeros_like(mask))
    assert all(float(v) == 0.0 for k, v in empty.items() if k != "gate_mean")


def test_gap_by_kind_reads_the_row_bitmask():
    from sao_jax.losses import SKILL_KINDS, seed_gap_by_kind

    logp = np.zeros((3, 4), np.float32)
    skill_logp = np.array([[1.0] * 4, [-2.0] * 4, [5.0] * 4], np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    # row 0: fact; row 1: fact + procedure; row 2 (no action token): failed_command
    metrics = seed_gap_by_kind(logp, skill_logp, mask, np.array([0b1, 0b101, 0b10]))
    np.testing.assert_allclose(metrics["gap_fact"], (2 * 1.0 + 4 * -2.0) / 6)
    np.testing.assert_allclose(metrics["gap_procedure"], -2.0)
    assert np.isnan(metrics["gap_failed_command"]) and np.isnan(metrics["gap_other"])
    np.testing.assert_allclose(metrics["kind_share_procedure"], 4 / 6)
    assert set(metrics) == {f"{m}_{k}" for k in SKILL_KINDS for m in ("gap", "kind_share")}
