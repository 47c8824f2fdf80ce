"""Admission control of the worker, as pure functions: request validation and AReaL's
staleness capacity (docs/algorithms.md, "Staleness").

    capacity = min(max_concurrent - running,
                   (eta + version + 1) * batch - (accepted + running))

`running`: requests queued or holding a slot; `accepted`: requests finished normally since the
worker started; `version`: policy versions since then; `batch`: LLM calls the learner consumes
per version; `eta`: how many versions generation may run ahead of the learner (None: no limit).
A request arriving when capacity <= 0 is answered 429.
"""

from __future__ import annotations

from serving.common.errors import bad_request
from serving.worker.generation import GenerationRequest

TOP_LOGPROBS_MAX = 20  # OpenAI's limit


def staleness_capacity(
    *,
    running: int,
    max_concurrent: int,
    accepted: int,
    versions_since_start: int,
    max_staleness: int | None,
    batch_size: int,
) -> tuple[int, str]:
    """(requests that may still be admitted, the binding limit: "queue" or "staleness")."""
    room = max_concurrent - running
    if max_staleness is None:
        return room, "queue"
    budget = (max_staleness + versions_since_start + 1) * batch_size
    staleness = budget - (accepted + running)
    return (staleness, "staleness") if staleness < room else (room, "queue")


def validate_request(
    request: GenerationRequest,
    *,
    vocab_size: int,
    context_length: int,
    stop_ids: tuple[int, ...],
    max_stop_tokens: int,
) -> None:
    """400 (naming the field) for a request the model or the KV cache cannot take."""
    ids = request.input_ids
    if not ids:
        raise bad_request("the prompt is empty", param="input_ids")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise bad_request(f"prompt token ids must be in [0, {vocab_size})", param="input_ids")
    if request.max_tokens < 1:
        raise bad_request("max_tokens must be >= 1", param="max_tokens")
    total = len(ids) + request.max_tokens
    if total > context_length:
        raise bad_request(
            f"this model's context is {context_length} tokens; the prompt has {len(ids)} and "
            f"{request.max_tokens} more were requested ({total} in total)",
            param="max_tokens",
            code="context_length_exceeded",
        )
    if len(stop_ids) > max_stop_tokens:
        raise bad_request(f"at most {max_stop_tokens} stop token ids", param="stop_token_ids")
    if not 0 <= request.top_logprobs <= TOP_LOGPROBS_MAX:
        raise bad_request(f"top_logprobs must be in [0, {TOP_LOGPROBS_MAX}]", param="top_logprobs")
    if request.temperature < 0:
        raise bad_request("temperature must be >= 0", param="temperature")
    if not 0.0 < request.top_p <= 1.0:
        raise bad_request("top_p must be in (0, 1]", param="top_p")
    if request.top_k < 0:
        raise bad_request("top_k must be >= 0", param="top_k")
