"""Heads at the action tokens only: the gathered paths of the policy and value heads (per row
[R, K], and per group of rows [G, N]) give the full path's log-probs, entropies, values, losses
and gradients; capacity and overflow."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_factories import VOCAB, episode, first_batch, tiny_policy, write_store

from sao_jax.models import Critic, MoeAuxConfig
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig, objectives
from sao_jax.train.learner import Learner
from sao_jax.train.learner_steps import policy_loss_fn
from sao_jax.train.partition import path_string

R, T = 6, 24
AUX = {"moe_aux": MoeAuxConfig()}


def random_batch(seed: int = 0) -> dict[str, jnp.ndarray]:
    """Rows of real lengths 9..24 (then padding), actions in bursts; row 2 has none, row 4 the
    most (so a capacity of `max_row_actions` is hit exactly)."""
    rng = np.random.default_rng(seed)
    lengths = [18, 24, 12, 20, 24, 9]
    segment_ids = np.zeros((R, T), np.int32)
    loss_mask = np.zeros((R, T), np.int32)
    for r, n in enumerate(lengths):
        segment_ids[r, :n] = 1
        if r != 2:
            loss_mask[r, 1:n] = rng.random(n - 1) < (0.8 if r == 4 else 0.3)
    loss_mask[0, 0] = 1  # column 0 is never an action, whatever the mask says
    positions = np.where(segment_ids > 0, np.arange(T)[None, :], 0).astype(np.int32)
    return {
        "tokens": jnp.asarray(rng.integers(0, VOCAB, (R, T)), jnp.int32),
        "loss_mask": jnp.asarray(loss_mask),
        "positions": jnp.asarray(positions),
        "segment_ids": jnp.asarray(segment_ids),
        "rollout_logp": jnp.asarray(np.where(loss_mask > 0, -rng.random((R, T)) * 4, 0.0)),
    }


def max_row_actions(batch) -> int:
    return objectives.most_action_tokens_per_row(np.asarray(batch["loss_mask"]))


def flat(state) -> dict[str, np.ndarray]:
    return {path_string(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def assert_trees_close(a, b, rtol=1e-5, atol=1e-7):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        np.testing.assert_allclose(fa[name], fb[name], rtol=rtol, atol=atol, err_msg=name)


def test_action_positions_lists_each_rows_action_columns_in_order():
    mask = jnp.asarray([[0, 1, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]])
    at = objectives.action_positions(mask, 4)
    np.testing.assert_array_equal(at.index, [[1, 3, 4, 0], [0, 0, 0, 0], [1, 2, 3, 4]])
    np.testing.assert_array_equal(at.valid, [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert not at.overflow  # row 2 fills the capacity exactly
    np.testing.assert_array_equal(at.predictors[0], [0, 2, 3, 0])
    rows = at.to_rows(jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + 1, 5)
    np.testing.assert_array_equal(rows, [[0, 1, 0, 2, 3], [0, 0, 0, 0, 0], [0, 9, 10, 11, 12]])
    small = objectives.action_positions(mask, 3)
    assert small.overflow and np.isnan(small.to_rows(jnp.ones((3, 3)), 5)).all()
    assert objectives.action_positions(mask, 99).index.shape == (3, 5)  # at most T
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        objectives.action_positions(mask, 0)


def test_grouped_action_positions_list_each_groups_action_tokens_in_row_major_order():
    mask = jnp.asarray([[0, 1, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1], [0, 0, 1, 0]])
    one = objectives.action_positions(mask, objectives.ActionCapacity(6))
    np.testing.assert_array_equal(one.row, [[0, 0, 2, 2, 2, 3]])
    np.testing.assert_array_equal(one.index, [[1, 3, 1, 2, 3, 2]])
    assert one.valid.all() and not one.overflow  # six action tokens fill six entries exactly
    np.testing.assert_array_equal(one.predictors, [[0, 2, 0, 1, 2, 1]])
    values = jnp.arange(6, dtype=jnp.float32)[None] + 1
    np.testing.assert_array_equal(
        one.to_rows(values, 4), [[0, 1, 0, 2], [0, 0, 0, 0], [0, 3, 4, 5], [0, 0, 6, 0]]
    )
    grid = jnp.arange(16).reshape(4, 4)
    np.testing.assert_array_equal(one.take(grid), [[1, 3, 9, 10, 11, 14]])
    # two groups of two rows: each lists its own block, padded with (its first row, column 0)
    two = objectives.action_positions(mask, objectives.ActionCapacity(4, groups=2))
    np.testing.assert_array_equal(two.row, [[0, 0, 0, 0], [2, 2, 2, 3]])
    np.testing.assert_array_equal(two.index, [[1, 3, 0, 0], [1, 2, 3, 2]])
    np.testing.assert_array_equal(two.valid, [[1, 1, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(two.take(grid), [[1, 3, 0, 0], [9, 10, 11, 14]])
    kept = two.to_rows(jnp.ones((2, 4)), 4)
    np.testing.assert_array_equal(kept, np.asarray(mask, np.float32))  # padding adds nothing
    over = objectives.action_positions(mask, objectives.ActionCapacity(5))
    assert over.overflow and np.isnan(over.to_rows(jnp.ones((1, 5)), 4)).all()
    assert objectives.most_action_tokens_per_group(np.asarray(mask), 2) == 4
    assert objectives.most_action_tokens_per_group(np.asarray(mask), 1) == 6
    with pytest.raises(ValueError, match="do not split into 3 groups"):
        objectives.action_positions(mask, objectives.ActionCapacity(4, groups=3))
    with pytest.raises(ValueError, match="do not split into 3 groups"):
        objectives.most_action_tokens_per_group(np.asarray(mask), 3)


def test_capacity_buckets():
    bucket = objectives.bucket_capacity
    counts = (0, 1, 7, 8, 9, 17, 70, 100, 129)
    assert [bucket(n, 256) for n in counts] == [8, 8, 8, 8, 16, 24, 80, 112, 160]
    assert bucket(300, 256) == 256 and bucket(5, 4) == 4
    mask = np.zeros((3, 40), np.int32)
    mask[:, 0] = 1  # column 0 does not count
    mask[1, 5:15] = 1
    assert objectives.most_action_tokens_per_row(mask) == 10
    assert objectives.action_capacity_for(mask) == 16


@pytest.fixture(scope="module")
def models():
    policy = tiny_policy()
    critic = Critic.from_policy(policy)
    # a non-zero value head, so values and their gradients are not trivially 0
    kernel = critic.value_head.kernel
    kernel.set_value(jax.random.normal(jax.random.key(3), kernel.get_value().shape) * 0.3)
    return nnx.split(policy), nnx.split(critic)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_policy_logprobs_loss_and_gradients_match_the_full_path(models, seed):
    (graphdef, state), _ = models
    batch = random_batch(seed)
    mask = np.asarray(objectives.action_mask(batch))
    capacity = max_row_actions(batch)  # the fullest row fills it exactly
    rng = np.random.default_rng(seed + 10)
    advantages = jnp.asarray(np.where(mask > 0, rng.normal(size=(R, T)), 0.0), jnp.float32)
    # behaviour log-probs near the policy's: some DIS ratios kept, some dropped
    full_logp = jax.jit(
        lambda s: objectives.policy_logprobs(nnx.merge(graphdef, s), batch, chunk_size=8)[0]
    )(state)
    behaviour = jnp.where(mask > 0, full_logp + rng.uniform(-0.6, 0.6, (R, T)), 0.0)
    loss_fn = policy_loss_fn(LearnerConfig())

    def run(s, cap):
        def loss(p):
            return objectives.policy_gradient_loss(
                nnx.merge(graphdef, p),
                batch,
                advantages,
                behaviour,
                loss_fn,
                entropy_coef=0.01,
                chunk_size=8,
                action_capacity=cap,
                opd=None,
                **AUX,
            )

        (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(s)
        logp, entropy, _ = objectives.policy_logprobs(
            nnx.merge(graphdef, s), batch, chunk_size=8, action_capacity=cap
        )
        return value, metrics, grads, logp, entropy

    full = jax.jit(functools.partial(run, cap=None))(state)
    total = int(mask.sum())
    grouped = objectives.ActionCapacity(total)  # the batch's action tokens fill it exactly
    for cap in (capacity, capacity + 5, grouped, objectives.ActionCapacity(total + 3, groups=2)):
        compact = jax.jit(functools.partial(run, cap=cap))(state)
        on = mask > 0
        np.testing.assert_allclose(compact[3][on], full[3][on], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(compact[4][on], full[4][on], rtol=1e-5, atol=1e-6)
        assert (np.asarray(compact[3])[~on] == 0).all() and (np.asarray(compact[4])[~on] == 0).all()
        np.testing.assert_allclose(compact[0], full[0], rtol=1e-5, atol=1e-7)
        assert compact[1].keys() == full[1].keys()
        assert 0 < float(full[1]["clip_frac"]) < 1
        for key in full[1]:
            np.testing.assert_allclose(compact[1][key], full[1][key], rtol=1e-5, atol=1e-7)
        assert_trees_close(compact[2], full[2])

    # one token past the capacity: NaN, never a silently dropped token
    for cap in (capacity - 1, objectives.ActionCapacity(total - 1)):
        over = jax.jit(functools.partial(run, cap=cap))(state)
        assert np.isnan(over[0])


def test_critic_values_and_value_loss_match_the_full_path(models):
    _, (graphdef, state) = models
    batch = random_batch(2)
    mask = np.asarray(objectives.action_mask(batch))
    on = mask > 0
    capacity = max_row_actions(batch)
    returns = jnp.asarray(np.where(on, np.random.default_rng(0).normal(size=(R, T)), 0.0))

    def run(s, old_values, cap, clip):
        def loss(p):
            return objectives.value_loss(
                nnx.merge(graphdef, p),
                batch,
                returns,
                old_values,
                value_clip=clip,
                action_capacity=cap,
                **AUX,
            )

        (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(s)
        values, _ = objectives.critic_values(nnx.merge(graphdef, s), batch, action_capacity=cap)
        return value, metrics, grads, values

    zeros = jnp.zeros((R, T))
    full = jax.jit(lambda s: run(s, zeros, None, None))(state)
    assert np.abs(np.asarray(full[3])[on]).max() > 1e-3  # a real value head
    for cap in (capacity, objectives.ActionCapacity(int(on.sum()) + 2, groups=3)):
        compact = jax.jit(lambda s, cap=cap: run(s, zeros, cap, None))(state)
        np.testing.assert_allclose(compact[3][on], full[3][on], rtol=1e-5, atol=1e-6)
        assert (np.asarray(compact[3])[~on] == 0).all()
        np.testing.assert_allclose(compact[0], full[0], rtol=1e-5, atol=1e-7)
        for key in full[1]:
            np.testing.assert_allclose(compact[1][key], full[1][key], rtol=1e-5, atol=1e-7)
        assert_trees_close(compact[2], full[2])
    # with value clipping around the (action-token) old values
    old = jnp.where(on, full[3] + 0.05, 0.0)
    clipped_full = jax.jit(lambda s: run(s, old, None, 0.01))(state)
    clipped = jax.jit(lambda s: run(s, old, capacity, 0.01))(state)
    np.testing.assert_allclose(clipped[0], clipped_full[0], rtol=1e-5, atol=1e-7)
    assert_trees_close(clipped[2], clipped_full[2])


def learner_config(**changes) -> LearnerConfig:
    base = LearnerConfig(
        policy_optimizer=OptimizerConfig(learning_rate=1e-3),
        critic_optimizer=OptimizerConfig(learning_rate=1e-3),
        critic=CriticConfig(warmup_steps=0),
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def loader_batch(tmp_path_factory):
    episodes = [episode(f"w{i}", seed=i, concat=False, reward=float(i % 2)) for i in range(4)]
    store = write_store(tmp_path_factory.mktemp("store"), episodes)
    return first_batch(store, rows=12, seq_len=24, layout="windowed")


@pytest.mark.parametrize("algorithm", ["sao", pytest.param("ppo", marks=pytest.mark.slow)])
def test_learner_iterations_match_the_all_positions_path(loader_batch, algorithm):
    assert LearnerConfig().head_positions == "actions"  # the default
    runs = {}
    for where in ("all", "actions", "rows"):
        learner = Learner(learner_config(algorithm=algorithm, head_positions=where), tiny_policy())
        batch = dict(loader_batch, rollout_logp=learner.policy_logprobs(loader_batch))
        prepared = learner.advantages(batch)
        metrics = [learner.iteration(batch) for _ in range(2)]
        runs[where] = (learner, prepared, metrics)
    full, full_prep, full_metrics = runs.pop("all")
    on = np.asarray(loader_batch["loss_mask"]) > 0
    on[:, 0] = False
    for where, (compact, compact_prep, compact_metrics) in runs.items():
        assert compact.config.head_positions == where
        assert_same_advantages(algorithm, on, full_prep, compact_prep)
        for one, two in zip(full_metrics, compact_metrics, strict=True):
            assert one.keys() == two.keys()
            for key in one:
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (where, key)
        assert_trees_close(compact.policy_params, full.policy_params, rtol=1e-4, atol=2e-6)
        if algorithm == "sao":
            assert_trees_close(compact.critic_params, full.critic_params, rtol=1e-4, atol=2e-6)


def assert_same_advantages(algorithm, on, full_prep, compact_prep):
    for key in full_prep:
        np.testing.assert_allclose(
            compact_prep[key][on], full_prep[key][on], rtol=1e-5, atol=1e-6, err_msg=key
        )
        if key != "behaviour_logp" or algorithm == "ppo":  # SAO's is the batch's rollout_logp
            assert (compact_prep[key][~on] == 0).all(), key


def test_a_fixed_capacity_too_small_for_a_batch_is_refused(loader_batch):
    most = objectives.most_action_tokens_per_row(loader_batch["loss_mask"])
    config = functools.partial(learner_config, head_positions="rows")
    learner = Learner(config(max_action_tokens_per_row=most - 1), tiny_policy())
    with pytest.raises(ValueError, match="max_action_tokens_per_row"):
        learner.iteration(loader_batch)
    fits = Learner(config(max_action_tokens_per_row=most), tiny_policy())
    assert np.isfinite(fits.iteration(loader_batch)["policy/loss"])
    with pytest.raises(ValueError, match="head_positions"):
        LearnerConfig(head_positions="action")
    with pytest.raises(ValueError, match="max_action_tokens_per_row"):
        LearnerConfig(max_action_tokens_per_row=0)
