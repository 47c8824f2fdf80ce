"""ModelConfig presets and validation; real shapes built only abstractly."""

import math

import jax
import pytest
from flax import nnx

from sao_jax.models import ModelConfig, Transformer, get_model_config, init_model, preset_names


def _param_count(config: ModelConfig) -> int:
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract)))


def test_presets_exist_and_override():
    assert {"tiny", "small", "qwen3-30b-a3b"} <= set(preset_names())
    tiny = get_model_config("tiny", vocab_size=1234)
    assert tiny.vocab_size == 1234
    assert get_model_config("tiny").vocab_size != 1234  # presets are not mutated


def test_qwen3_30b_a3b_abstract_shapes_match_the_release():
    config = get_model_config("qwen3-30b-a3b")
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    flat = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(abstract))}
    assert flat["layers/47/moe/experts/gate_proj"].shape == (128, 2048, 768)
    assert flat["layers/0/attn/k_proj/kernel"].shape == (2048, 4 * 128)
    assert flat["lm_head/kernel"].shape == (2048, 151_936)
    total = _param_count(config)
    assert 30.4e9 < total < 30.6e9  # "30.5B total parameters"
    # Active parameters: everything except the 120 unused experts of each layer.
    expert = 3 * 2048 * 768
    active = total - config.num_layers * (128 - 8) * expert
    assert 3.2e9 < active < 3.4e9  # "3.3B activated"


def test_unknown_preset_and_bad_fields_raise_clearly():
    with pytest.raises(ValueError, match="unknown model preset 'nope'"):
        get_model_config("nope")
    with pytest.raises(ValueError, match=r"num_heads .* multiple of num_kv_heads"):
        get_model_config("tiny", num_heads=3)
    with pytest.raises(ValueError, match="num_experts_per_token"):
        get_model_config("tiny", num_experts_per_token=9)
    with pytest.raises(ValueError, match="dense_layers"):
        get_model_config("tiny", dense_layers=(5,))
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({**get_model_config("tiny").to_dict(), "bogus": 1})


def test_config_dict_round_trip_and_dense_layer_selection():
    config = get_model_config("tiny", dense_layers=(1, 0, 1))
    assert config.dense_layers == (0, 1)
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert not config.is_moe_layer(0)
    assert get_model_config("tiny").is_moe_layer(1)
    assert not get_model_config("tiny", num_experts=0).is_moe_layer(0)


def test_unregistered_dispatch_fails_at_construction():
    # every built-in dispatch registers on import of sao_jax.models, so use a name nobody has
    config = get_model_config("tiny", moe_dispatch="no_such_dispatch")
    with pytest.raises(ValueError, match="'no_such_dispatch' is not registered"):
        Transformer(config, rngs=nnx.Rngs(0))


def test_test_preset_is_the_smallest_and_routes_through_every_moe_path():
    config = get_model_config("test")
    # what the unit tests rely on it to exercise
    assert config.num_experts > config.num_experts_per_token > 1
    assert config.num_heads > config.num_kv_heads  # grouped-query attention
    assert config.num_layers > 1 and all(map(config.is_moe_layer, range(config.num_layers)))
    assert _param_count(config) < _param_count(get_model_config("tiny"))  # the next smallest

    model = init_model(config, seed=0)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, config.vocab_size)
    aux = nnx.jit(lambda m, x: m.forward(x).aux)(model, tokens)
    assert aux.expert_load.shape == (config.num_layers, config.num_experts)
    assert (aux.expert_load > 0).sum(axis=1).min() > config.num_experts_per_token
