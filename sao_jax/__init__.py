"""sao_jax: single-rollout asynchronous RL (SAO), SEED and online RL serving for MoE LLM agents."""

__version__ = "0.1.0"
