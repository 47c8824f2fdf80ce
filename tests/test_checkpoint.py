"""Checkpointer: bit-identical resume, sharded <-> unsharded restore, retention, clear errors."""

import functools
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sao_jax.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    abstract_tree,
    checkpoint_directory,
)


class TinyNet(nnx.Module):
    """Two layers with dropout, so the model state also holds an RNG stream."""

    def __init__(self, hidden: int, *, rngs: nnx.Rngs):
        self.encode = nnx.Linear(8, hidden, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)
        self.decode = nnx.Linear(hidden, 8, rngs=rngs)

    def __call__(self, x):
        return self.decode(self.dropout(jax.nn.gelu(self.encode(x))))


def make(seed: int, hidden: int = 16):
    model = TinyNet(hidden, rngs=nnx.Rngs(seed, dropout=seed + 1))
    schedule = optax.warmup_cosine_decay_schedule(0.0, 3e-2, 3, 20)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-2))
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(graphdef, state, rng):
    model, optimizer = nnx.merge(graphdef, state)
    rng, data_rng = jax.random.split(rng)
    x = jax.random.normal(data_rng, (16, 8))

    def loss_fn(m):
        return jnp.mean((m(x) - jnp.sin(x)) ** 2)

    optimizer.update(model, nnx.grad(loss_fn)(model))
    return nnx.state((model, optimizer)), rng


def train(model, optimizer, rng, steps):
    graphdef, state = nnx.split((model, optimizer))
    for _ in range(steps):
        state, rng = train_step(graphdef, state, rng)
    nnx.update((model, optimizer), state)
    return rng


def host(tree):
    """Every leaf as numpy (PRNG keys as key data), for bit-for-bit comparison."""
    tree = nnx.to_pure_dict(nnx.state(tree)) if isinstance(tree, nnx.Pytree) else tree

    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return jax.tree.map(leaf, tree)


def assert_bitwise_equal(a, b):
    flat_a, tree_a = jax.tree.flatten(host(a))
    flat_b, tree_b = jax.tree.flatten(host(b))
    assert tree_a == tree_b
    for x, y in zip(flat_a, flat_b, strict=True):
        assert x.dtype == y.dtype and np.array_equal(x, y)


def test_resumed_run_continues_bit_identically(tmp_path):
    total, cut = 6, 3
    model, optimizer = make(seed=0)
    rng = train(model, optimizer, jax.random.key(42), cut)
    with Checkpointer(tmp_path) as ckpt:
        items = {"policy": model, "policy_opt": optimizer, "train": {"rng": rng}}
        assert ckpt.save(cut, items, metadata={"policy_version": 5, "data": {"next": cut}})
        rng_target = abstract_tree({"rng": rng})  # rng itself is donated by the next line
        # the uninterrupted run keeps going (donating its buffers) while the save is in flight
        reference_rng = train(model, optimizer, rng, total - cut)
        ckpt.wait_until_finished()

    fresh_model, fresh_optimizer = make(seed=7)  # different init and dropout stream
    with Checkpointer(tmp_path, create=False) as ckpt:
        restored = ckpt.restore(
            {"policy": fresh_model, "policy_opt": fresh_optimizer, "train": rng_target}
        )
    assert restored.step == cut
    assert restored.metadata == {"policy_version": 5, "data": {"next": cut}}
    assert restored.items["policy"] is fresh_model
    resumed_rng = train(
        fresh_model, fresh_optimizer, restored.items["train"]["rng"], total - restored.step
    )
    assert_bitwise_equal(fresh_model, model)
    assert_bitwise_equal(fresh_optimizer, optimizer)
    assert_bitwise_equal({"rng": resumed_rng}, {"rng": reference_rng})


def test_policy_critic_and_both_optimizers_in_one_step(tmp_path):
    policy, policy_opt = make(seed=1)
    critic, critic_opt = make(seed=2, hidden=24)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(
            10,
            {
                "policy": policy,
                "critic": critic,
                "policy_opt": policy_opt,
                "critic_opt": critic_opt,
            },
        )
        ckpt.wait_until_finished()
        assert ckpt.item_names() == ["critic", "critic_opt", "policy", "policy_opt"]
        new_critic, new_critic_opt = make(seed=9, hidden=24)
        ckpt.restore({"critic": new_critic, "critic_opt": new_critic_opt})  # a subset is fine
    assert_bitwise_equal(new_critic, critic)
    assert_bitwise_equal(new_critic_opt, critic_opt)


