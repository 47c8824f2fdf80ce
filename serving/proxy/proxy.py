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
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
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
from serving.proxy.conversation import message_text
from serving.proxy.events import AgentEvent, event_record
from serving.proxy.grammars import output_grammar
from serving.proxy.implicit import ImplicitSessions
from serving.proxy.prefix import TurnIndex, conversation_keys, render_prompt
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

IMPLICIT_TASK = {"implicit": True}  # the task of a trajectory grouped from tenant-key calls
logger = logging.getLogger(__name__)


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


def max_token_bytes(tokenizer: Tokenizer) -> int | None:
    """The most UTF-8 bytes any vocabulary entry's string has (an upper bound on the bytes of
    text one token covers), or None when the tokenizer does not list its vocabulary."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "get_vocab"):
        return None
    return max(len(token.encode()) for token in backend.get_vocab(with_added_tokens=True))


def _text_delta(reasoning: str, content: str) -> dict[str, str]:
    """A chat delta with the reasoning and content texts that are not empty."""
    delta = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    return delta


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
        self.max_completion_tokens = model_info.get("max_completion_tokens")
        self.template_fingerprint = model_info["template_fingerprint"]
        self.metrics = ProxyMetrics(registry)
        self.max_token_bytes = max_token_bytes(tokenizer)
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
        self.implicit = None
        if config.implicit_idle_s is not None:
            self.implicit = ImplicitSessions(config.implicit_idle_s)
        self.recorder = CallRecorder(
            self.sessions,
            model_id=self.model_id,
            template_fingerprint=self.template_fingerprint,
            events_counter=self.metrics.events,
            append_seconds=self.metrics.append_seconds,
            prices=self.prices,
            cost_counter=self.metrics.cost_usd,
            implicit=self.implicit,
        )
        # CPU-bound request work (rendering, tokenizing, hashing) runs here, never on the
        # event loop, so a huge request cannot hold up /health or other calls
        self._cpu = ThreadPoolExecutor(config.cpu_threads, thread_name_prefix="proxy-cpu")
        self._background: set[asyncio.Task] = set()  # recordings of abandoned streams
        self._reaper: asyncio.Task | None = None  # closes idle implicit sessions
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

    async def record_event(self, session_id: str, tenant: str, event: AgentEvent) -> dict[str, Any]:
        """A non-LLM boundary the agent reports (`events.py`), appended durably to the
        session's open trajectory."""
        state = await self.sessions.get(session_id, tenant)
        if event.interaction_id is not None and event.interaction_id not in state.interactions:
            raise ApiError(
                404,
                f"no completion {event.interaction_id!r} in this session",
                param="interaction_id",
                code="interaction_not_found",
            )
        async with state.lock:
            (index,) = await self.sessions.append(
                state, [event_record(event, session_id, self.model_id, state.composite)]
            )
            if event.type in ("tool", "memory") and event.call_id:
                state.reported.add(event.call_id)
        if self.implicit is not None:
            self.implicit.touch(session_id)
        self.metrics.events.labels(f"reported_{event.type}").inc()
        return {"trajectory_id": session_id, "event_index": index}

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
        if self.implicit is not None:
            self.implicit.forget(session_id)
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
        """Starts the scheduled purge (its first pass runs now, on its own thread) and, on the
        running event loop, the closing of idle implicit sessions."""
        if self.purge_schedule is not None and not self._purging:
            self.purge_schedule.start()
            self._purging = True
        if self.implicit is not None and self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._close_idle())

    async def _close_idle(self) -> None:
        """Closes implicit sessions idle for `implicit_idle_s` (checked a few times per)."""
        every = min(self.implicit.idle_s / 4, 30.0)
        while True:
            await asyncio.sleep(every)
            for session_id in self.implicit.idle():
                if session_id not in self.implicit.idle():  # a call came meanwhile
                    continue
                await self._close_implicit(session_id, "idle")

    async def _close_implicit(self, session_id: str, why: str) -> None:
        self.implicit.forget(session_id)
        state = self.sessions.known(session_id)
        if state is None:
            return
        async with state.lock:
            if state.closed:
                return
            try:
                await self.sessions.close(state, Outcome(info={"implicit_closed": why}))
            except Exception:  # e.g. erased by retention meanwhile: nothing left to close
                state.writer_session = None
                logger.warning("closing implicit session %s failed", session_id, exc_info=True)

    async def cpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run CPU-bound work on the proxy's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, fn, *args)

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self._background:  # abandoned streams still being recorded
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.implicit is not None:
            for session_id in self.implicit.open_sessions():
                await self._close_implicit(session_id, "shutdown")
        self._cpu.shutdown(wait=False)
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
            max_completion_tokens=self.max_completion_tokens,
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

    def _chat_keys(self, request: ChatRequest) -> tuple[list[dict[str, Any]] | None, list[str]]:
        """(exposed tools, the conversation key of every message prefix); CPU work."""
        tools = request.tools if request.tool_choice != "none" else None
        self._check_size(request.messages)
        try:
            return tools, conversation_keys(request.messages, tools)
        except (TypeError, ValueError) as error:
            raise bad_request(f"cannot render the messages: {error}", param="messages") from None

    def _render_chat(
        self, request: ChatRequest, tools, keys: list[str], turns: TurnIndex
    ) -> tuple[list[int], dict[str, Any]]:
        """(prompt ids, how the prompt was built); CPU work, off the loop.

        A conversation that extends one of the session's sampled turns reuses its ids
        (token-exact, `prefix.py`); anything else is rendered with the chat template."""
        matched = turns.match(keys)
        try:
            input_ids = render_prompt(self.tokenizer, request.messages, tools, matched)
        except (TypeError, ValueError) as error:
            raise bad_request(f"cannot render the messages: {error}", param="messages") from None
        if matched is None:
            return input_ids, {"rendered": True}
        turn, covered = matched
        prompt = {
            "extends": turn.interaction_id,
            "reused_tokens": int(turn.context_ids.shape[0]),
            "reused_messages": covered,
        }
        return input_ids, prompt

    async def chat(
        self, request: ChatRequest, call: CallContext
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """A chat completion: the response body, or SSE bytes when `request.stream`.

        A tenant-key call (no session) joins the implicit session it extends, or starts one
        (`implicit.py`), and is then recorded like a session call; while it runs, the session
        is never closed as idle. A new implicit trajectory is opened only once the generation
        started, so a refused call leaves nothing behind."""
        started = time.monotonic()
        tools, keys = await self.cpu(self._chat_keys, request)
        if not call.ephemeral or self.implicit is None:
            return await self._chat(request, call, tools, keys, started, opening=False)
        found = self.implicit.find(call.tenant, keys)
        session_id = found or call.session_id
        call = dataclasses.replace(call, session_id=session_id, ephemeral=False)
        self.implicit.begin(call.tenant, session_id)
        try:
            result = await self._chat(request, call, tools, keys, started, opening=found is None)
        except BaseException:
            self.implicit.done(session_id)
            raise
        if isinstance(result, dict):
            self.implicit.done(session_id)
            return result
        return self._implicit_stream(result, session_id)

    async def _implicit_stream(self, stream: AsyncIterator[bytes], session_id: str):
        try:
            async with contextlib.aclosing(stream):
                async for data in stream:
                    yield data
        finally:
            self.implicit.done(session_id)

    async def _open_implicit(self, call: CallContext) -> None:
        """The trajectory of a new implicit session (its first call is under way)."""
        await self.sessions.open(call.session_id, call.tenant, call.governance or {}, IMPLICIT_TASK)

    def _check_size(self, messages: list[dict[str, Any]]) -> None:
        """400 for messages whose text cannot fit the context whatever the tokenization (each
        token covers at most `max_token_bytes` bytes), before spending seconds tokenizing it."""
        if self.max_token_bytes is None:
            return
        size = sum(len(message_text(m).encode()) for m in messages)
        if size > self.context_length * self.max_token_bytes:
            raise bad_request(
                f"this model's context is {self.context_length} tokens and the messages have "
                f"{size} bytes of text (at least {size // self.max_token_bytes} tokens); "
                "shorten the conversation",
                param="messages",
                code="context_length_exceeded",
            )

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

    async def _chat(self, request, call, tools, keys, started, *, opening: bool):
        """`chat` once the call's session is known; `opening`: a new implicit trajectory to
        open once the generation started. With `n` > 1 each choice is its own sample (one
        prompt, its own seed), recorded as its own llm_call event."""
        turns = TurnIndex()  # a first or one-call trajectory has no earlier turns
        if not call.ephemeral and not opening:
            turns = (await self.sessions.get(call.session_id, call.tenant)).turns
        input_ids, prompt = await self.cpu(self._render_chat, request, tools, keys, turns)
        extra = self._chat_extra(request)
        grammar = await self.cpu(output_grammar, request, tools, self.tokenizer)
        if grammar is not None:  # recorded: the mask is part of the sampling distribution
            extra.update(response_format=request.response_format, grammar=grammar)
            if request.choice is not None:
                extra["choice"] = list(request.choice)
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
                    prompt=prompt,
                )
            )
            plans.append(generation)
        samples = await self._start_samples(call, plans)
        if opening:
            await self._open_started(call, samples)
        if request.stream:
            return self._stream_chat(request, call, records, samples)
        choices, completion_tokens = [], 0
        try:
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
        finally:  # one sample failed (or the call was cancelled): the others stop too
            for _, chunks in samples:
                await chunks.aclose()
        return responses.chat_completion(
            **self._common(records[0].interaction_id),
            choices=choices,
            usage_counts=responses.usage(len(input_ids), completion_tokens),
            policy_version=samples[0][0].policy_version,
        )

    async def _open_started(
        self, call: CallContext, samples: list[tuple[Collected, AsyncIterator[TokenChunk]]]
    ) -> None:
        """Open a new implicit session's trajectory once its generations started; if that
        fails, every sample is cancelled."""
        try:
            await self._open_implicit(call)
        except BaseException:
            for _, chunks in samples:
                await chunks.aclose()  # cancels the generation
            raise

    def _abandoned(self, call, left: list[tuple[CallRecord, Collected, Any]]) -> None:
        """Record the samples of a stream the client left, (record, collected, reply) each,
        in order on their own task (the stream's generator is being closed and must not wait
        on disk)."""

        async def record_all() -> None:
            for record, collected, reply in left:
                await self.recorder.record_abandoned(call, record, collected, reply)

        task = asyncio.get_running_loop().create_task(record_all())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stream_chat(
        self,
        request: ChatRequest,
        call: CallContext,
        records: list[CallRecord],
        samples: list[tuple[Collected, AsyncIterator[TokenChunk]]],
    ) -> AsyncIterator[bytes]:
        """The choices one after the other (each chunk carries its choice's index; clients
        assemble by index); each choice's finish chunk follows its durable record. A client
        that leaves cancels every sample; the ones not recorded yet are recorded as
        `cancelled` with what they generated."""
        common = self._common(records[0].interaction_id)
        completion_tokens, recorded = 0, set()  # indices of the samples recorded so far
        tools = records[0].tools is not None
        try:
            for index, (record, (collected, chunks)) in enumerate(
                zip(records, samples, strict=True)
            ):
                choice = self._stream_choice(
                    request, call, record, collected, chunks, common, index, recorded
                )
                async with contextlib.aclosing(choice):
                    async for data in choice:
                        yield data
                completion_tokens += len(collected.ids)
            if request.include_usage:
                counts = responses.usage(len(records[0].input_ids), completion_tokens)
                yield _sse(responses.chat_chunk(**common, delta=None, usage_counts=counts))
            yield _sse("[DONE]")
        except ApiError as error:
            recorded.update(range(len(samples)))  # a failed generation: _finish recorded it
            yield _sse(error.to_json())
        finally:
            for _, chunks in samples:  # a client gone mid-stream cancels every sample
                await chunks.aclose()
            left = [  # the client left (the generator was closed mid-stream)
                (record, collected, responses.parse_reply(collected.text, "cancelled", tools))
                for index, (record, (collected, _)) in enumerate(zip(records, samples, strict=True))
                if index not in recorded
            ]
            if left:
                self._abandoned(call, left)

    async def _stream_choice(
        self,
        request: ChatRequest,
        call: CallContext,
        record: CallRecord,
        collected: Collected,
        chunks: AsyncIterator[TokenChunk],
        common: dict[str, Any],
        index: int,
        recorded: set[int],
    ) -> AsyncIterator[bytes]:
        """One choice's chunks: reasoning and content deltas apart, tool calls parsed at the
        end; `index` joins `recorded` once the choice's record (or failure) is durable."""
        tools_enabled = record.tools is not None
        thinking = responses.ReasoningStreamFilter()
        stream_filter = responses.ToolCallStreamFilter(tools_enabled)

        def chunk(delta, **fields) -> bytes:
            return _sse(responses.chat_chunk(**common, delta=delta, index=index, **fields))

        yield chunk({"role": "assistant", "content": ""})
        async for generated in chunks:
            reasoning, text = thinking.feed(generated.text)
            text = stream_filter.feed(text)
            logprobs = self._chat_logprobs(
                request, generated.token_ids, generated.logprobs, generated.top_logprobs
            )
            delta = _text_delta(reasoning, text)
            if delta or logprobs:
                yield chunk(delta or {}, logprobs=logprobs)
        finish = collected.finished.finish_reason
        reasoning, text = thinking.flush()
        text = stream_filter.feed(text)
        # The text held back since a <tool_call> tag started: its calls, or plain content.
        held = stream_filter.held if thinking.closed else None
        tail = responses.parse_content(held, finish, tools_enabled)
        text += tail.content or ""
        if reasoning or text:
            yield chunk(_text_delta(reasoning, text))
        content = stream_filter.streamed + (tail.content or "") if thinking.closed else None
        reply = responses.Reply(
            (content or None) if tail.tool_calls else content,
            tail.tool_calls,
            tail.finish_reason,
            tail.tool_call_errors,
            thinking.reasoning,
        )
        try:
            await self._finish(call, record, collected, reply)
        finally:
            recorded.add(index)
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
        """The prompt's ids (CPU work, off the loop)."""
        if not isinstance(request.prompt, str):
            return list(request.prompt)
        self._check_size([{"content": request.prompt}])
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
        input_ids = await self.cpu(self._prompt_ids, request)
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
        try:
            for index, (record, (collected, chunks)) in enumerate(
                zip(records, samples, strict=True)
            ):
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
        finally:  # one sample failed (or the call was cancelled): the others stop too
            for _, chunks in samples:
                await chunks.aclose()
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
        completion_tokens, recorded = 0, set()  # indices of the samples recorded so far
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
                try:
                    await self._finish(call, record, collected, None)
                finally:
                    recorded.add(index)
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
            recorded.update(range(len(samples)))
            yield _sse(error.to_json())
        finally:
            for _, chunks in samples:  # a client gone mid-stream cancels every sample
                await chunks.aclose()
            left = [  # the client left mid-stream
                (record, collected, None)
                for index, (record, (collected, _)) in enumerate(zip(records, samples, strict=True))
                if index not in recorded
            ]
            if left:
                self._abandoned(call, left)
