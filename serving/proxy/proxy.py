"""The data proxy: renders prompts, runs them on the session's worker, answers in OpenAI's
format, and records every call losslessly in the session's ATDP trajectory before answering.

One chat completion: the conversation is rendered with the served tokenizer's ChatML template
(tools included); the worker streams tokens (`runner.py`); the reply is parsed for tool calls
(`responses.py`); the new messages / tool results and the llm_call event are committed in one
durable append (`recorder.py`); only then is the response, or a stream's final chunk, sent.

The proxy also prices each call (`pricing.py`), erases or withdraws consent on request, and
(from `start` to `close`) purges expired trajectories on a schedule (`atdp_io.retention`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from atdp_io import AtdpStore, Envelope, Outcome, Redactor
from atdp_io.retention import PurgeSchedule
from sao_jax.tokenizers import Tokenizer
from serving.common import ids
from serving.common.errors import ApiError, bad_request
from serving.common.metrics import LATENCY_BUCKETS_S, new_registry
from serving.common.openai_requests import THINK_BUDGETS, ChatRequest, CompletionRequest
from serving.proxy import responses
from serving.proxy.config import ProxyConfig
from serving.proxy.grammars import output_grammar
from serving.proxy.pricing import PriceTable
from serving.proxy.recorder import CallRecord, CallRecorder
from serving.proxy.runner import (
    CallContext,
    Collected,
    GenerationRunner,
    finish_error,
    plan_generation,
)
from serving.proxy.sessions import SessionBook
from serving.router.client import RouterClient
from serving.worker.client import WorkerClient
from serving.worker.generation import GenerationRequest, TokenChunk

__all__ = ["CallContext", "DataProxy", "ProxyMetrics"]


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else new_registry()
        self.registry = r
        self.events = Counter(
            "sao_proxy_events_recorded", "ATDP events written.", ["kind"], registry=r
        )
        self.completions = Counter(
            "sao_proxy_completions",
            "Completions answered.",
            ["endpoint", "finish_reason"],
            registry=r,
        )
        self.append_seconds = Histogram(
            "sao_proxy_atdp_append_seconds",
            "Time to make one call's events durable.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.moves = Counter(
            "sao_proxy_worker_moves", "Generations continued on another worker.", registry=r
        )
        self.rewards = Counter("sao_proxy_rewards", "Rewards recorded.", registry=r)
        # Tenants and models are few and known to the operator; sessions are not, so a
        # session's cost is kept on the session instead (see docs/serving.md).
        self.cost_usd = Counter(
            "sao_proxy_cost_usd",
            "US dollars of recorded completions, from the price table.",
            ["tenant", "model"],
            registry=r,
        )


def _sse(payload: Mapping[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


class DataProxy:
    """Answers OpenAI calls for sessions and records them (see the module docstring)."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        tokenizer: Tokenizer,
        model_info: Mapping[str, Any],
        store: AtdpStore,
        router: RouterClient,
        worker_client: Callable[[str], WorkerClient],
        registry: CollectorRegistry | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.model_id = model_info["model_id"]
        self.context_length = int(model_info["context_length"])
        self.template_fingerprint = model_info["template_fingerprint"]
        self.metrics = ProxyMetrics(registry)
        envelope = Envelope(
            harness_schema=self.template_fingerprint,
            policy_checkpoint=model_info.get("checkpoint") or self.model_id,
        )
        disabled = tuple(config.redact_disable)
        self.sessions = SessionBook(
            store,
            lambda: Redactor(tokenizer=tokenizer, disable=disabled),
            config.writer_threads,
            envelope,
        )
        self.runner = GenerationRunner(router, worker_client, self.metrics.moves)
        self.prices = PriceTable.from_file(config.prices) if config.prices else PriceTable()
        self.recorder = CallRecorder(
            self.sessions,
            model_id=self.model_id,
            template_fingerprint=self.template_fingerprint,
            events_counter=self.metrics.events,
            append_seconds=self.metrics.append_seconds,
            prices=self.prices,
            cost_counter=self.metrics.cost_usd,
        )
        self.purge_schedule: PurgeSchedule | None = None
        self._purging = False
        if config.purge_every_s is not None:
            self.purge_schedule = PurgeSchedule(store, every_s=config.purge_every_s)

    # ------------------------------------------------------------------ sessions

    async def open_session(
        self, session_id: str, tenant: str, governance: Mapping[str, Any], task: Mapping[str, Any]
    ) -> dict[str, Any]:
        await self.sessions.open(session_id, tenant, governance, task)
        return {"trajectory_id": session_id}

    async def set_reward(
        self,
        session_id: str,
        tenant: str,
        value: float,
        *,
        interaction_id: str | None = None,
        source: str = "user",
    ) -> dict[str, Any]:
        """A reward for one completion (by interaction id) or the session's last one; appended
        as a late-bound record, also after the session ended."""
        state = await self.sessions.get(session_id, tenant)
        if interaction_id is not None:
            if interaction_id not in state.interactions:
                raise ApiError(
                    404,
                    f"no completion {interaction_id!r} in this session",
                    param="interaction_id",
                    code="interaction_not_found",
                )
            event_index = state.interactions[interaction_id]
        elif state.last_llm is None:
            raise ApiError(409, "the session has no completion to reward yet", code="no_completion")
        else:
            event_index = state.last_llm
        await self.sessions.add_reward(state, value, event_index, source)
        self.metrics.rewards.inc()
        return {"trajectory_id": session_id, "event_index": event_index, "reward": value}

    async def end_session(
        self, session_id: str, tenant: str, *, success: bool | None, info: Mapping[str, Any]
    ) -> dict[str, Any]:
        state = await self.sessions.get(session_id, tenant)
        async with state.lock:
            try:
                outcome = Outcome(success=success, info=dict(info))
            except ValueError as error:
                raise bad_request(f"invalid outcome: {error}") from None
            await self.sessions.close(state, outcome)
        return {"trajectory_id": session_id, "ended": True, "cost_usd": state.cost_usd}

    async def session_cost(self, session_id: str, tenant: str) -> dict[str, Any]:
        """The session's cost so far: the sum of its recorded calls' `cost_usd`."""
        state = await self.sessions.get(session_id, tenant)
        return {"trajectory_id": session_id, "cost_usd": state.cost_usd}

    def export(self, tenant: str | None, **kwargs: Any) -> AsyncIterator[bytes]:
        return self.sessions.export(tenant, **kwargs)

    async def delete(
        self, tenant: str, *, requested_by: str, reason: str, **selector: Any
    ) -> list[str]:
        """Erases the selected trajectories of `tenant` (see `SessionBook.delete`)."""
        return await self.sessions.delete(
            tenant, requested_by=requested_by, reason=reason, **selector
        )

    async def withdraw_consent(
        self, tenant: str, *, requested_by: str, **selector: Any
    ) -> list[str]:
        return await self.sessions.withdraw_consent(tenant, requested_by=requested_by, **selector)

    def start(self) -> None:
        """Starts the scheduled purge (its first pass runs now, on its own thread)."""
        if self.purge_schedule is not None and not self._purging:
            self.purge_schedule.start()
            self._purging = True

    async def close(self) -> None:
        if self._purging:
            self._purging = False
            await asyncio.to_thread(self.purge_schedule.stop)  # waits out a purge in progress
        await self.sessions.shutdown()

    # ------------------------------------------------------------------ shared

    def _plan(
        self,
        input_ids: list[int],
        request,
        extra: dict[str, Any],
        index: int = 0,
        grammar: str | None = None,
        think_budget: int | None = None,
    ):
        """The generation of sample `index` of `request.n`: a given seed is kept for sample 0
        and derived for the others, so every sample is replayable from its recorded seed."""
        decoding = request.decoding
        if index and decoding.seed is not None:
            decoding = dataclasses.replace(
                decoding, seed=(decoding.seed * 1_000_003 + index) % 2**63
            )
        recorded = {**extra, "ignored_fields": list(request.ignored)}
        if request.n > 1:
            recorded.update(n=request.n, sample_index=index)
        return plan_generation(
            input_ids,
            decoding,
            context_length=self.context_length,
            stop_ids=tuple(self.tokenizer.stop_ids),
            timeout_s=self.config.request_timeout_s,
            extra=recorded,
            grammar=grammar,
            think_budget=think_budget,
        )

    async def _start_samples(
        self, call: CallContext, plans: list[GenerationRequest]
    ) -> list[tuple[Collected, AsyncIterator[TokenChunk]]]:
        """Submit every sample (they decode together on the worker); if one is refused, the
        ones already running are cancelled and the error is raised."""
        started: list[tuple[Collected, AsyncIterator[TokenChunk]]] = []
        try:
            for generation in plans:
                started.append(await self.runner.start(call, generation))
        except BaseException:
            for _, chunks in started:
                await chunks.aclose()
            raise
        return started

    def _common(self, interaction_id: str) -> dict[str, Any]:
        return dict(
            completion_id=interaction_id,
            created=int(time.time()),
            model=self.model_id,
            system_fingerprint=self.template_fingerprint,
        )

    async def _finish(self, call, record, collected: Collected, reply) -> None:
        """Record the call, or record the failure and raise its error. The log-probs of the
        distribution each token was drawn from (temperature, top-k, top-p, grammar mask) go
        with the decoding parameters as `sampled_logprobs` [N]; `output_logprobs` stay the
        policy's own at temperature 1."""
        extra = {**record.decoding.extra, "sampled_logprobs": list(collected.sampled)}
        record = dataclasses.replace(
            record, decoding=dataclasses.replace(record.decoding, extra=extra)
        )
        error = finish_error(collected.finished)
        if error is not None:
            await self.recorder.record_failure(call, record, collected)
            raise error
        await self.recorder.record(call, record, collected, reply)

    # ------------------------------------------------------------------ chat

    def _render_chat(self, request: ChatRequest) -> tuple[list[int], list[dict[str, Any]] | None]:
        tools = request.tools if request.tool_choice != "none" else None
        try:
            return self.tokenizer.encode_chat(request.messages, tools=tools), tools
        except (TypeError, ValueError) as error:
            raise bad_request(f"cannot render the messages: {error}", param="messages") from None

    def _chat_logprobs(self, request: ChatRequest, ids, logprobs, top):
        if not request.decoding.logprobs:
            return None
        top = top if request.decoding.top_logprobs else None
        return responses.chat_logprobs(self.tokenizer, ids, logprobs, top)

    def _chat_extra(self, request: ChatRequest) -> dict[str, Any]:
        extra: dict[str, Any] = {"tool_choice": request.tool_choice}
        if request.reasoning_effort is not None:
            extra["reasoning_effort"] = request.reasoning_effort
            extra["think_budget"] = THINK_BUDGETS[request.reasoning_effort]
        return extra

    async def chat(
        self, request: ChatRequest, call: CallContext
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat completion: the response body, or SSE bytes when `request.stream`. With
        `n` > 1 each choice is its own sample, recorded as its own llm_call event."""
        started = time.monotonic()
        input_ids, tools = self._render_chat(request)
        extra = self._chat_extra(request)
        grammar = output_grammar(request, tools, self.tokenizer)
        if grammar is not None:  # recorded: the mask is part of the sampling distribution
            extra.update(response_format=request.response_format, grammar=grammar)
        records, plans = [], []
        for index in range(request.n):
            generation, decoding = self._plan(
                input_ids, request, extra, index, grammar, extra.get("think_budget")
            )
            interaction_id = ids.interaction_id("chatcmpl", call.session_id)
            records.append(
                CallRecord(
                    request.endpoint,
                    interaction_id,
                    started,
                    input_ids,
                    decoding,
                    request.messages,
                    tools,
                    sample_index=index,
                )
            )
            plans.append(generation)
        samples = await self._start_samples(call, plans)
        if request.stream:
            return self._stream_chat(request, call, records, samples)
        choices, completion_tokens = [], 0
        for record, (collected, chunks) in zip(records, samples, strict=True):
            async for _ in chunks:
                pass
            finish = collected.finished.finish_reason
            reply = responses.parse_reply(collected.text, finish, tools is not None)
            await self._finish(call, record, collected, reply)
            self.metrics.completions.labels(request.endpoint, reply.finish_reason).inc()
            logprobs = self._chat_logprobs(
                request, collected.ids, collected.logprobs, collected.top
            )
            choices.append((reply, logprobs, record.interaction_id))
            completion_tokens += len(collected.ids)
        return responses.chat_completion(
            **self._common(records[0].interaction_id),
            choices=choices,
            usage_counts=responses.usage(len(input_ids), completion_tokens),
            policy_version=samples[0][0].policy_version,
        )

    async def _stream_chat(
        self,
        request: ChatRequest,
        call: CallContext,
        records: list[CallRecord],
        samples: list[tuple[Collected, AsyncIterator[TokenChunk]]],
    ) -> AsyncIterator[bytes]:
        """The choices one after the other (each chunk carries its choice's index; clients
        assemble by index); each choice's finish chunk follows its durable record."""
        common = self._common(records[0].interaction_id)
        completion_tokens = 0
        try:
            for index, (record, (collected, chunks)) in enumerate(
                zip(records, samples, strict=True)
            ):
                async for data in self._stream_choice(
                    request, call, record, collected, chunks, common, index
                ):
                    yield data
                completion_tokens += len(collected.ids)
            if request.include_usage:
                counts = responses.usage(len(records[0].input_ids), completion_tokens)
                yield _sse(responses.chat_chunk(**common, delta=None, usage_counts=counts))
            yield _sse("[DONE]")
        except ApiError as error:
            yield _sse(error.to_json())
        finally:
            for _, chunks in samples:  # a client gone mid-stream cancels every sample
                await chunks.aclose()

    async def _stream_choice(
        self,
        request: ChatRequest,
        call: CallContext,
        record: CallRecord,
        collected: Collected,
        chunks: AsyncIterator[TokenChunk],
        common: dict[str, Any],
        index: int,
    ) -> AsyncIterator[bytes]:
        tools_enabled = record.tools is not None
        stream_filter = responses.ToolCallStreamFilter(tools_enabled)

        def chunk(delta, **fields) -> bytes:
            return _sse(responses.chat_chunk(**common, delta=delta, index=index, **fields))

        yield chunk({"role": "assistant", "content": ""})
        async for generated in chunks:
            text = stream_filter.feed(generated.text)
            logprobs = self._chat_logprobs(
                request, generated.token_ids, generated.logprobs, generated.top_logprobs
            )
            if text or logprobs:
                yield chunk({"content": text}, logprobs=logprobs)
        finish = collected.finished.finish_reason
        # The text held back since a <tool_call> tag started: its calls, or plain content.
        tail = responses.parse_reply(stream_filter.held, finish, tools_enabled)
        if tail.content:
            yield chunk({"content": tail.content})
        content = stream_filter.streamed + (tail.content or "")
        reply = responses.Reply(
            content or None, tail.tool_calls, tail.finish_reason, tail.tool_call_errors
        )
        await self._finish(call, record, collected, reply)
        self.metrics.completions.labels(request.endpoint, reply.finish_reason).inc()
        if reply.tool_calls:
            yield chunk({"tool_calls": responses.tool_call_deltas(reply.tool_calls)})
        yield chunk(
            {},
            finish_reason=reply.finish_reason,
            policy_version=collected.policy_version,
            interaction_id=record.interaction_id,
        )

    # ------------------------------------------------------------------ completions

    def _prompt_ids(self, request: CompletionRequest) -> list[int]:
        if not isinstance(request.prompt, str):
            return list(request.prompt)
        ids = self.tokenizer.encode(request.prompt)
        return ids if self.tokenizer.bos_id is None else [self.tokenizer.bos_id, *ids]

    def _completion_logprobs(self, request: CompletionRequest, ids, logprobs, top, offset: int):
        if not request.decoding.logprobs:
            return None
        top = top if request.decoding.top_logprobs else None
        return responses.completion_logprobs(self.tokenizer, ids, logprobs, top, offset)

    async def completion(
        self, request: CompletionRequest, call: CallContext
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """A (legacy) text completion: the response body, or SSE bytes when streaming; `n`
        samples as in `chat`."""
        started = time.monotonic()
        input_ids = self._prompt_ids(request)
        records, plans = [], []
        for index in range(request.n):
            generation, decoding = self._plan(input_ids, request, {}, index)
            interaction_id = ids.interaction_id("cmpl", call.session_id)
            records.append(
                CallRecord(
                    "completions",
                    interaction_id,
                    started,
                    input_ids,
                    decoding,
                    sample_index=index,
                )
            )
            plans.append(generation)
        samples = await self._start_samples(call, plans)
        if request.stream:
            return self._stream_completion(request, call, records, samples)
        choices, completion_tokens = [], 0
        for index, (record, (collected, chunks)) in enumerate(zip(records, samples, strict=True)):
            async for _ in chunks:
                pass
            await self._finish(call, record, collected, None)
            finish = collected.finished.finish_reason
            self.metrics.completions.labels("completions", finish).inc()
            logprobs = self._completion_logprobs(
                request, collected.ids, collected.logprobs, collected.top, 0
            )
            choices.append(
                responses.text_choice(
                    index, collected.text, finish, logprobs, record.interaction_id
                )
            )
            completion_tokens += len(collected.ids)
        return responses.text_completion(
            **self._common(records[0].interaction_id),
            choices=choices,
            usage_counts=responses.usage(len(input_ids), completion_tokens),
            policy_version=samples[0][0].policy_version,
        )

    async def _stream_completion(
        self,
        request: CompletionRequest,
        call: CallContext,
        records: list[CallRecord],
        samples: list[tuple[Collected, AsyncIterator[TokenChunk]]],
    ) -> AsyncIterator[bytes]:
        common = self._common(records[0].interaction_id)
        completion_tokens = 0
        try:
            for index, (record, (collected, chunks)) in enumerate(
                zip(records, samples, strict=True)
            ):
                offset = 0
                async for chunk in chunks:
                    logprobs = self._completion_logprobs(
                        request, chunk.token_ids, chunk.logprobs, chunk.top_logprobs, offset
                    )
                    offset += len(chunk.text)
                    choice = responses.text_choice(index, chunk.text, None, logprobs)
                    yield _sse(responses.text_completion(**common, choices=[choice]))
                await self._finish(call, record, collected, None)
                finish = collected.finished.finish_reason
                self.metrics.completions.labels("completions", finish).inc()
                choice = responses.text_choice(index, "", finish, None, record.interaction_id)
                yield _sse(
                    responses.text_completion(
                        **common, choices=[choice], policy_version=collected.policy_version
                    )
                )
                completion_tokens += len(collected.ids)
            if request.include_usage:
                counts = responses.usage(len(records[0].input_ids), completion_tokens)
                yield _sse(responses.text_completion(**common, choices=[], usage_counts=counts))
            yield _sse("[DONE]")
        except ApiError as error:
            yield _sse(error.to_json())
        finally:
            for _, chunks in samples:
                await chunks.aclose()
