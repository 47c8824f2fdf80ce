"""flax.nnx MoE transformer policy and critic, HF Qwen3-MoE import/export, token log-probs."""

from sao_jax.models.config import ModelConfig, MoeAuxConfig, get_model_config, preset_names
from sao_jax.models.critic import Critic
from sao_jax.models.expert_parallel import expert_parallel  # registers "expert_parallel"
from sao_jax.models.hf_qwen3_moe import (
    config_from_hf,
    config_to_hf,
    load_hf_qwen3_moe,
    save_hf_qwen3_moe,
)
from sao_jax.models.logprobs import (
    chunked_candidate_logprobs,
    chunked_token_logprobs,
    chunked_top_logprobs,
    token_logprobs_from_logits,
)
from sao_jax.models.moe import MoeAux, MoeStats
from sao_jax.models.moe_dispatch import expert_capacity, get_dispatch, register_dispatch
from sao_jax.models.safetensors_io import CheckpointError
from sao_jax.models.transformer import Backbone, ForwardOutput, Transformer, init_model

__all__ = [
    "Backbone",
    "CheckpointError",
    "Critic",
    "ForwardOutput",
    "ModelConfig",
    "MoeAux",
    "MoeAuxConfig",
    "MoeStats",
    "Transformer",
    "chunked_candidate_logprobs",
    "chunked_token_logprobs",
    "chunked_top_logprobs",
    "config_from_hf",
    "config_to_hf",
    "expert_capacity",
    "expert_parallel",
    "get_dispatch",
    "get_model_config",
    "init_model",
    "load_hf_qwen3_moe",
    "preset_names",
    "register_dispatch",
    "save_hf_qwen3_moe",
    "token_logprobs_from_logits",
]
