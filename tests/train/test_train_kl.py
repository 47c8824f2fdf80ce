"""The KL penalty towards the starting policy (`LearnerConfig.kl`): its value and weight in the
policy loss, that it holds the policy near its reference, the reference across checkpoints, and
the errors of a bad config or a checkpoint without a reference."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_factories import episode, exact_learner_config, first_batch, tiny_policy, write_store

from sao_jax.checkpoint import Checkpointer
from sao_jax.train import CriticConfig, KlConfig, LearnerConfig, OptimizerConfig
from sao_jax.train.learner import Learner


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """Four batches of the same rows whose rollout log-probs sit near the starting policy's."""
    episodes = [episode(f"e{i}", seed=i, reward=float(i % 3 == 0)) for i in range(6)]
    batch = first_batch(write_store(tmp_path_factory.mktemp("store"), episodes), rows=8, seq_len=48)
    logp = Learner(exact_learner_config(), tiny_policy()).policy_logprobs(batch)
    out = []
    for seed in range(4):
        noise = np.random.default_rng(seed).uniform(-0.3, 0.3, logp.shape).astype(np.float32)
        out.append(dict(batch, rollout_logp=np.where(batch["loss_mask"] > 0, logp + noise, 0.0)))
    return out


def config(kl: KlConfig, learning_rate: float = 1e-3) -> LearnerConfig:
    return exact_learner_config(learning_rate, kl=kl)


def plain_logprobs(policy, batch) -> np.ndarray:
    """[R, T] log pi(token t | tokens < t) from the model's logits (not the learner's code)."""
    logits = policy(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    taken = jnp.take_along_axis(logp[:, :-1], batch["tokens"][:, 1:, None], axis=-1)[..., 0]
    return np.asarray(jnp.pad(taken, ((0, 0), (1, 0))))


def kl_from_reference(learner: Learner, batch) -> dict[str, float]:
    """The three estimators of KL(policy || reference), token means over the action tokens,
    computed in numpy from the two models' logits."""
    mask = np.asarray(batch["loss_mask"], bool).copy()
    mask[:, 0] = False
    x = (
        plain_logprobs(learner.policy_module(), batch)
        - plain_logprobs(learner.reference_module(), batch)
    )[mask].astype(np.float64)
    return {"kl_k1": x.mean(), "kl_k2": (0.5 * x * x).mean(), "kl_k3": (np.exp(-x) + x - 1).mean()}


def test_the_kl_term_is_the_estimate_between_policy_and_reference_weighted_into_the_loss(batches):
    coef = 0.5
    penalised = Learner(config(KlConfig(coef=coef)), tiny_policy())
    tracked = Learner(config(KlConfig(track=True)), tiny_policy())
    first = [learner.iteration(batches[0]) for learner in (penalised, tracked)]
    # At the start the policy is its reference: every estimator is 0 (to rounding), and so is
    # the k3 term's gradient, so the first updates of the two learners are the same.
    for metrics in first:
        for kind in ("k1", "k2", "k3"):
            assert abs(metrics[f"policy/kl_{kind}"]) < 1e-6
    np.testing.assert_allclose(
        np.asarray(jax.tree.leaves(penalised.policy_params)[0]),
        np.asarray(jax.tree.leaves(tracked.policy_params)[0]),
        rtol=1e-5,
        atol=1e-7,
    )
    expected = kl_from_reference(tracked, batches[1])
    assert expected["kl_k3"] > 1e-6  # the policy has moved
    with_term, tracking = penalised.iteration(batches[1]), tracked.iteration(batches[1])
    for kind, value in expected.items():
        assert tracking[f"policy/{kind}"] == pytest.approx(value, rel=1e-3, abs=1e-7), kind
    assert tracking["policy/kl_loss"] == 0.0
    assert with_term["policy/kl_loss"] == pytest.approx(coef * with_term["policy/kl_k3"], rel=1e-6)
    # the same objective otherwise: the two losses differ by the term alone
    assert with_term["policy/loss"] - tracking["policy/loss"] == pytest.approx(
        with_term["policy/kl_loss"], rel=1e-3, abs=1e-6
    )
    # the reference never moves
    start = tiny_policy()
    for ref, init in zip(
        jax.tree.leaves(penalised._reference_params),
        jax.tree.leaves(Learner(config(KlConfig(coef=coef)), start)._reference_params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(ref), np.asarray(init))


@pytest.mark.parametrize("kind", ["k2", "k3"])
def test_a_strong_kl_term_holds_the_policy_nearer_its_reference(batches, kind):
    # a fast rate moves the policy well away within a few steps; the penalty pulls it back
    free = Learner(config(KlConfig(track=True), learning_rate=2e-2), tiny_policy())
    held = Learner(config(KlConfig(coef=5.0, kind=kind), learning_rate=2e-2), tiny_policy())
    for batch in batches:
        for learner in (free, held):
            learner.iteration(batch)
    drift_free = kl_from_reference(free, batches[0])["kl_k3"]
    drift_held = kl_from_reference(held, batches[0])["kl_k3"]
    assert drift_held < 0.5 * drift_free, (drift_held, drift_free)


def test_the_reference_is_saved_and_restored_with_the_learner(batches, tmp_path):
    cfg = dataclasses.replace(
        config(KlConfig(coef=0.1)), critic=CriticConfig(warmup_steps=0), policy_optimizer=(
            OptimizerConfig(learning_rate=1e-2, max_grad_norm=0.0)
        ),
    )  # fmt: skip
    first = Learner(cfg, tiny_policy())
    for batch in batches[:2]:
        first.iteration(batch)
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        first.save(checkpointer, 2)
        checkpointer.wait_until_finished()
        continued = first.iteration(batches[2])
        resumed = Learner(cfg, tiny_policy(seed=1))  # another start: another reference
        resumed.restore(checkpointer)
    for saved, restored in zip(
        jax.tree.leaves(first._reference_params),
        jax.tree.leaves(resumed._reference_params),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(restored), np.asarray(saved))
    again = resumed.iteration(batches[2])
    assert again["policy/kl_k3"] == continued["policy/kl_k3"] > 0
    assert again["policy/loss"] == continued["policy/loss"]


def test_a_kl_learner_refuses_a_checkpoint_without_a_reference(batches, tmp_path):
    plain = Learner(exact_learner_config(), tiny_policy())
    plain.iteration(batches[0])
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        plain.save(checkpointer, 1)
        checkpointer.wait_until_finished()
        kl = Learner(config(KlConfig(coef=0.1)), tiny_policy(seed=1))
        before = jax.tree.map(np.asarray, kl.policy_params)
        with pytest.raises(ValueError, match="holds no reference policy"):
            kl.restore(checkpointer)
        # nothing was half-restored
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(kl.policy_params), strict=True):
            np.testing.assert_array_equal(np.asarray(b), a)
        # and a learner without the term resumes from a checkpoint that has one
        Learner(exact_learner_config(), tiny_policy()).restore(checkpointer)


def test_bad_kl_configs_and_a_missing_reference_are_named():
    with pytest.raises(ValueError, match=r"KlConfig\.coef must be >= 0"):
        KlConfig(coef=-0.1)
    for kind in ("k4", "k1"):  # k1 is logged, never a penalty
        with pytest.raises(ValueError, match=r"KlConfig\.kind must be one of"):
            KlConfig(kind=kind)
    with pytest.raises(ValueError, match="keeps no reference policy"):
        Learner(exact_learner_config(), tiny_policy()).reference_module()
    assert not KlConfig().active and KlConfig(track=True).active and KlConfig(coef=1e-3).active
