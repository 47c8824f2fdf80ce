"""Packed rows: the plan places every row once within capacity, the packed grid holds each row's
tokens as its own segment, and the backbone on the packed grid gives the unpacked path's
log-probs, values, losses, gradients and learner / cloner updates."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from train_factories import VOCAB, episode, first_batch, tiny_policy, write_store

from sao_jax.models import Critic, MoeAuxConfig
from sao_jax.train import (
    CriticConfig,
    GroupConfig,
    LearnerConfig,
    OptimizerConfig,
    objectives,
    packing,
)
from sao_jax.train.learner import Learner
from sao_jax.train.learner_steps import policy_loss_fn
from sao_jax.train.partition import path_string
from sao_jax.train.warm_start import BehaviourCloner

AUX = {"moe_aux": MoeAuxConfig()}


def check_plan(lengths, capacity, pack_row, pack_offset, count):
    """Every non-empty row lies inside one packed row, and no two rows overlap."""
    occupied = np.zeros((count, capacity), np.int32)
    for r, n in enumerate(lengths):
        if n == 0:
            continue
        assert 0 <= pack_row[r] < count
        assert pack_offset[r] >= 0 and pack_offset[r] + n <= capacity
        occupied[pack_row[r], pack_offset[r] : pack_offset[r] + n] += 1
    assert occupied.max(initial=0) <= 1
    assert occupied.sum() == sum(lengths)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 24), min_size=1, max_size=40),
    multiple=st.integers(1, 8),
)
def test_the_plan_places_every_row_once_within_capacity(lengths, multiple):
    pack_row, pack_offset, count = packing.plan_packing(
        np.asarray(lengths), 24, row_multiple=multiple
    )
    check_plan(lengths, 24, pack_row, pack_offset, count)
    assert count % multiple == 0 and count >= 1
    # first fit: no two used packed rows could have been one (so at most one is half empty)
    used = np.bincount(
        pack_row[np.asarray(lengths) > 0], np.asarray(lengths)[np.asarray(lengths) > 0], count
    )
    used = used[used > 0]
    pairs = used[:, None] + used[None, :]
    assert (pairs[~np.eye(len(used), dtype=bool)] > 24).all()
    assert count == packing.bucket_rows(max(len(used), 1), multiple)


def test_the_plan_fills_bins_and_honours_multiples_and_minimums():
    _, pack_offset, count = packing.plan_packing(np.asarray([10, 14, 0, 10, 14]), 24)
    assert count == 2  # 14 + 10 twice: perfect fit
    assert list(pack_offset[[2]]) == [0] and sorted(pack_offset[[0, 1, 3, 4]]) == [0, 0, 14, 14]
    assert packing.plan_packing(np.asarray([3]), 24, row_multiple=8)[2] == 8
    assert packing.plan_packing(np.asarray([3]), 24, min_rows=6)[2] == 6
    assert packing.plan_packing(np.zeros(4, np.int64), 24)[2] == 1  # an empty batch: one row
    with pytest.raises(ValueError, match="a row of 25 tokens does not fit packed rows of 24"):
        packing.plan_packing(np.asarray([25]), 24)
    with pytest.raises(ValueError, match="row_multiple must be >= 1"):
        packing.plan_packing(np.asarray([3]), 24, row_multiple=0)


def test_row_buckets_are_multiples_of_powers_of_two_and_their_halves():
    assert [packing.bucket_rows(c, 8) for c in (1, 8, 9, 17, 25, 33, 49, 65, 97, 129)] == [
        8, 8, 16, 24, 32, 48, 64, 96, 128, 192,
    ]  # fmt: skip
    for count in range(1, 300):
        bucket = packing.bucket_rows(count, 4)
        assert bucket % 4 == 0 and count <= bucket
        assert bucket <= 4 or bucket < 1.5 * count + 4  # at most a third of it padding (+ rounding)
        assert packing.bucket_rows(bucket, 4) == bucket  # buckets are fixed points
    with pytest.raises(ValueError, match="row_multiple must be >= 1"):
        packing.bucket_rows(3, 0)


def test_linear_row_buckets_round_up_to_the_multiple_only():
    assert [packing.bucket_rows(c, 2, geometric=False) for c in (1, 2, 9, 10, 17)] == [
        2, 2, 10, 10, 18,
    ]  # fmt: skip
    assert packing.bucket_rows(9, 2) == 12  # the geometric bucket of the same count
    _, _, count = packing.plan_packing(
        np.full(9, 20), 24, row_multiple=2, min_rows=0, geometric=False
    )
    assert count == 10
    packed = packing.pack_batch(random_batch(3, rows=9), row_multiple=2, geometric=False)
    assert packed["packed_tokens"].shape[0] % 2 == 0


def random_batch(seed: int, rows: int = 7, length: int = 24) -> dict[str, np.ndarray]:
    """Rows of random real lengths (one empty, one full), actions in bursts; positions from 0."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, length + 1, rows)
    lengths[2], lengths[-1] = 0, length
    segment_ids = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    loss_mask = ((rng.random((rows, length)) < 0.35) & (segment_ids > 0)).astype(np.int32)
    return {
        "tokens": np.where(segment_ids > 0, rng.integers(1, VOCAB, (rows, length)), 0).astype(
            np.int32
        ),
        "loss_mask": loss_mask,
        "positions": np.where(segment_ids > 0, np.arange(length)[None, :], 0).astype(np.int32),
        "segment_ids": segment_ids,
        "rollout_logp": np.where(loss_mask > 0, -rng.random((rows, length)) * 3, 0.0).astype(
            np.float32
        ),
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_packed_grid_holds_each_row_as_its_own_segment(seed):
    batch = random_batch(seed)
    packed = packing.pack_batch(batch, row_multiple=2)
    assert packed["packed_tokens"].shape[1] == 24 and packed["packed_tokens"].shape[0] % 2 == 0
    lengths = packing.row_lengths(batch["segment_ids"])
    check_plan(lengths, 24, packed["pack_row"], packed["pack_offset"], len(packed["packed_tokens"]))
    seen_segments = set()
    for r, n in enumerate(lengths):
        if n == 0:
            continue
        p, o = packed["pack_row"][r], packed["pack_offset"][r]
        np.testing.assert_array_equal(packed["packed_tokens"][p, o : o + n], batch["tokens"][r, :n])
        np.testing.assert_array_equal(packed["packed_positions"][p, o : o + n], np.arange(n))
        segments = set(packed["packed_segment_ids"][p, o : o + n].tolist())
        assert len(segments) == 1 and 0 not in segments
        assert (p, *segments) not in seen_segments  # no other row of the packed row shares it
        seen_segments.add((p, *segments))
    assert (packed["packed_segment_ids"] != 0).sum() == lengths.sum()
    assert packing.packed_fraction(packed) == pytest.approx(
        lengths.sum() / packed["packed_tokens"].size
    )


def test_rows_with_several_segments_keep_them_apart():
    batch = random_batch(0, rows=3, length=12)
    batch["segment_ids"][0, :6], batch["segment_ids"][0, 6:] = 1, 2
    batch["positions"][0] = np.r_[np.arange(6), np.arange(6)]
    packed = packing.pack_batch(batch, packed_len=36)
    p, o = packed["pack_row"][0], packed["pack_offset"][0]
    first, second = (
        packed["packed_segment_ids"][p, o : o + 6],
        packed["packed_segment_ids"][p, o + 6 : o + 12],
    )
    assert len(set(first)) == len(set(second)) == 1 and first[0] != second[0]


@pytest.fixture(scope="module")
def models():
    policy = tiny_policy()
    critic = Critic.from_policy(policy)
    kernel = critic.value_head.kernel  # a non-zero value head: values are not trivially 0
    kernel.set_value(jax.random.normal(jax.random.key(3), kernel.get_value().shape) * 0.3)
    return nnx.split(policy), nnx.split(critic)


def flat(state) -> dict[str, np.ndarray]:
    return {path_string(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        np.testing.assert_allclose(fa[name], fb[name], rtol=rtol, atol=atol, err_msg=name)


def with_pack(batch: dict[str, np.ndarray], **kw) -> dict[str, jnp.ndarray]:
    return {k: jnp.asarray(v) for k, v in {**batch, **packing.pack_batch(batch, **kw)}.items()}


@pytest.mark.parametrize(
    ("capacity", "packed_len"),
    [
        (None, 24),
        pytest.param("fullest", 24, marks=pytest.mark.slow),
        pytest.param(None, 40, marks=pytest.mark.slow),
        pytest.param("fullest", 40, marks=pytest.mark.slow),
    ],
)
def test_policy_log_probs_loss_and_gradients_match_unpacked(models, capacity, packed_len):
    (graphdef, state), _ = models
    batch = random_batch(4)
    mask = np.asarray(objectives.action_mask({"loss_mask": jnp.asarray(batch["loss_mask"])}))
    on = mask > 0
    cap = None if capacity is None else objectives.most_action_tokens_per_row(batch["loss_mask"])
    rng = np.random.default_rng(5)
    advantages = jnp.asarray(np.where(on, rng.normal(size=mask.shape), 0.0), jnp.float32)
    loss_fn = policy_loss_fn(LearnerConfig())

    def run(s, b):
        def loss(p):
            return objectives.policy_gradient_loss(
                nnx.merge(graphdef, p), b, advantages, b["rollout_logp"], loss_fn,
                entropy_coef=0.01, chunk_size=8, action_capacity=cap, **AUX,
            )  # fmt: skip

        (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(s)
        logp, entropy, _ = objectives.policy_logprobs(
            nnx.merge(graphdef, s), b, chunk_size=8, action_capacity=cap
        )
        return value, metrics, grads, logp, entropy

    plain = jax.jit(run)(state, {k: jnp.asarray(v) for k, v in batch.items()})
    packed = jax.jit(run)(state, with_pack(batch, packed_len=packed_len))
    real = np.asarray(batch["segment_ids"]) > 0
    real[:, 0] = False
    check = on if cap is not None else real  # the full path is defined at every real token
    for index in (3, 4):
        np.testing.assert_allclose(packed[index][check], plain[index][check], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed[0], plain[0], rtol=1e-5, atol=1e-7)
    for key in plain[1]:
        np.testing.assert_allclose(packed[1][key], plain[1][key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert_trees_close(packed[2], plain[2])


def test_critic_values_and_cloning_loss_match_unpacked(models):
    (policy_def, policy_state), (critic_def, critic_state) = models
    batch = random_batch(6)
    on = np.asarray(objectives.action_mask({"loss_mask": jnp.asarray(batch["loss_mask"])})) > 0
    cap = objectives.most_action_tokens_per_row(batch["loss_mask"])
    plain_batch = {k: jnp.asarray(v) for k, v in batch.items()}
    packed_batch = with_pack(batch, packed_len=32)

    def values(s, b, c):
        return objectives.critic_values(nnx.merge(critic_def, s), b, action_capacity=c)[0]

    for c in (None, cap):
        np.testing.assert_allclose(
            jax.jit(functools.partial(values, c=c))(critic_state, packed_batch)[on],
            jax.jit(functools.partial(values, c=c))(critic_state, plain_batch)[on],
            rtol=1e-5, atol=1e-6,
        )  # fmt: skip

    def cloning(s, b):
        def loss(p):
            return objectives.behaviour_cloning_loss(
                nnx.merge(policy_def, p), b, chunk_size=8, context_weight=0.5, **AUX
            )

        return jax.value_and_grad(loss, has_aux=True)(s)

    (plain_loss, plain_metrics), plain_grads = jax.jit(cloning)(policy_state, plain_batch)
    (packed_loss, packed_metrics), packed_grads = jax.jit(cloning)(policy_state, packed_batch)
    np.testing.assert_allclose(packed_loss, plain_loss, rtol=1e-5)
    for key in plain_metrics:
        np.testing.assert_allclose(packed_metrics[key], plain_metrics[key], rtol=1e-5, err_msg=key)
    assert_trees_close(packed_grads, plain_grads)


def config(pack: bool, **changes) -> LearnerConfig:
    # Adam with a large eps: an update is proportional to its gradient, so a near-zero gradient
    # whose float32 rounding differs between the layouts cannot flip a weight by the whole rate
    optimizer = OptimizerConfig(learning_rate=1e-3, eps=1e-3)
    return LearnerConfig(
        policy_optimizer=optimizer, critic_optimizer=optimizer, critic=CriticConfig(warmup_steps=1),
        pack_rows=pack, pack_row_multiple=2, **changes,
    )  # fmt: skip


@pytest.fixture(scope="module")
def loader_batch(tmp_path_factory):
    episodes = [
        episode(f"p{i}", seed=i, concat=False, turns=2 + i % 3, reward=float(i % 2))
        for i in range(5)
    ]
    store = write_store(tmp_path_factory.mktemp("store"), episodes)
    return first_batch(store, rows=16, seq_len=24, layout="windowed")


@pytest.mark.slow  # the default suite runs the compacted-rows variant below
@pytest.mark.parametrize("algorithm", ["sao", "grpo"])
def test_learner_iterations_match_unpacked(loader_batch, algorithm):
    assert LearnerConfig().pack_rows  # the default
    runs = {}
    for pack in (False, True):
        learner = Learner(
            config(pack, algorithm=algorithm, group=GroupConfig(size=1)), tiny_policy()
        )
        prepared = learner.advantages(loader_batch)
        metrics = [learner.iteration(loader_batch) for _ in range(3)]  # warm-up, then 2
        runs[pack] = (learner, prepared, metrics)
    (plain, plain_prep, plain_metrics), (packed, packed_prep, packed_metrics) = runs.values()
    on = (
        np.asarray(objectives.action_mask({"loss_mask": jnp.asarray(loader_batch["loss_mask"])}))
        > 0
    )
    for key in plain_prep:
        np.testing.assert_allclose(
            packed_prep[key][on], plain_prep[key][on], rtol=1e-5, atol=1e-6, err_msg=key
        )
    for one, two in zip(plain_metrics, packed_metrics, strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    assert_trees_close(packed.policy_params, plain.policy_params, rtol=1e-4, atol=2e-6)
    if algorithm == "sao":
        assert_trees_close(packed.critic_params, plain.critic_params, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("pack_factor", [1, 2, 3])
def test_cloner_steps_and_imitation_match_unpacked(loader_batch, pack_factor):
    optimizer = OptimizerConfig(learning_rate=1e-3, eps=1e-3)
    cloners = {
        pack: BehaviourCloner(
            tiny_policy(), optimizer, context_weight=0.5, pack_rows=pack, pack_factor=pack_factor
        )
        for pack in (False, True)
    }
    metrics = {pack: [c.step(loader_batch) for _ in range(2)] for pack, c in cloners.items()}
    for one, two in zip(metrics[False], metrics[True], strict=True):
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    assert_trees_close(cloners[True].params, cloners[False].params, rtol=1e-4, atol=2e-6)
    plain, packed = (cloners[p].evaluate([loader_batch]) for p in (False, True))
    assert packed["replies"] == plain["replies"] > 0
    for key in plain:
        assert packed[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-7), key


def test_cloner_packs_rows_of_pack_factor_lengths_into_fewer_positions(loader_batch):
    optimizer = OptimizerConfig(learning_rate=1e-3)
    length = loader_batch["tokens"].shape[1]
    real = int((np.asarray(loader_batch["segment_ids"]) > 0).sum())
    grids = {
        factor: BehaviourCloner(tiny_policy(), optimizer, pack_factor=factor, pack_row_multiple=2)
        ._device_batch(loader_batch)["packed_segment_ids"]
        for factor in (1, 2)
    }  # fmt: skip
    assert grids[1].shape[1] == length and grids[2].shape[1] == 2 * length
    assert all(int((np.asarray(grid) > 0).sum()) == real for grid in grids.values())
    assert grids[2].size <= grids[1].size
    with pytest.raises(ValueError, match="pack_factor must be >= 1"):
        BehaviourCloner(tiny_policy(), optimizer, pack_factor=0)


def test_learner_packs_into_fewer_rows(loader_batch):
    learner = Learner(config(True), tiny_policy())
    device = learner._device_batch(loader_batch)
    real = int((np.asarray(loader_batch["segment_ids"]) > 0).sum())
    packed_rows = device["packed_tokens"].shape[0]
    assert packed_rows % 2 == 0 and packed_rows * 24 >= real
    assert packed_rows < int((np.asarray(loader_batch["traj_index"]) >= 0).sum())
    unpacked = Learner(config(False), tiny_policy())._device_batch(loader_batch)
    assert "packed_tokens" not in unpacked
    assert dataclasses.replace(LearnerConfig(), pack_row_multiple=3).pack_row_multiple == 3
    with pytest.raises(ValueError, match="pack_row_multiple must be >= 1"):
        LearnerConfig(pack_row_multiple=0)


@pytest.fixture(scope="module")
def sparse_batch(tmp_path_factory):
    """14 rows of 5 episodes in a 40-row batch: most rows empty, as in an RL batch."""
    episodes = [
        episode(f"s{i}", seed=i, concat=False, turns=2 + i % 3, reward=float(i % 2))
        for i in range(5)
    ]
    store = write_store(tmp_path_factory.mktemp("sparse"), episodes)
    return first_batch(store, rows=40, seq_len=24, layout="windowed")


def test_compacted_rows_keep_every_filled_row_in_order(sparse_batch):
    learner = Learner(config(True), tiny_policy())
    host = {k: np.asarray(sparse_batch[k]) for k in ("tokens", "segment_ids", "traj_index")}
    filled = np.flatnonzero(host["segment_ids"].any(axis=1))
    compact = packing.compact_rows(host, learner.placement, row_multiple=2)
    assert len(filled) == 14 and compact["tokens"].shape[0] == 16  # bucket 2 x 8
    kept = compact["segment_ids"].any(axis=1)
    np.testing.assert_array_equal(compact["tokens"][kept], host["tokens"][filled])
    old, new = host["traj_index"][filled], compact["traj_index"][kept]
    assert (np.diff(new) >= 0).all() and set(new) == set(range(len(set(old))))
    assert ((old[:, None] == old[None, :]) == (new[:, None] == new[None, :])).all()
    assert (compact["traj_index"][~kept] == -1).all()
    assert packing.compact_rows(host, learner.placement, 32)["tokens"].shape[0] == 32
    full = packing.compact_rows(host, learner.placement, row_multiple=48)
    assert full["tokens"].shape[0] == 40  # the bucket (48) would exceed the batch: unchanged


def test_learner_iterations_on_compacted_rows_match_unpacked(sparse_batch):
    runs = {}
    for pack in (False, True):
        learner = Learner(config(pack), tiny_policy())
        runs[pack] = (learner, [learner.iteration(sparse_batch) for _ in range(2)])
    assert runs[True][0]._device_batch(sparse_batch, compact=True)["tokens"].shape[0] == 16
    (plain, plain_metrics), (packed, packed_metrics) = runs.values()
    for one, two in zip(plain_metrics, packed_metrics, strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    assert_trees_close(packed.policy_params, plain.policy_params, rtol=1e-4, atol=2e-6)
    assert_trees_close(packed.critic_params, plain.critic_params, rtol=1e-4, atol=2e-6)
