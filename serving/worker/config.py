"""Configuration of a worker: the served model, the batch and admission control."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class WorkerConfig:
    """A worker process (or the worker part of `python -m serving`).

    Attributes:
      host: interface to bind (loopback by default).
      port: TCP port of the worker's internal API.
      preset: model preset name (`tiny` builds a random tiny model and its byte-level BPE).
      checkpoint: HF Qwen3-MoE directory or orbax checkpoint directory to serve instead.
      tokenizer: tokenizer.json (or its directory) when the checkpoint has none.
      model_id: the name clients pass as `model` (default: sao-<preset> or the directory name).
      seed: initialisation seed of a random (preset) model.
      dtype: parameter dtype of presets other than tiny / of HF checkpoints (float32, bfloat16).
      num_slots: requests decoded together (KV-cache slots).
      context_length: positions per slot: prompt + completion tokens, the context `/v1/models`
        advertises (None: the model's max_seq_len, at most 2048, except presets made to be
        served long, `tiny_64k`: all of it). The KV cache starts at most 4096 positions long
        and grows (powers of two) to the longest request served.
      max_completion_tokens: the most tokens one completion may generate (None: the rest of
        the context). A request asking for more (agents send the context size as max_tokens)
        is clamped to it, not refused, and ends with finish_reason "length" when it hits it.
      prefill_chunk: a prompt longer than this is encoded in pieces of this many tokens, so a
        long prompt never builds its whole [prompt, prompt] attention score matrix at once.
      prefix_cache: reuse the keys and values a finished request left in its slot when a new
        prompt starts with the same tokens (a re-sent conversation is encoded once).
      decode_steps: tokens per decode dispatch; new requests join between dispatches.
      max_prefill_batch: waiting requests prefilled in one dispatch.
      max_queue: requests that may wait for a slot; beyond it requests get 429.
      request_timeout_s: a generation still running after this long is ended ("timeout").
      max_staleness: eta of the staleness capacity (None: no staleness limit).
      staleness_batch_size: LLM calls the learner consumes per policy version.
      reprefill_on_update: after a weight swap, recompute running replies' KV caches under the
        new weights (exact log-probs for the rest of each reply).
      warmup: compile every prefill / decode shape before serving (slower start, no compile
        pause on the first requests).
      service_key: bearer key other services must present (None: no check; loopback only).
    """

    host: str = "127.0.0.1"
    port: int = 8101
    preset: str | None = dataclasses.field(default="tiny", metadata={"flag": "--config"})
    checkpoint: str | None = None
    tokenizer: str | None = None
    model_id: str | None = None
    seed: int = 0
    dtype: str = "float32"
    num_slots: int = 32
    context_length: int | None = None
    max_completion_tokens: int | None = None
    prefill_chunk: int = 2048
    prefix_cache: bool = True
    decode_steps: int = 8
    max_prefill_batch: int = 8
    max_queue: int = 256
    request_timeout_s: float = 600.0
    max_staleness: int | None = None
    staleness_batch_size: int = 1
    reprefill_on_update: bool = True
    warmup: bool = False
    service_key: str | None = None

    def __post_init__(self):
        positive = (
            "num_slots",
            "decode_steps",
            "max_prefill_batch",
            "staleness_batch_size",
            "prefill_chunk",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"WorkerConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"WorkerConfig.max_queue must be >= 0, got {self.max_queue}")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError(f"WorkerConfig.context_length must be >= 2, got {self.context_length}")
        if self.max_completion_tokens is not None and self.max_completion_tokens < 1:
            raise ValueError(
                f"WorkerConfig.max_completion_tokens must be >= 1, got {self.max_completion_tokens}"
            )
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"WorkerConfig.max_staleness must be >= 0, got {self.max_staleness}")
        if self.request_timeout_s <= 0:
            raise ValueError("WorkerConfig.request_timeout_s must be > 0")