def mesh_shardings(tree, mesh):
    """Shard every dimension of 16 or 24 over the 8-device axis, replicate the rest."""

    def spec(x):
        shape = jax.eval_shape(lambda: x).shape if hasattr(x, "shape") else ()
        dims = [("data" if size in (16, 24) else None) for size in shape]
        return NamedSharding(mesh, P(*dims))

    return jax.tree.map(spec, tree)


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests/conftest.py provides 8 fake CPU devices"
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))


def test_unsharded_checkpoint_restores_sharded(tmp_path, mesh):
    model, optimizer = make(seed=3)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"policy": model, "policy_opt": optimizer})
        ckpt.wait_until_finished()
        state = nnx.to_pure_dict(nnx.state(model))
        target = abstract_tree(model, mesh_shardings(state, mesh))
        restored = ckpt.restore({"policy": target}).items["policy"]
        for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target), strict=True):
            assert leaf.sharding == want.sharding
        assert restored["encode"]["kernel"].sharding.spec == P(None, "data")
        assert_bitwise_equal(restored, state)

        # in place into a live model whose parameters are already sharded
        live, live_optimizer = make(seed=4)
        live_state = nnx.state((live, live_optimizer))
        nnx.update(
            (live, live_optimizer), jax.device_put(live_state, mesh_shardings(live_state, mesh))
        )
        ckpt.restore({"policy": live, "policy_opt": live_optimizer})
    assert live.encode.kernel[...].sharding.spec == P(None, "data")
    assert live_optimizer.opt_state[1][0].mu["encode"]["kernel"][...].sharding.spec == P(
        None, "data"
    )
    assert_bitwise_equal(live, model)
    assert_bitwise_equal(live_optimizer, optimizer)


def test_sharded_checkpoint_restores_unsharded(tmp_path, mesh):
    model, _ = make(seed=5)
    state = nnx.to_pure_dict(nnx.state(model))
    sharded = jax.device_put(state, mesh_shardings(state, mesh))
    assert len(sharded["encode"]["kernel"].sharding.device_set) == 8
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(2, {"policy": sharded})
        ckpt.wait_until_finished()
        one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        restored = ckpt.restore({"policy": abstract_tree(state, one_device)}).items["policy"]
        plain, _ = make(seed=6)
        ckpt.restore({"policy": plain})
        as_saved = ckpt.restore().items["policy"]  # no target: as saved
    for leaf in jax.tree.leaves(restored):
        assert leaf.sharding == one_device
    assert_bitwise_equal(restored, state)
    assert_bitwise_equal(plain, model)
    assert np.array_equal(as_saved["decode"]["kernel"], state["decode"]["kernel"])


def test_restore_fills_an_abstract_module(tmp_path):
    model, _ = make(seed=8)
    abstract = nnx.eval_shape(lambda: TinyNet(16, rngs=nnx.Rngs(0, dropout=1)))
    assert isinstance(abstract.encode.kernel.get_value(), jax.ShapeDtypeStruct)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"policy": model})
        restored = ckpt.restore({"policy": abstract}).items["policy"]
    assert restored is abstract
    assert_bitwise_equal(abstract, model)
    x = jnp.ones((2, 8))
    assert np.array_equal(
        nnx.view(abstract, deterministic=True)(x), nnx.view(model, deterministic=True)(x)
    )


def test_restore_casts_to_the_target_dtype(tmp_path):
    weights = {"w": jnp.arange(4, dtype=jnp.float32) / 3}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"policy": weights})
        target = {"w": jax.ShapeDtypeStruct((4,), jnp.bfloat16)}
        restored = ckpt.restore({"policy": target}).items["policy"]["w"]
    assert restored.dtype == jnp.bfloat16
    assert np.array_equal(restored, weights["w"].astype(jnp.bfloat16))


