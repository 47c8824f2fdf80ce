"""What a worker serves: a sao_jax `Transformer` and its tokenizer, from a preset or a checkpoint.

Sources:
- `--config tiny` (any preset name): random weights (seeded) and, for `tiny` and `tiny_64k`,
  the byte-level BPE of `tiny_tokenizer`; other presets need `--tokenizer`.
- `--checkpoint DIR` holding `config.json`: a Hugging Face Qwen3-MoE directory
  (`load_hf_qwen3_moe`), tokenizer from its `tokenizer.json`.
- `--checkpoint DIR` of numbered step folders: an orbax checkpoint written by
  `sao_jax.checkpoint.Checkpointer` with a `policy` item. The model config comes from the step's
  metadata `model_config` (a `ModelConfig.to_dict()`), else from `--config`; the policy version
  from metadata `policy_version`, else the step; the tokenizer from `--tokenizer`,
  `DIR/tokenizer.json`, or the tiny tokenizer when the config is `tiny`.

`load_policy_weights` reads either checkpoint kind as parameters for a live weight swap.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from flax import nnx

from sao_jax.checkpoint import Checkpointer
from sao_jax.models import ModelConfig, Transformer, get_model_config, init_model
from sao_jax.models.hf_qwen3_moe import load_hf_qwen3_moe
from sao_jax.tokenizers import CHATML_JINJA_TEMPLATE, HFTokenizer, load_tokenizer
from serving.common.tiny_tokenizer import build_tiny_tokenizer

# Presets served with the byte-level BPE of `tiny_tokenizer` and float32 weights.
TINY_PRESETS = ("tiny", "tiny_64k")

POLICY_ITEM = "policy"


@dataclasses.dataclass
class ServedModel:
    """A model ready to serve. `model_id` is the name clients pass as `model`."""

    model: Transformer
    tokenizer: HFTokenizer
    model_id: str
    policy_version: int
    checkpoint: str = ""


def is_hf_directory(path: Path) -> bool:
    return (path / "config.json").is_file()


def _tokenizer_for(path: Path | None, tokenizer: str | None, config_name: str | None):
    if tokenizer:
        return load_tokenizer(tokenizer)
    if path is not None and (path / "tokenizer.json").is_file():
        return load_tokenizer(path)
    if config_name in TINY_PRESETS:
        return build_tiny_tokenizer()
    raise ValueError(
        "no tokenizer: pass --tokenizer PATH (a tokenizer.json or its directory)"
        + (f"; {path} has no tokenizer.json" if path is not None else "")
    )


def _restore_orbax_policy(
    path: Path, config: ModelConfig | None, step: int | None
) -> tuple[Transformer, dict[str, Any], int]:
    checkpointer = Checkpointer(path, create=False)
    try:
        metadata = checkpointer.metadata(step)
        step = checkpointer.latest_step() if step is None else step
        if "model_config" in metadata:
            config = ModelConfig.from_dict(metadata["model_config"])
        if config is None:
            raise ValueError(
                f"{path}: the checkpoint metadata has no 'model_config'; pass --config NAME"
            )
        abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
        restored = checkpointer.restore({POLICY_ITEM: abstract}, step=step)
    finally:
        checkpointer.close()
    return restored.items[POLICY_ITEM], metadata, int(step)


def load_served_model(
    *,
    config_name: str | None = "tiny",
    checkpoint: str | None = None,
    tokenizer: str | None = None,
    model_id: str | None = None,
    seed: int = 0,
    dtype: str = "float32",
    step: int | None = None,
) -> ServedModel:
    """Build the served model and tokenizer (see the module docstring for the sources)."""
    if checkpoint:
        path = Path(checkpoint)
        if not path.is_dir():
            raise FileNotFoundError(f"--checkpoint {checkpoint}: no such directory")
        if is_hf_directory(path):
            model = load_hf_qwen3_moe(path, jnp.dtype(dtype))
            version = 0
        else:
            preset = get_model_config(config_name) if config_name else None
            model, metadata, step = _restore_orbax_policy(path, preset, step)
            version = int(metadata.get("policy_version", step))
        tok = _tokenizer_for(path, tokenizer, config_name)
        name = model_id or path.name
        source = str(path.resolve())
    else:
        if not config_name:
            raise ValueError("pass --config NAME or --checkpoint PATH")
        tok = _tokenizer_for(None, tokenizer, config_name)
        config = get_model_config(config_name, vocab_size=max(tok.vocab_size, 1))
        if config_name not in TINY_PRESETS:
            config = config.replace(dtype=dtype, param_dtype=dtype)
        model = init_model(config, seed=seed)
        name, version, source = model_id or f"sao-{config_name}", 0, ""
    if tok.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tok.vocab_size} ids but the model only {model.config.vocab_size}"
        )
    return ServedModel(model, tok, name, version, source)


def load_policy_weights(
    path: str | Path, config: ModelConfig, *, step: int | None = None
) -> tuple[nnx.State, int | None]:
    """Parameters for a live swap from an orbax (`policy` item) or HF checkpoint directory.

    Returns (params, version recorded in the checkpoint or None). Shapes are checked against
    the served model by `Sampler.update_weights`.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    if is_hf_directory(path):
        model = load_hf_qwen3_moe(path, config.params_dtype)
        return nnx.state(model), None
    model, metadata, step = _restore_orbax_policy(path, config, step)
    version = metadata.get("policy_version")
    return nnx.state(model), None if version is None else int(version)


def tokenizer_fingerprint(tokenizer: HFTokenizer) -> str:
    """sha256 prefix of the tokenizer's full definition (vocabulary, merges, specials)."""
    return hashlib.sha256(tokenizer.backend.to_str().encode()).hexdigest()[:16]


def template_fingerprint(tokenizer: HFTokenizer) -> str:
    """Identifies the prompt template as the model sees it: ChatML source + tokenizer."""
    digest = hashlib.sha256(CHATML_JINJA_TEMPLATE.encode())
    digest.update(tokenizer_fingerprint(tokenizer).encode())
    return "chatml-" + digest.hexdigest()[:16]
