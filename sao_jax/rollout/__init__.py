"""Rollout: KV-cache sampler (this package grows the agent loop and the async engine)."""

from sao_jax.rollout.kv_cache import KVCache, init_kv_cache, kv_cache_shardings
from sao_jax.rollout.sampler import DecodeState, Sampler, SampleResult, bucket
from sao_jax.rollout.sampling import SamplingParams, sample_tokens, token_logprob

__all__ = [
    "DecodeState",
    "KVCache",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "bucket",
    "init_kv_cache",
    "kv_cache_shardings",
    "sample_tokens",
    "token_logprob",
]
