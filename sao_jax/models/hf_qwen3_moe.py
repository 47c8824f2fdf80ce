"""Import and export Hugging Face Qwen3-MoE checkpoints (`Qwen3MoeForCausalLM`).

A HF directory holds `config.json` and safetensors (one file, or shards + an index). Expert
weights come in two layouts, both read here:
- per expert (what `transformers` writes, and the official Qwen releases):
  `model.layers.{i}.mlp.experts.{j}.{gate,up,down}_proj.weight`, [F, D] / [D, F];
- fused (transformers 5.x in-memory layout, written by some exporters):
  `model.layers.{i}.mlp.experts.gate_up_proj` [E, 2F, D] (gate rows first) and
  `model.layers.{i}.mlp.experts.down_proj` [E, D, F].
torch Linear weights are [out, in]; ours are [in, out], hence the transposes.

A model with `scan_layers=True` stores each group of layers stacked (`layers/moe_group0/...`,
leading layer axis): import stacks the group's per-layer tensors (with a mesh, each device
reads only the layers and slices of its own shard), export slices one layer at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax.models.config import ModelConfig
from sao_jax.models.safetensors_io import CheckpointError, SafetensorsReader, write_safetensors_dir
from sao_jax.models.transformer import Transformer, unstack_layer_params
from sao_jax.sharding import LogicalRules, state_shardings

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _require(cfg: dict, key: str, file: Path) -> Any:
    if key not in cfg:
        raise CheckpointError(f"{file}: missing required key {key!r}")
    return cfg[key]


def config_from_hf(
    hf: dict[str, Any], *, file: Path = Path("config.json"), **overrides: Any
) -> ModelConfig:
    """ModelConfig from a Qwen3-MoE `config.json` dict (errors name the file and key)."""
    model_type = hf.get("model_type")
    if model_type not in ("qwen3_moe", None):
        raise CheckpointError(f"{file}: model_type is {model_type!r}, expected 'qwen3_moe'")
    for key, unsupported in (("attention_bias", True), ("use_sliding_window", True)):
        if hf.get(key) == unsupported:
            raise CheckpointError(f"{file}: {key}={unsupported} is not supported")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{file}: hidden_act={hf['hidden_act']!r} is not supported (silu)")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(f"{file}: rope_type={rope.get('rope_type')!r} is not supported")
    rope_theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
    layers = _require(hf, "num_hidden_layers", file)
    num_experts = hf.get("num_experts", hf.get("num_local_experts", 0)) or 0
    step = hf.get("decoder_sparse_step", 1) or 1
    mlp_only = set(hf.get("mlp_only_layers", []) or [])
    dense_layers = tuple(i for i in range(layers) if i in mlp_only or (i + 1) % step != 0)
    d_model = _require(hf, "hidden_size", file)
    heads = _require(hf, "num_attention_heads", file)
    fields = dict(
        vocab_size=_require(hf, "vocab_size", file),
        d_model=d_model,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or d_model // heads,
        num_experts=num_experts,
        num_experts_per_token=hf.get("num_experts_per_tok", 1) if num_experts else 0,
        moe_intermediate_size=hf.get("moe_intermediate_size", 0),
        dense_intermediate_size=hf.get("intermediate_size", 0),
        dense_layers=dense_layers if num_experts else (),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        qk_norm=True,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rope_theta=float(rope_theta),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_seq_len=int(hf.get("max_position_embeddings", 4096)),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def config_to_hf(config: ModelConfig, dtype: str) -> dict[str, Any]:
    """A `config.json` dict that `Qwen3MoeForCausalLM` loads with the same shapes."""
    if not config.qk_norm:
        raise ValueError("Qwen3-MoE always has QK-norm; this model has qk_norm=False")
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.dense_intermediate_size,
        "moe_intermediate_size": config.moe_intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_token,
        "norm_topk_prob": config.norm_topk_prob,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(config.dense_layers),
        "tie_word_embeddings": config.tie_embeddings,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_seq_len,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "output_router_logits": False,
        "dtype": dtype,
    }


def _hf_layer(i: int) -> str:
    return f"model.layers.{i}"


_LAYER_LINEAR = {
    ("attn", "q_proj"): "self_attn.q_proj",
    ("attn", "k_proj"): "self_attn.k_proj",
    ("attn", "v_proj"): "self_attn.v_proj",
    ("attn", "o_proj"): "self_attn.o_proj",
    ("mlp", "gate_proj"): "mlp.gate_proj",
    ("mlp", "up_proj"): "mlp.up_proj",
    ("mlp", "down_proj"): "mlp.down_proj",
    ("moe", "router"): "mlp.gate",
}
_LAYER_NORM = {
    ("attn_norm",): "input_layernorm",
    ("ffn_norm",): "post_attention_layernorm",
    ("attn", "q_norm"): "self_attn.q_norm",
    ("attn", "k_norm"): "self_attn.k_norm",
}


class _Importer:
    """Reads one of our parameters (by path) from a HF checkpoint, recording keys consumed."""

    def __init__(self, reader: SafetensorsReader, config: ModelConfig):
        self.reader = reader
        self.config = config
        self.used: set[str] = set()

    def _get(self, key: str) -> np.ndarray:
        self.used.add(key)
        return self.reader.get(key)

    def _experts(self, layer: int, name: str) -> np.ndarray:
        prefix = f"{_hf_layer(layer)}.mlp.experts"
        f = self.config.moe_intermediate_size
        if f"{prefix}.gate_up_proj" in self.reader:  # fused layout
            if name == "down_proj":
                return np.swapaxes(self._get(f"{prefix}.down_proj"), 1, 2)
            gate_up = self._get(f"{prefix}.gate_up_proj")
            part = gate_up[:, :f] if name == "gate_proj" else gate_up[:, f:]
            return np.swapaxes(part, 1, 2)
        return np.stack(
            [self._get(f"{prefix}.{j}.{name}.weight").T for j in range(self.config.num_experts)]
        )

    def group_layers(self, path: tuple) -> range | None:
        """Layers stacked in the scanned parameter `path` (None: not a stacked parameter)."""
        if path[0] != "layers" or isinstance(path[1], int) or str(path[1]).isdigit():
            return None
        for group in self.config.layer_groups():
            if group.name == path[1]:
                return range(group.start, group.stop)
        raise CheckpointError(f"no layer group {path[1]!r} in this config (parameter {path})")

    def read_stacked(self, path: tuple, index: tuple[slice, ...], shape: tuple[int, ...]):
        """Block `index` of the stacked parameter `path` of `shape`, one layer at a time."""
        layers = self.group_layers(path)
        key = "/".join(map(str, path))
        blocks = []
        for i in list(layers)[index[0]]:
            array = self.read(("layers", i, *path[2:]))
            if tuple(array.shape) != tuple(shape[1:]):
                raise CheckpointError(
                    f"{self.reader.directory}: shape mismatch for {key} (layer {i}): checkpoint "
                    f"gives {tuple(array.shape)}, config.json implies {tuple(shape[1:])}"
                )
            blocks.append(np.asarray(array[index[1:]]))
        return np.stack(blocks)

    def read(self, path: tuple) -> np.ndarray:
        if path == ("embed", "embedding"):
            return self._get("model.embed_tokens.weight")
        if path == ("final_norm", "scale"):
            return self._get("model.norm.weight")
        if path == ("lm_head", "kernel"):
            return self._get("lm_head.weight").T
        if path[0] == "layers":
            i, rest = int(path[1]), tuple(path[2:])
            if rest[:2] in _LAYER_LINEAR and rest[-1] == "kernel":
                return self._get(f"{_hf_layer(i)}.{_LAYER_LINEAR[rest[:2]]}.weight").T
            if rest[:-1] in _LAYER_NORM and rest[-1] == "scale":
                return self._get(f"{_hf_layer(i)}.{_LAYER_NORM[rest[:-1]]}.weight")
            if rest[:2] == ("moe", "experts"):
                return self._experts(i, rest[2])
        raise CheckpointError(f"no HF Qwen3-MoE key maps to parameter {'/'.join(map(str, path))}")


def load_hf_qwen3_moe(
    path: str | Path,
    dtype: jnp.dtype | str = jnp.float32,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules: LogicalRules | None = None,
    **config_overrides: Any,
) -> Transformer:
    """Load a HF Qwen3-MoE directory as a `Transformer`.

    Args:
      path: directory with `config.json` and `model.safetensors` (or an index + shards).
      dtype: parameter and compute dtype (float32 for parity checks, bfloat16 for serving).
      mesh: if given, every parameter is placed straight onto its logical sharding.
      rules: logical-axis rules for `mesh` (default: `sao_jax.sharding.DEFAULT_RULES`).
      config_overrides: ModelConfig fields to change, e.g. moe_dispatch="ragged_dot". The
        default capacity_factor is 0 (dropless), which is what `transformers` computes.
    Returns:
      the model; `model(input_ids [B, T] int32)` gives float32 logits [B, T, V].
    Raises:
      CheckpointError naming the file and key when a file or tensor is missing or mis-shaped.
    """
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"config file not found: {config_file}")
    try:
        hf_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_file}: invalid JSON ({e})") from None
    name = jnp.dtype(dtype).name
    config_overrides.setdefault("capacity_factor", 0.0)  # dropless, as transformers computes
    config_overrides.setdefault("dtype", name)
    config_overrides.setdefault("param_dtype", name)
    config = config_from_hf(hf_config, file=config_file, **config_overrides)
    reader = SafetensorsReader(directory)
    importer = _Importer(reader, config)

    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = state_shardings(state, mesh, rules) if mesh is not None else None
    flat_shardings = dict(nnx.to_flat_state(shardings)) if shardings is not None else {}
    for param_path, variable in nnx.to_flat_state(state):
        expected = variable.get_value()
        sharding = flat_shardings[param_path].get_value() if shardings is not None else None
        if importer.group_layers(param_path) is not None:
            shape = tuple(expected.shape)

            def block(index, path=param_path, shape=shape, dtype=expected.dtype):
                index = tuple(index) + (slice(None),) * (len(shape) - len(index))
                return importer.read_stacked(path, index, shape).astype(dtype)

            if sharding is None:
                array = block((slice(None),) * len(shape))
                variable.set_value(jax.device_put(array))
            else:
                variable.set_value(jax.make_array_from_callback(shape, sharding, block))
            continue
        array = importer.read(param_path)
        if tuple(array.shape) != tuple(expected.shape):
            key = "/".join(map(str, param_path))
            raise CheckpointError(
                f"{directory}: shape mismatch for {key}: checkpoint gives {tuple(array.shape)}, "
                f"config.json implies {tuple(expected.shape)}"
            )
        array = np.asarray(array).astype(expected.dtype)
        variable.set_value(jax.device_put(array, sharding))
    unused = [
        k
        for k in reader.tensor_names()
        if k not in importer.used and not k.endswith(_IGNORED_SUFFIXES)
    ]
    if config.tie_embeddings:
        unused = [k for k in unused if k != "lm_head.weight"]
    if unused:
        raise CheckpointError(
            f"{directory}: {len(unused)} tensors do not map to a Qwen3-MoE parameter "
            f"(e.g. {unused[:5]}); is this a Qwen3-MoE checkpoint?"
        )
    return nnx.merge(graphdef, state)


_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


class _LayerSlice:
    """A stacked parameter, indexed lazily: `view[j][...]` is layer j's array (on device)."""

    def __init__(self, variable: nnx.Variable, layer: int | None = None):
        self.variable, self.layer = variable, layer

    def __getitem__(self, key):
        if self.layer is None:
            return _LayerSlice(self.variable, key)
        return self.variable[...][self.layer][key]


