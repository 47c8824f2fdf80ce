"""`Learner.fit_value_head`: the critic's value head set to the least-squares fit of Monte-Carlo
returns on the critic's own features, checked against numpy's lstsq on hidden states read from
the model directly; it lowers the value loss the warm-up starts from; errors are named."""

import numpy as np
import pytest
from train_factories import episode, exact_learner_config, first_batch, tiny_policy, write_store

from sao_jax.sharding import MeshConfig, make_mesh
from sao_jax.train import CriticConfig, LearnerConfig
from sao_jax.train.learner import Learner

REWARDS = (0.0, 1.0, 3.0, 0.0, 2.0, 5.0)


def config(**changes) -> LearnerConfig:
    return exact_learner_config(**{"critic": CriticConfig(warmup_steps=1), **changes})


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    episodes = [episode(f"e{i}", seed=i, reward=r) for i, r in enumerate(REWARDS)]
    return first_batch(write_store(tmp_path_factory.mktemp("store"), episodes), rows=8, seq_len=48)


def features_and_returns(learner: Learner, batch) -> tuple[np.ndarray, np.ndarray]:
    """Reference features ([h_{t-1}, 1] at every action token t) and returns, from the critic's
    plain forward pass and each trajectory's total reward (gamma = 1, reward after the last
    action: every action token's reward-to-go is the episode's reward)."""
    critic = learner.critic_module()
    hidden = np.asarray(
        critic.forward(
            batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"]
        ).hidden
    )
    rows, cols = np.nonzero(batch["loss_mask"][:, 1:] > 0)
    cols = cols + 1
    x = hidden[rows, cols - 1]
    totals = {t: batch["rewards"][batch["traj_index"] == t].sum() for t in set(rows)}
    y = np.array([totals[batch["traj_index"][r]] for r in rows])
    return np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64), y


def test_the_fitted_head_predicts_what_least_squares_on_the_critic_features_predicts(batch):
    learner = Learner(config(), tiny_policy())
    x, y = features_and_returns(learner, batch)
    assert len(set(y)) >= 4  # the returns vary, so a fit has something to explain
    reference = x @ np.linalg.lstsq(x, y, rcond=None)[0]
    metrics = learner.fit_value_head([batch], ridge=0.0)

    critic = learner.critic_module()
    values = np.asarray(
        critic.values(
            batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"]
        )
    )
    rows, cols = np.nonzero(batch["loss_mask"][:, 1:] > 0)
    fitted = values[rows, cols]  # V of the prefix up to t - 1 = the state before token t
    scale = float(np.abs(y).max())
    np.testing.assert_allclose(fitted, reference, atol=2e-3 * scale)
    explained = 1 - np.mean((y - reference) ** 2) / np.var(y)
    assert metrics["critic_fit/explained_variance"] == pytest.approx(explained, abs=2e-3)
    assert metrics["critic_fit/tokens"] == len(y)
    assert metrics["critic_fit/return_mean"] == pytest.approx(y.mean(), rel=1e-6)
    assert metrics["critic_fit/value_mean"] == pytest.approx(fitted.mean(), abs=2e-3 * scale)


def test_ridge_shrinks_the_weights_but_not_the_mean_and_statistics_sum_over_batches(batch):
    exact = Learner(config(), tiny_policy())
    exact.fit_value_head([batch], ridge=0.0)
    shrunk = Learner(config(), tiny_policy())
    # the same data split in two batches (rows 0-3 / 4-7) sums to the same statistics
    halves = [{k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()}]
    metrics = shrunk.fit_value_head(halves, ridge=10.0)
    weights = {
        name: np.abs(np.asarray(learner.critic_params["value_head"]["kernel"].get_value())).sum()
        for name, learner in (("exact", exact), ("shrunk", shrunk))
    }
    assert weights["shrunk"] < 0.5 * weights["exact"]
    _, y = features_and_returns(exact, batch)
    assert metrics["critic_fit/tokens"] == len(y)
    # the bias is not shrunk: the fitted values still average the returns
    assert metrics["critic_fit/value_mean"] == pytest.approx(y.mean(), rel=1e-3)


def test_the_warm_up_starts_from_a_lower_value_loss_after_a_fit(batch):
    plain = Learner(config(), tiny_policy())
    fitted = Learner(config(), tiny_policy())
    fit = fitted.fit_value_head([batch])
    assert fit["critic_fit/explained_variance"] > 0.5
    before, after = plain.iteration(batch), fitted.iteration(batch)
    assert before["phase"] == after["phase"] == 0.0  # both are critic warm-up iterations
    assert after["critic/loss"] < 0.5 * before["critic/loss"]
    assert after["critic/explained_variance"] > before["critic/explained_variance"] + 0.3


def test_a_sharded_learner_fits_the_same_head(batch):
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, expert=2, tensor=1))
    single = Learner(config(), tiny_policy())
    sharded = Learner(config(), tiny_policy(), mesh=mesh)
    one = single.fit_value_head([batch])
    two = sharded.fit_value_head([batch])
    assert two["critic_fit/explained_variance"] == pytest.approx(
        one["critic_fit/explained_variance"], abs=1e-4
    )
    kernel = sharded.critic_params["value_head"]["kernel"].get_value()
    np.testing.assert_allclose(
        np.asarray(kernel),
        np.asarray(single.critic_params["value_head"]["kernel"].get_value()),
        atol=1e-3,
    )
    assert kernel.sharding.is_equivalent_to(
        Learner(config(), tiny_policy(), mesh=mesh)
        .critic_params["value_head"]["kernel"]
        .get_value()
        .sharding,
        kernel.ndim,
    )


def test_fits_that_cannot_be_made_are_named(batch):
    with pytest.raises(ValueError, match="'grpo' has no critic to fit"):
        Learner(config(algorithm="grpo"), tiny_policy()).fit_value_head([batch])
    frozen_head = Learner(config(critic_trainable=(r"(^|/)moe/",)), tiny_policy())
    with pytest.raises(ValueError, match="value head is frozen"):
        frozen_head.fit_value_head([batch])
    learner = Learner(config(), tiny_policy())
    with pytest.raises(ValueError, match="fewer than 2 action tokens"):
        learner.fit_value_head([])
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        learner.fit_value_head([batch], ridge=-1.0)
    untouched = np.asarray(learner.critic_params["value_head"]["kernel"].get_value())
    assert not untouched.any()  # a refused fit leaves the zero-initialised head as it was
