"""HF Qwen3-MoE import / export against transformers' Qwen3MoeForCausalLM (tiny random model
built and saved here; nothing is downloaded)."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from sao_jax.models import CheckpointError, load_hf_qwen3_moe, save_hf_qwen3_moe
from sao_jax.models.safetensors_io import SafetensorsReader, write_safetensors_dir

HF_CONFIG = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    mlp_only_layers=[1],
    norm_topk_prob=True,
    tie_word_embeddings=False,
    initializer_range=0.1,
    rope_theta=10_000.0,
)
IDS = np.random.default_rng(0).integers(0, 96, (2, 11))


def _torch_logits(model: Qwen3MoeForCausalLM) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits.float().numpy()


def _our_logits(model) -> np.ndarray:
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, ids: nnx.merge(graphdef, s)(ids))
    return np.asarray(fn(state, jnp.asarray(IDS, jnp.int32)))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**HF_CONFIG)).eval()
    path = tmp_path_factory.mktemp("hf") / "qwen3moe"
    model.save_pretrained(path)
    return path, model, _torch_logits(model)


def test_import_matches_transformers(hf_dir):
    path, _, expected = hf_dir
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in SafetensorsReader(path)
    model = load_hf_qwen3_moe(path, dtype=jnp.float32)
    assert model.config.dense_layers == (1,)
    assert model.config.num_experts == 8 and not model.config.tie_embeddings
    logits = _our_logits(model)
    assert logits.shape == (2, 11, 96)
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)


def test_import_fused_experts_from_sharded_files(hf_dir, tmp_path):
    """transformers' in-memory (fused) layout, written as 3 shards plus an index."""
    path, model, expected = hf_dir
    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in tensors
    files = write_safetensors_dir(tmp_path, tensors, max_shard_bytes=120_000)
    assert len(files) >= 2 and (tmp_path / "model.safetensors.index.json").exists()
    shutil.copy(path / "config.json", tmp_path / "config.json")
    np.testing.assert_allclose(_our_logits(load_hf_qwen3_moe(tmp_path)), expected, atol=1e-4)


@pytest.mark.parametrize("fused", [False, True])
def test_export_round_trip_loads_in_transformers(hf_dir, tmp_path, fused):
    path, _, expected = hf_dir
    model = load_hf_qwen3_moe(path)
    save_hf_qwen3_moe(model, tmp_path, fused_experts=fused)
    reloaded = load_hf_qwen3_moe(tmp_path)
    for a, b in zip(
        jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(reloaded)), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    torch_model = Qwen3MoeForCausalLM.from_pretrained(tmp_path).eval()
    np.testing.assert_allclose(_torch_logits(torch_model), expected, atol=1e-5)


def test_export_tied_bfloat16_model(tmp_path):
    torch.manual_seed(1)
    config = Qwen3MoeConfig(**{**HF_CONFIG, "tie_word_embeddings": True, "mlp_only_layers": []})
    torch_model = Qwen3MoeForCausalLM(config).eval()
    torch_model.save_pretrained(tmp_path / "src")
    ours = load_hf_qwen3_moe(tmp_path / "src")
    assert ours.config.tie_embeddings
    np.testing.assert_allclose(_our_logits(ours), _torch_logits(torch_model), atol=1e-4)
    save_hf_qwen3_moe(ours, tmp_path / "bf16", dtype=jnp.bfloat16)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert "lm_head.weight" not in SafetensorsReader(tmp_path / "bf16")
    back = load_hf_qwen3_moe(tmp_path / "bf16", dtype=jnp.bfloat16)
    embedding = back.embed.embedding[...]
    assert embedding.dtype == jnp.bfloat16
    np.testing.assert_array_equal(embedding, ours.embed.embedding[...].astype(jnp.bfloat16))
    reloaded = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    np.testing.assert_allclose(_torch_logits(reloaded), _torch_logits(torch_model), atol=0.1)


def test_missing_or_wrong_files_and_keys_raise_clear_errors(hf_dir, tmp_path):
    path, model, _ = hf_dir
    with pytest.raises(CheckpointError, match=r"config file not found: .*nowhere/config.json"):
        load_hf_qwen3_moe(tmp_path / "nowhere")

    tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    (tmp_path / "no_weights").mkdir()
    shutil.copy(path / "config.json", tmp_path / "no_weights" / "config.json")
    with pytest.raises(CheckpointError, match=r"no model.safetensors or model.safetensors.index"):
        load_hf_qwen3_moe(tmp_path / "no_weights")

    missing = dict(tensors)
    del missing["model.layers.1.self_attn.k_norm.weight"]
    write_safetensors_dir(tmp_path / "missing", missing)
    shutil.copy(path / "config.json", tmp_path / "missing" / "config.json")
    with pytest.raises(
        CheckpointError, match=r"'model.layers.1.self_attn.k_norm.weight' not found"
    ):
        load_hf_qwen3_moe(tmp_path / "missing")

    extra = {**tensors, "model.layers.0.mlp.shared_expert.weight": np.zeros((2, 2), np.float32)}
    write_safetensors_dir(tmp_path / "extra", extra)
    shutil.copy(path / "config.json", tmp_path / "extra" / "config.json")
    with pytest.raises(CheckpointError, match="shared_expert"):
        load_hf_qwen3_moe(tmp_path / "extra")

    hf = json.loads((path / "config.json").read_text())
    write_safetensors_dir(tmp_path / "shape", tensors)
    (tmp_path / "shape" / "config.json").write_text(json.dumps({**hf, "moe_intermediate_size": 16}))
    with pytest.raises(
        CheckpointError,
        match=r"shape mismatch for layers/0/moe/experts/down_proj: checkpoint gives \(8, 32, 64\)",
    ):
        load_hf_qwen3_moe(tmp_path / "shape")

    (tmp_path / "shape" / "config.json").write_text(json.dumps({**hf, "model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"config.json: model_type is 'llama'"):
        load_hf_qwen3_moe(tmp_path / "shape")

    del hf["hidden_size"]
    (tmp_path / "shape" / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"config.json: missing required key 'hidden_size'"):
        load_hf_qwen3_moe(tmp_path / "shape")

    files = write_safetensors_dir(tmp_path / "shards", tensors, max_shard_bytes=120_000)
    shutil.copy(path / "config.json", tmp_path / "shards" / "config.json")
    files[-1].unlink()
    with pytest.raises(CheckpointError, match=f"safetensors file not found: .*{files[-1].name}"):
        load_hf_qwen3_moe(tmp_path / "shards")
