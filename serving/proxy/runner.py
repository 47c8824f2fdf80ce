"""Running one generation for a call: plan it, stream it, survive the death of its worker.

`plan_generation` turns validated OpenAI decoding settings into the worker's request and the
`DecodingParams` recorded in ATDP (the seed actually used included, so the call is replayable).
`GenerationRunner.start` submits it on the session's worker and waits for the first chunk, so
a 400 / 429 surfaces before any response byte. A worker that dies mid-generation is reported
to the router; the reply continues on the session's new worker from the tokens already
generated (the prefix becomes part of the prompt), as AReaL resubmits interrupted requests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from prometheus_client import Counter

from atdp_io import DecodingParams
from serving.common.errors import ApiError, bad_request
from serving.common.openai_requests import Decoding
from serving.proxy.recording import Generated
from serving.router.client import RouterClient
from serving.router.router import Route
from serving.worker.client import WorkerClient, WorkerUnavailable
from serving.worker.generation import Finished, GenerationRequest, TokenChunk

MAX_WORKER_MOVES = 3


@dataclasses.dataclass(frozen=True)
class CallContext:
    """Who calls and where the call goes (set by the gateway after authentication).

    ephemeral: a tenant-key call without a session; it becomes a one-call trajectory with
    `governance` (the tenant's defaults), closed right after.
    composite: the attribution of the tenant's composite policy the gateway applied
    (`serving/proxy/attribution.py`); None when none was.
    """

    session_id: str
    tenant: str
    route: Route
    ephemeral: bool = False
    governance: dict[str, Any] | None = None
    composite: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallContext:
        data = dict(data)
        data["route"] = Route.from_json(data["route"])
        return cls(**data)


@dataclasses.dataclass
class Collected:
    """Everything one generation produced, across workers if it had to move; `route` is the
    route that produced the last tokens."""

    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    sampled: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    text: str = ""
    finished: Finished | None = None
    route: Route | None = None

    def add(self, chunk: TokenChunk) -> None:
        self.ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.sampled += chunk.sampled_logprobs or [0.0] * len(chunk.token_ids)
        self.versions += chunk.versions
        self.text += chunk.text
        if chunk.top_logprobs is not None:
            self.top += chunk.top_logprobs

    @property
    def policy_version(self) -> int:
        return self.versions[0] if self.versions else 0

    def generated(self, cancelled: bool = False) -> Generated:
        """What was generated; `cancelled`: the client left (finish reason `cancelled`,
        whether or not the worker had finished)."""
        f = self.finished
        if cancelled or f is None:
            return Generated(
                self.ids,
                self.logprobs,
                self.versions,
                self.text,
                "cancelled",
                queue_s=f.queue_s if f else 0.0,
            )
        return Generated(
            self.ids,
            self.logprobs,
            self.versions,
            self.text,
            f.finish_reason,
            f.stop_reason,
            f.queue_s,
            f.error,
        )


def finish_error(finished: Finished) -> ApiError | None:
    """The error a generation that did not end normally is answered with."""
    if finished.finish_reason in ("stop", "length"):
        return None
    if finished.finish_reason == "timeout":
        return ApiError(504, "the generation exceeded the request timeout", code="timeout")
    return ApiError(500, f"the generation failed: {finished.error}", code="generation_failed")


def plan_generation(
    input_ids: list[int],
    decoding: Decoding,
    *,
    context_length: int,
    stop_ids: tuple[int, ...],
    timeout_s: float,
    extra: Mapping[str, Any],
    grammar: str | None = None,
    think_budget: int | None = None,
    max_completion_tokens: int | None = None,
) -> tuple[GenerationRequest, DecodingParams]:
    """(the worker request, the decoding parameters to record). 400 when the prompt leaves no
    room; max_tokens None, or above the rest of the context, means the rest of the context
    (clamped as vLLM's and llama.cpp's servers do: agents send the context size), and at most
    the worker's `max_completion_tokens` (an operator limit)."""
    if len(input_ids) >= context_length:
        raise bad_request(
            f"this model's context is {context_length} tokens and the prompt has "
            f"{len(input_ids)}; shorten the conversation",
            param="messages",
            code="context_length_exceeded",
        )
    room = context_length - len(input_ids)
    if max_completion_tokens is not None:
        room = min(room, max_completion_tokens)
    requested = decoding.max_tokens
    max_tokens = room if requested is None else min(requested, room)
    seed = decoding.seed if decoding.seed is not None else secrets.randbits(31)
    generation = GenerationRequest(
        input_ids=tuple(input_ids),
        max_tokens=max_tokens,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        top_k=decoding.top_k,
        seed=seed,
        stop=decoding.stop,
        top_logprobs=decoding.top_logprobs,
        request_id=secrets.token_hex(8),
        timeout_s=timeout_s,
        grammar=grammar,
        think_budget=think_budget,
    )
    recorded = DecodingParams(
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        top_k=decoding.top_k,
        max_tokens=max_tokens,
        stop=decoding.stop,
        seed=seed,
        extra={
            "requested_max_tokens": requested,
            "max_tokens_clamped": requested is not None and requested > room,
            "seed_given": decoding.seed is not None,
            "logprobs": decoding.logprobs,
            "top_logprobs": decoding.top_logprobs,
            "stop_token_ids": list(stop_ids),
            **extra,
        },
    )
    return generation, recorded


class GenerationRunner:
    """Streams generations from the session's worker, re-pinning when the worker dies."""

    def __init__(
        self,
        router: RouterClient,
        worker_client: Callable[[str], WorkerClient],
        moves_counter: Counter,
    ):
        self.router = router
        self.worker_client = worker_client
        self.moves_counter = moves_counter

    async def _chunks(
        self, call: CallContext, request: GenerationRequest, collected: Collected
    ) -> AsyncIterator[TokenChunk]:
        route, moves = call.route, 0
        while True:
            collected.route = route
            produced = len(collected.ids)
            attempt = request
            if produced:  # continue the reply where the dead worker left it
                attempt = dataclasses.replace(
                    request,
                    input_ids=request.input_ids + tuple(collected.ids),
                    max_tokens=request.max_tokens - produced,
                    seed=(request.seed * 1_000_003 + produced) % 2**32,
                    # the grammar, budget, stop strings and text carry on from these
                    continues=tuple(collected.ids),
                    continued_chars=len(collected.text),
                )
            try:
                # aclosing: when the caller stops reading (the client left), the worker's
                # generation is cancelled now, not when the generator is garbage collected
                async with contextlib.aclosing(
                    self.worker_client(route.worker).generate(attempt)
                ) as events:
                    async for event in events:
                        if isinstance(event, Finished):
                            if event.finish_reason == "cancelled":
                                # Only the worker itself cancels a request the proxy still
                                # reads: it is shutting down, so the reply moves like after a
                                # crash.
                                break
                            collected.finished = event
                            return
                        collected.add(event)
                        yield event
                raise WorkerUnavailable(f"worker {route.worker} stopped before finishing")
            except ApiError as error:
                if error.code != "shutting_down":
                    raise
                moved = await self._move(call, route, moves)
            except WorkerUnavailable:
                moved = await self._move(call, route, moves)
            route, moves = moved, moves + 1

    async def _move(self, call: CallContext, route: Route, moves: int) -> Route:
        """Report the session's worker as gone; the router answers with its new route."""
        if moves >= MAX_WORKER_MOVES:
            raise ApiError(503, "no worker could complete the request", code="no_worker")
        self.moves_counter.inc()
        return await self.router.report_failure(call.session_id, route.worker)

    async def start(
        self, call: CallContext, request: GenerationRequest
    ) -> tuple[Collected, AsyncIterator[TokenChunk]]:
        """Submit and wait for the first chunk. Returns the collector (filled as the chunks
        are consumed; `finished` set at the end) and the chunks, the first one included."""
        collected = Collected()
        chunks = self._chunks(call, request, collected)
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            return collected, _prepend([], chunks)
        return collected, _prepend([first], chunks)


class _Prefixed:
    """`items` then `rest`; closing it closes `rest` (the worker stream), started or not."""

    def __init__(self, items: list, rest: AsyncIterator):
        self._items, self._rest = list(items), rest

    def __aiter__(self) -> _Prefixed:
        return self

    async def __anext__(self):
        if self._items:
            return self._items.pop(0)
        return await self._rest.__anext__()

    async def aclose(self) -> None:
        self._items = []
        await self._rest.aclose()


def _prepend(items: list, rest: AsyncIterator) -> AsyncIterator:
    return _Prefixed(items, rest)