def test_keep_last_n_and_save_interval(tmp_path):
    tree = {"w": jnp.arange(4.0)}
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"train": {"w": tree["w"] * step}})
        ckpt.wait_until_finished()
        assert ckpt.all_steps() == [4, 5]
        assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [4, 5]
        assert ckpt.latest_step() == 5
        assert np.array_equal(ckpt.restore(step=4).items["train"]["w"], tree["w"] * 4)
    with Checkpointer(tmp_path / "every2", save_interval_steps=2, async_save=False) as ckpt:
        assert not ckpt.save(1, {"train": tree})
        assert ckpt.save(2, {"train": tree})
        assert ckpt.save(3, {"train": tree}, force=True)
        assert ckpt.all_steps() == [2, 3]


def test_missing_and_empty_directories(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint directory"):
        Checkpointer(tmp_path / "absent", create=False)
    with Checkpointer(tmp_path / "empty") as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(CheckpointNotFoundError, match="no finished checkpoint"):
            ckpt.restore()


def test_cloud_urls_reach_orbax_unchanged_and_local_paths_become_absolute(tmp_path, monkeypatch):
    assert str(checkpoint_directory("gs://bucket/run/checkpoints")) == "gs://bucket/run/checkpoints"
    assert str(checkpoint_directory("gs://bucket/run/checkpoints") / "7") == (
        "gs://bucket/run/checkpoints/7"
    )
    monkeypatch.chdir(tmp_path)
    assert str(checkpoint_directory("runs/ckpt")) == str(tmp_path / "runs" / "ckpt")
    with Checkpointer("runs/ckpt") as ckpt:  # relative: still found after a chdir
        ckpt.save(1, {"train": {"x": jnp.ones(2)}})
    monkeypatch.chdir("/")
    with Checkpointer(tmp_path / "runs" / "ckpt", create=False) as ckpt:
        assert ckpt.all_steps() == [1]

    opened = []  # what orbax is handed for a bucket, without reaching the network

    class Manager:
        def __init__(self, directory, options):
            opened.append(directory)

    monkeypatch.setattr("orbax.checkpoint.CheckpointManager", Manager)
    ckpt = Checkpointer("gs://bucket/run/checkpoints")
    assert [str(d) for d in opened] == ["gs://bucket/run/checkpoints"]
    assert str(ckpt.directory) == "gs://bucket/run/checkpoints"


def test_wrong_requests_are_named(tmp_path):
    model, _ = make(seed=0)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, {"policy": model}, metadata={"policy_version": 1})
        ckpt.wait_until_finished()
        with pytest.raises(CheckpointNotFoundError, match=r"no step 4 .* have \[3\]"):
            ckpt.restore(step=4)
        with pytest.raises(CheckpointMismatchError, match=r"no item\(s\) \['critic'\]"):
            ckpt.restore({"critic": None})
        wider, _ = make(seed=0, hidden=24)
        with pytest.raises(
            CheckpointMismatchError,
            match=r"encode/kernel: checkpoint shape \(8, 16\) vs target \(8, 24\)",
        ):
            ckpt.restore({"policy": wider})
        with pytest.raises(CheckpointMismatchError, match="missing in checkpoint: extra"):
            ckpt.restore({"policy": {**nnx.to_pure_dict(nnx.state(model)), "extra": jnp.ones(2)}})
        with pytest.raises(ValueError, match="plain JSON"):
            ckpt.save(4, {"policy": model}, metadata={"loss": float("nan")})
        with pytest.raises(ValueError, match="plain JSON"):
            ckpt.save(4, {"policy": model}, metadata={"weights": np.ones(2)})
        with pytest.raises(ValueError, match="item name 'metadata'"):
            ckpt.save(4, {"metadata": model})
        with pytest.raises(ValueError, match="item 'w' is a single array"):
            ckpt.save(4, {"w": jnp.ones(3)})
        with pytest.raises(ValueError, match="item name 'a/b'"):
            ckpt.save(4, {"a/b": model})


def test_corrupt_checkpoint_is_reported(tmp_path):
    model, _ = make(seed=0)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"policy": model}, metadata={"policy_version": 1})
        ckpt.wait_until_finished()
    for path in (tmp_path / "1" / "metadata").iterdir():
        path.write_text("{not json")
    for path in (tmp_path / "1" / "policy").iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    with Checkpointer(tmp_path, create=False) as ckpt:
        with pytest.raises(CorruptCheckpointError, match="cannot read checkpoint step 1"):
            ckpt.metadata()
        fresh, _ = make(seed=1)
        with pytest.raises(CorruptCheckpointError, match="cannot read checkpoint step 1"):
            ckpt.restore({"policy": fresh})
