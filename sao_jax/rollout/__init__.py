"""Rollout: KV-cache sampler, multi-turn agent loop, async engine, weight publication, eval."""

from sao_jax.rollout.agent_loop import AgentLoop, EnvConfig, RolloutConfig
from sao_jax.rollout.demos import collect_expert_demos, expert_reply
from sao_jax.rollout.engine import EngineConfig, RolloutEngine, WorkerError
from sao_jax.rollout.episode import Episode, Turn
from sao_jax.rollout.evaluate import EvalResult, evaluate
from sao_jax.rollout.kv_cache import KVCache, init_kv_cache, kv_cache_shardings
from sao_jax.rollout.sampler import DecodeState, Sampler, SampleResult, bucket
from sao_jax.rollout.sampling import SamplingParams, sample_tokens, token_logprob
from sao_jax.rollout.stats import RolloutStats, combine_snapshots
from sao_jax.rollout.weights import WeightPublisher, WeightSnapshot, sync_sampler

__all__ = [
    "AgentLoop",
    "DecodeState",
    "EngineConfig",
    "EnvConfig",
    "Episode",
    "EvalResult",
    "KVCache",
    "RolloutConfig",
    "RolloutEngine",
    "RolloutStats",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "Turn",
    "WeightPublisher",
    "WeightSnapshot",
    "WorkerError",
    "bucket",
    "collect_expert_demos",
    "combine_snapshots",
    "evaluate",
    "expert_reply",
    "init_kv_cache",
    "kv_cache_shardings",
    "sample_tokens",
    "sync_sampler",
    "token_logprob",
]
