"""seed_opd_loss (gated and signed self-distillation from skill-conditioned log-probs) and
seed_distribution_loss (the forward KL from the teacher's top k)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.losses import seed_distribution_loss, seed_opd_loss

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


def _log_softmax(x):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(x, jnp.float32), axis=-1))


def test_distribution_loss_with_the_whole_vocabulary_is_the_forward_kl():
    rng = np.random.default_rng(0)
    teacher = _log_softmax(rng.normal(size=(2, 3, 6)) * 2)
    student = _log_softmax(rng.normal(size=(2, 3, 6)) * 2)
    order = np.argsort(-teacher, axis=-1)  # the teacher's tokens, most likely first
    top = np.take_along_axis(teacher, order, -1)
    mask = np.array([[1, 1, 0], [0, 1, 1]], np.float32)
    loss, metrics = seed_distribution_loss(np.take_along_axis(student, order, -1), top, mask)
    kl = np.sum(np.exp(teacher) * (teacher - student), axis=-1)
    np.testing.assert_allclose(loss, kl[mask > 0].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["teacher_mass"], 1.0, atol=1e-5)
    np.testing.assert_allclose(
        metrics["teacher_top1_logp"], top[..., 0][mask > 0].mean(), rtol=1e-5
    )


def test_distribution_loss_over_top_k_counts_the_rest_as_one_bucket():
    rng = np.random.default_rng(1)
    teacher = _log_softmax(rng.normal(size=(1, 4, 9)))
    student = _log_softmax(rng.normal(size=(1, 4, 9)))
    order = np.argsort(-teacher, axis=-1)[..., :3]
    t, s = (np.take_along_axis(x, order, -1) for x in (teacher, student))
    mask = np.ones((1, 4), np.float32)
    loss, metrics = seed_distribution_loss(s, t, mask)
    p = np.concatenate([np.exp(t), 1 - np.exp(t).sum(-1, keepdims=True)], -1)
    q = np.concatenate([np.exp(s), 1 - np.exp(s).sum(-1, keepdims=True)], -1)
    np.testing.assert_allclose(loss, np.sum(p * np.log(p / q), -1).mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["student_mass"], np.exp(s).sum(-1).mean(), rtol=1e-5)
    # the student equal to the teacher on the k tokens: 0, whatever the rest holds inside
    zero, _ = seed_distribution_loss(t, t, mask)
    np.testing.assert_allclose(zero, 0.0, atol=1e-6)


def test_distribution_loss_moves_mass_to_the_teachers_tokens_and_ignores_padding():
    """One gradient step on the student's logits lowers the KL and raises the student's
    probability of the teacher's favourite; entries off the mask (NaN there) get exactly zero
    gradient and change nothing."""
    teacher_logits = jnp.array([[[4.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 5]])
    ids = jnp.array([[[0, 1], [0, 1]]])
    teacher = jnp.take_along_axis(jax.nn.log_softmax(teacher_logits), ids, -1)
    mask = jnp.array([[1.0, 0.0]])

    def student_of(logits):
        return jnp.take_along_axis(jax.nn.log_softmax(logits), ids, -1)

    def loss(student):
        return seed_distribution_loss(student, teacher, mask)[0]

    student_logits = jnp.array([[[0.0, 3.0, 0.0, 0.0, 0.0], [1.0] * 5]])
    padded = student_of(student_logits).at[0, 1].set(jnp.nan)
    value, grad = jax.value_and_grad(loss)(padded)
    assert np.isfinite(value) and value > 0
    assert np.all(np.asarray(grad[0, 1]) == 0.0)
    logits_grad = jax.grad(lambda x: loss(student_of(x)))(student_logits)
    assert logits_grad[0, 0, 0] < 0 < logits_grad[0, 0, 1]  # descent: token 0 up, token 1 down
    assert loss(student_of(student_logits - 0.5 * logits_grad)) < value


def test_distribution_loss_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match=r"must both be \[B, T, K\]"):
        seed_distribution_loss(np.zeros((1, 2, 3)), np.zeros((1, 2, 4)), np.ones((1, 2)))
    with pytest.raises(AssertionError, match=r"mask \(1, 3\)"):
        seed_distribution_loss(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), np.ones((1, 3)))
    with pytest.raises(ValueError, match="seed_distribution_loss"):
        seed_opd_loss(LOGP, SKILL_LOGP, MASK, mode="kl")
