"""The worker: a served model, its sampler and the continuous-batching engine, as one object.

This is also the learner's in-process entry point for new weights:

    worker.follow(publisher)        # every WeightPublisher.publish(params, v) is swapped in
    future = worker.engine.update_weights(nnx.state(policy), version)   # from any thread
    await worker.update_weights(nnx.state(policy), version)             # from the event loop

Over HTTP the same swap is `POST /admin/update_weights {"version": v, "path": CKPT_DIR}`
(an orbax `Checkpointer` directory with a `policy` item, or a HF directory).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from sao_jax.rollout import Sampler
from sao_jax.rollout.weights import WeightPublisher, WeightSnapshot
from serving.common.errors import ApiError, bad_request
from serving.common.model_source import (
    ServedModel,
    load_policy_weights,
    load_served_model,
    template_fingerprint,
    tokenizer_fingerprint,
)
from serving.worker.config import WorkerConfig
from serving.worker.engine import GenerationEngine
from serving.worker.generation import GenerationHandle, GenerationRequest
from serving.worker.metrics import WorkerMetrics

DEFAULT_MAX_CONTEXT = 2048
# Presets whose whole max_seq_len is served by default (made for long-context agents).
FULL_CONTEXT_PRESETS = ("tiny_64k",)
logger = logging.getLogger(__name__)


class Worker:
    """Owns the model, the sampler and the engine thread (`start` / `stop`)."""

    def __init__(
        self,
        config: WorkerConfig,
        served: ServedModel,
        registry: CollectorRegistry | None = None,
        *,
        sampler: Sampler | None = None,
    ):
        """`sampler`: share one sampler (its compiled kernels and weights) between several
        workers in one process; default: a new one over `served.model`."""
        model_config = served.model.config
        context = config.context_length or model_config.max_seq_len
        if config.context_length is None and config.preset not in FULL_CONTEXT_PRESETS:
            context = min(context, DEFAULT_MAX_CONTEXT)
        self.config = dataclasses.replace(config, context_length=context)
        self.served = served
        self.tokenizer = served.tokenizer
        self.model_id = served.model_id
        self.sampler = sampler or Sampler(
            served.model, policy_version=served.policy_version, pad_id=self.tokenizer.pad_id
        )
        self.metrics = WorkerMetrics(registry)
        self.engine = GenerationEngine(self.sampler, self.tokenizer, self.config, self.metrics)
        self._update_lock = asyncio.Lock()
        self._warmed = False

    @classmethod
    def from_config(cls, config: WorkerConfig, registry: CollectorRegistry | None = None) -> Worker:
        served = load_served_model(
            config_name=config.preset,
            checkpoint=config.checkpoint,
            tokenizer=config.tokenizer,
            model_id=config.model_id,
            seed=config.seed,
            dtype=config.dtype,
        )
        return cls(config, served, registry)

    def start(self) -> None:
        """Start the engine (compiling every shape first when `config.warmup`)."""
        if self.config.warmup and not self._warmed:
            start = time.perf_counter()
            shapes = self.engine.warmup()
            logger.info("compiled %d shapes in %.1f s", shapes, time.perf_counter() - start)
            self._warmed = True
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    def submit(self, request: GenerationRequest) -> GenerationHandle:
        return self.engine.submit(request)

    def info(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "context_length": self.config.context_length,
            "max_completion_tokens": self.config.max_completion_tokens,
            "vocab_size": self.sampler.config.vocab_size,
            "policy_version": self.sampler.policy_version,
            "checkpoint": self.served.checkpoint,
            "tokenizer_fingerprint": tokenizer_fingerprint(self.tokenizer),
            "template_fingerprint": template_fingerprint(self.tokenizer),
        }

    def tokenizer_json(self) -> dict[str, Any]:
        """What a data proxy in another process needs to rebuild the exact tokenizer."""
        token = self.tokenizer.backend.id_to_token
        return {
            "tokenizer_json": self.tokenizer.backend.to_str(),
            "eos_token": token(self.tokenizer.eos_id),
            "pad_token": token(self.tokenizer.pad_id),
            "bos_token": None if self.tokenizer.bos_id is None else token(self.tokenizer.bos_id),
        }

    def follow(self, publisher: WeightPublisher) -> Callable[[], None]:
        """Swap in every snapshot the learner publishes (and the latest one now, if newer).

        The swap happens between two decode dispatches; requests in flight continue, their
        later tokens stamped with the new version. Returns an unsubscribe function.
        """

        def on_publish(snapshot: WeightSnapshot) -> concurrent.futures.Future:
            return self.engine.update_weights(snapshot.params, snapshot.version)

        unsubscribe = publisher.subscribe(on_publish)
        latest = publisher.latest()
        if latest is not None and latest.version > self.sampler.policy_version:
            on_publish(latest)
        return unsubscribe

    async def update_weights(self, params: Any, version: int) -> int:
        """Swap in new weights between two decode dispatches; resolves once they are live."""
        if version < 0:
            raise bad_request(f"version must be >= 0, got {version}", param="version")
        try:
            return await asyncio.wrap_future(self.engine.update_weights(params, version))
        except ValueError as error:  # shape / structure mismatch
            raise ApiError(409, f"weights do not fit the served model: {error}") from None

    async def update_weights_from_path(
        self, path: str, version: int | None = None, step: int | None = None
    ) -> int:
        """Load a checkpoint (orbax `policy` item or HF directory) and swap it in."""
        async with self._update_lock:  # one load at a time: each holds a full copy of the weights
            try:
                params, recorded = await asyncio.to_thread(
                    load_policy_weights, path, self.sampler.config, step=step
                )
            except FileNotFoundError as error:
                raise bad_request(str(error), param="path") from None
            except Exception as error:
                raise ApiError(
                    409, f"cannot load weights from {path}: {type(error).__name__}: {error}"
                ) from None
            version = recorded if version is None else version
            if version is None:
                raise bad_request(
                    "the checkpoint records no policy_version; pass 'version'", param="version"
                )
            return await self.update_weights(params, version)
