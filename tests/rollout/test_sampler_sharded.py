"""The sampler on a (data, fsdp, expert, tensor) mesh of 8 fake CPU devices produces the same
tokens and log-probs as on one device."""

import numpy as np
from rollout_testlib import small_moe_config

from sao_jax.models import init_model
from sao_jax.rollout import Sampler, SamplingParams
from sao_jax.sharding import MeshConfig, make_mesh

CONFIG = small_moe_config(64, num_layers=1)


def test_sharded_sampler_matches_single_device():
    model = init_model(CONFIG)
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, expert=2, tensor=2))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
    sampling = [
        SamplingParams(temperature=t, max_new_tokens=7, seed=i)
        for i, t in enumerate([0.0, 1.0, 0.8, 1.2])
    ]
    expected = Sampler(model).generate(prompts, sampling)
    sharded = Sampler(model, mesh=mesh)
    state = sharded.init_state(num_slots=4, cache_len=32)
    assert state.cache.keys[0].sharding.spec[0] == ("data", "fsdp", "expert")
    assert state.cache.keys[0].sharding.spec[1] == "tensor"
    got = sharded.generate(prompts, sampling)
    np.testing.assert_array_equal(got.tokens, expected.tokens)
    np.testing.assert_allclose(got.logprobs, expected.logprobs, atol=1e-5)
    np.testing.assert_array_equal(got.lengths, expected.lengths)


def test_sharded_masked_decode_matches_single_device():
    """The token mask and behaviour log-probs go through the mesh's shardings unchanged."""
    model = init_model(CONFIG)
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, expert=2, tensor=2))
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11]]
    sampling = [
        SamplingParams(temperature=1.0, top_k=5, max_new_tokens=6, seed=i) for i in range(4)
    ]
    mask = np.zeros((4, 2), np.uint32)
    mask[:, 0] = 0b1111_0000  # ids 4..7 only
    mask = mask.view(np.int32)
    outputs = []
    for sampler in (Sampler(model), Sampler(model, mesh=mesh)):
        state = sampler.init_state(num_slots=4, cache_len=32)
        state, first, _, _, first_b = sampler.prefill(
            state, prompts, [0, 1, 2, 3], sampling, token_mask=mask, behaviour=True
        )
        state, tokens, logp, _, behaviour = sampler.decode(
            state, 1, token_mask=mask, behaviour=True
        )
        outputs.append((first, first_b, tokens, logp, behaviour))
    for single, sharded in zip(*outputs, strict=True):
        np.testing.assert_allclose(single, sharded, atol=1e-5)
    first, _, tokens = outputs[0][:3]
    assert set(first.tolist()) | set(tokens[:, 0].tolist()) <= {4, 5, 6, 7}