def _export_tensors(
    model: Transformer, dtype: np.dtype, fused_experts: bool
) -> Iterator[tuple[str, np.ndarray]]:
    config = model.config
    host: Callable[[Any], np.ndarray] = lambda v: np.asarray(jax.device_get(v[...])).astype(dtype)  # noqa: E731
    flat = {path: v for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    if config.scan_layers:
        # Lazy per-layer views of the stacked arrays: one layer is sliced (on device) and
        # copied to the host at a time, never the whole stack.
        flat = unstack_layer_params(config, {p: _LayerSlice(v) for p, v in flat.items()})

    def layer_param(i: int, *rest: str) -> np.ndarray:
        return host(flat[("layers", i, *rest)])

    yield "model.embed_tokens.weight", host(model.embed.embedding)
    for i in range(config.num_layers):
        p = _hf_layer(i)
        yield f"{p}.input_layernorm.weight", layer_param(i, "attn_norm", "scale")
        yield f"{p}.post_attention_layernorm.weight", layer_param(i, "ffn_norm", "scale")
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield f"{p}.self_attn.{name}.weight", layer_param(i, "attn", name, "kernel").T
        yield f"{p}.self_attn.q_norm.weight", layer_param(i, "attn", "q_norm", "scale")
        yield f"{p}.self_attn.k_norm.weight", layer_param(i, "attn", "k_norm", "scale")
        if not config.is_moe_layer(i):
            for name in ("gate_proj", "up_proj", "down_proj"):
                yield f"{p}.mlp.{name}.weight", layer_param(i, "mlp", name, "kernel").T
            continue
        yield f"{p}.mlp.gate.weight", layer_param(i, "moe", "router", "kernel").T
        gate, up, down = (layer_param(i, "moe", "experts", n) for n in _EXPERT_NAMES)
        if fused_experts:
            gate_up = np.concatenate([gate, up], axis=2)  # [E, D, 2F]
            yield f"{p}.mlp.experts.gate_up_proj", np.ascontiguousarray(np.swapaxes(gate_up, 1, 2))
            yield f"{p}.mlp.experts.down_proj", np.ascontiguousarray(np.swapaxes(down, 1, 2))
            continue
        for j in range(config.num_experts):
            yield f"{p}.mlp.experts.{j}.gate_proj.weight", np.ascontiguousarray(gate[j].T)
            yield f"{p}.mlp.experts.{j}.up_proj.weight", np.ascontiguousarray(up[j].T)
            yield f"{p}.mlp.experts.{j}.down_proj.weight", np.ascontiguousarray(down[j].T)
    yield "model.norm.weight", host(model.final_norm.scale)
    if not config.tie_embeddings:
        yield "lm_head.weight", np.ascontiguousarray(host(model.lm_head.kernel).T)


def save_hf_qwen3_moe(
    model: Transformer,
    path: str | Path,
    *,
    dtype: jnp.dtype | str | None = None,
    fused_experts: bool = False,
    max_shard_bytes: int = 5 * 2**30,
) -> list[Path]:
    """Write `model` as a HF Qwen3-MoE directory that `Qwen3MoeForCausalLM.from_pretrained` loads.

    Args:
      model: a `Transformer` with QK-norm (every Qwen3-MoE has it).
      path: output directory (created).
      dtype: stored dtype (default: the model's parameter dtype).
      fused_experts: write fused `gate_up_proj` / `down_proj` expert tensors instead of the
        per-expert keys that `transformers` itself writes.
      max_shard_bytes: larger checkpoints are split into shards with an index.
    Returns:
      the safetensors files written.
    """
    np_dtype = np.dtype(jnp.dtype(dtype if dtype is not None else model.config.param_dtype))
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = config_to_hf(model.config, jnp.dtype(np_dtype).name)
    files = write_safetensors_dir(
        directory,
        _export_tensors(model, np_dtype, fused_experts),
        max_shard_bytes=max_shard_bytes,
    )
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    return files
