"""Disaggregated rollout and training on 8 fake devices: train on 4 (fsdp x expert), publish
to the other 4 (tensor x data), and sample exactly what unsharded weights sample."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from sao_jax.distributed import (
    disaggregated_meshes,
    layout,
    reshard,
    rollout_shardings,
    split_devices,
    transfer_method,
)
from sao_jax.models import get_model_config, init_model
from sao_jax.rollout import Sampler, SamplingParams, WeightPublisher
from sao_jax.sharding import MeshConfig

CONFIG = get_model_config(
    "tiny",
    vocab_size=64,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    num_experts=4,
    moe_intermediate_size=16,
    dense_intermediate_size=24,
    initializer_range=0.2,
)
TRAIN = MeshConfig(data=1, fsdp=2, expert=2, tensor=1)
ROLLOUT = MeshConfig(data=2, fsdp=1, expert=1, tensor=2)


def test_split_devices_per_process():
    train, rollout = split_devices(jax.devices(), 4)
    assert train == jax.devices()[:4] and rollout == jax.devices()[4:]
    for bad in (0, 8):
        with pytest.raises(ValueError, match="process 0 has 8 devices"):
            split_devices(jax.devices(), bad)


def test_published_weights_move_to_the_rollout_mesh_and_sample_like_unsharded_ones():
    meshes = disaggregated_meshes(TRAIN, ROLLOUT, train_per_process=4)
    trained = init_model(CONFIG, mesh=meshes.train)
    embedding = trained.embed.embedding[...]
    assert {d.id for d in embedding.sharding.device_set} == {0, 1, 2, 3}
    publisher = WeightPublisher(shardings=rollout_shardings(trained, meshes.rollout))
    snapshot = publisher.publish(trained, 1)

    placed = layout(snapshot.params)
    assert all(text.endswith("on devices [4, 5, 6, 7]") for text in placed.values()), placed
    q_proj = snapshot.params["layers"][0]["attn"]["q_proj"]["kernel"].get_value()
    assert q_proj.sharding.spec == PartitionSpec("fsdp", "tensor")  # fsdp has size 1 here
    experts = snapshot.params["layers"][0]["moe"]["experts"]["gate_proj"].get_value()
    assert experts.sharding.spec[2] == "tensor"
    for (path, new), old in zip(
        jax.tree.leaves_with_path(snapshot.params),
        jax.tree.leaves(nnx.state(trained)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old), err_msg=str(path))

    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7]]
    sampling = [SamplingParams(max_new_tokens=6, seed=3), SamplingParams(temperature=0.0)]
    unsharded = Sampler(init_model(CONFIG)).generate(prompts, sampling)
    rollout = Sampler(init_model(CONFIG), mesh=meshes.rollout)
    rollout.update_weights(snapshot.params, snapshot.version)
    sampled = rollout.generate(prompts, sampling)
    np.testing.assert_array_equal(sampled.tokens, unsharded.tokens)
    np.testing.assert_allclose(sampled.logprobs, unsharded.logprobs, atol=2e-6)
    assert sampled.policy_version == 1


def test_reshard_copies_and_names_mismatches():
    mesh = disaggregated_meshes(TRAIN, ROLLOUT, train_per_process=4).train
    tree = {"a": jax.device_put(np.arange(8.0), NamedSharding(mesh, PartitionSpec("fsdp")))}
    target = NamedSharding(mesh, PartitionSpec())
    assert transfer_method(tree["a"].sharding, target) == "device_put"  # one process
    copy = reshard(tree, target)
    tree["a"].delete()  # the learner may donate its buffers once reshard returns
    np.testing.assert_array_equal(np.asarray(copy["a"]), np.arange(8.0))
    assert copy["a"].sharding == target
    with pytest.raises(ValueError, match=r"no array for \[\"\['b'\]\"\]"):
        reshard({"a": copy["a"]}, {"a": target, "b": target})
