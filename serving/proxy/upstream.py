"""The data proxy in front of another OpenAI-compatible server (`python -m serving --upstream`).

A deployment that already serves its model with vLLM, SGLang or any OpenAI-compatible server
keeps it: gateway, router and this proxy sit in front, add sessions, keys, rewards and
governance, and record every chat completion in ATDP. What is recorded depends on what the
upstream returns (the proxy always asks it for log-probs):

- token ids (vLLM's `return_token_ids`: `prompt_token_ids` and the choice's `token_ids`, asked
  for with `--upstream-token-ids`) and a log-prob per output token: an `llm_call` event, like
  the JAX worker's but approximate replay (the upstream's sampler is not ours) and tagged
  `metadata.extra.upstream`; trainable.
- otherwise: the reply as an assistant `message` event (text, tool calls, reasoning, the
  returned log-probs and token strings in `metadata.extra.logprobs`), tagged
  `metadata.extra.exact_tokens = false`. It has no token ids, so the loader never trains on it
  (a trajectory without `llm_call` events is dropped as `dropped_no_llm_calls`).

Messages, tool results, sessions, implicit sessions (tenant keys), rewards, deletion and
export work as in front of the JAX worker (`proxy.py`). `/v1/completions` is refused (400).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from atdp_io import (
    DecodingParams,
    Event,
    EventKind,
    EventMetadata,
    Outcome,
    ReplayClass,
)
from serving.common import ids
from serving.common.client import ServiceClient
from serving.common.errors import ApiError, bad_request
from serving.common.openai_requests import ChatRequest, CompletionRequest
from serving.proxy.attribution import composite_fields, harness_fingerprint
from serving.proxy.conversation import canonical, new_messages
from serving.proxy.prefix import conversation_keys, echoed_reply
from serving.proxy.proxy import DataProxy, _sse
from serving.proxy.recording import (
    Generated,
    llm_event,
    message_events,
    reply_action,
    system_prompt_version,
)
from serving.proxy.runner import CallContext
from serving.worker.client import WorkerUnavailable


class UpstreamClient(ServiceClient):
    """The upstream server's `/v1` API (`url` is its base, e.g. http://host:8000/v1); a
    completion, streamed or not, may take `timeout_s`."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        super().__init__(
            url,
            api_key=api_key,
            timeout_s=timeout_s,
            connect_timeout_s=10.0,
            stream_timeout_s=timeout_s,
        )

    def unavailable(self, error: BaseException) -> Exception:
        return ApiError(
            502,
            f"the upstream {self.url} failed: {type(error).__name__}: {error}",
            code="upstream_unavailable",
        )

    async def models(self) -> list[dict[str, Any]]:
        """The upstream's models; one it cannot list is an unavailable worker to the router."""
        try:
            return (await self.call("GET", "/models"))["data"]
        except (ApiError, KeyError, TypeError) as error:
            raise WorkerUnavailable(f"upstream {self.url}: {error}") from None

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", "/chat/completions", body)

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The `data:` objects of a streamed chat completion, until `[DONE]`."""
        async for chunk in self.stream_sse("/chat/completions", body):
            if "error" in chunk:
                raise ApiError.from_json(502, chunk)
            yield chunk


class UpstreamWorker:
    """What the router polls for its one "worker": the upstream's liveness and model."""

    def __init__(self, client: UpstreamClient, model: str | None = None):
        self.client = client
        self.name = client.name
        self.model = model

    async def status(self) -> dict[str, Any]:
        await self.client.models()
        return {"running": 0, "queued": 0, "policy_version": 0, "upstream": self.name}

    async def info(self) -> dict[str, Any]:
        models = await self.client.models()
        chosen = next((m for m in models if m.get("id") == self.model), None)
        if chosen is None:
            if self.model is not None or not models:
                raise WorkerUnavailable(f"upstream {self.name} does not serve {self.model!r}")
            chosen = models[0]
        context = chosen.get("context_length") or chosen.get("max_model_len") or 0
        return {
            "model_id": chosen["id"],
            "context_length": int(context),
            "policy_version": 0,
            "checkpoint": f"upstream:{self.name}",
            "template_fingerprint": f"upstream:{chosen['id']}",
            "upstream": self.name,
        }

    def generate(self, request):  # the proxy calls the upstream itself
        raise ApiError(400, "an upstream deployment has no JAX worker to generate with")

    async def pause(self) -> dict[str, Any]:
        raise ApiError(400, "pause is not available in front of an upstream server")

    resume = pause

    async def update_weights(self, version, *, path=None, params=None) -> int:
        raise ApiError(400, "the upstream server's weights are not ours to update")

    async def close(self) -> None:
        await self.client.close()


def upstream_body(request: ChatRequest, model: str, token_ids: bool) -> dict[str, Any]:
    """The OpenAI body sent upstream: the validated request, always with log-probs."""
    decoding = request.decoding
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "temperature": decoding.temperature,
        "top_p": decoding.top_p,
        "logprobs": True,
        "stream": request.stream,
    }
    if decoding.top_logprobs:
        body["top_logprobs"] = decoding.top_logprobs
    if decoding.top_k:
        body["top_k"] = decoding.top_k
    if decoding.max_tokens is not None:
        body["max_tokens"] = decoding.max_tokens
    if decoding.stop:
        body["stop"] = list(decoding.stop)
    if decoding.seed is not None:
        body["seed"] = decoding.seed
    if request.tools:
        body["tools"] = request.tools
        body["tool_choice"] = _wire_tool_choice(request.tool_choice)
    if request.response_format is not None:
        body["response_format"] = _wire_response_format(request.response_format)
    if request.choice is not None:  # vLLM's spelling; an upstream without it refuses or ignores
        body["structured_outputs"] = {"choice": list(request.choice)}
    if request.reasoning_effort is not None:
        body["reasoning_effort"] = request.reasoning_effort
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if token_ids:
        body["return_token_ids"] = True
    return body


def _wire_tool_choice(choice: str | Mapping[str, str]) -> str | dict[str, Any]:
    """The validated tool_choice ("auto" | "none" | "required" | {"name"}) as OpenAI sends it."""
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice["name"]}}


def _wire_response_format(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """The validated response_format (`tool_specs.parse_response_format`) as Chat sends it."""
    if response_format["type"] != "json_schema":
        return dict(response_format)
    spec = {k: response_format[k] for k in ("name", "schema", "strict")}
    return {"type": "json_schema", "json_schema": spec}


@dataclasses.dataclass
class UpstreamReply:
    """What the upstream answered for one chat completion (assembled from chunks if
    streamed)."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finish_reason: str = "cancelled"
    tokens: list[str] = dataclasses.field(default_factory=list)  # token strings (logprobs)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None
    usage: dict[str, Any] | None = None

    def add_logprobs(self, logprobs: Mapping[str, Any] | None) -> None:
        for entry in (logprobs or {}).get("content") or ():
            self.tokens.append(entry.get("token", ""))
            self.logprobs.append(float(entry.get("logprob", 0.0)))

    @classmethod
    def from_answer(cls, answer: Mapping[str, Any]) -> UpstreamReply:
        choice = answer["choices"][0]
        message = choice.get("message") or {}
        reply = cls(
            content=message.get("content"),
            reasoning=message.get("reasoning_content") or message.get("reasoning"),
            tool_calls=list(message.get("tool_calls") or []),
            finish_reason=choice.get("finish_reason") or "stop",
            prompt_ids=answer.get("prompt_token_ids"),
            output_ids=choice.get("token_ids"),
            usage=answer.get("usage"),
        )
        reply.add_logprobs(choice.get("logprobs"))
        return reply

    def add_chunk(self, chunk: Mapping[str, Any]) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = list(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content = (self.content or "") + delta["content"]
            thinking = delta.get("reasoning_content") or delta.get("reasoning")
            if thinking:
                self.reasoning = (self.reasoning or "") + thinking
            for call in delta.get("tool_calls") or ():
                index = call.get("index", len(self.tool_calls))
                while len(self.tool_calls) <= index:
                    self.tool_calls.append(
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                into = self.tool_calls[index]
                into["id"] = call.get("id") or into["id"]
                function = call.get("function") or {}
                into["function"]["name"] += function.get("name") or ""
                into["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("token_ids"):
                self.output_ids = (self.output_ids or []) + list(choice["token_ids"])
            self.add_logprobs(choice.get("logprobs"))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    @property
    def exact(self) -> bool:
        """Token ids and a log-prob for every output token came back."""
        return (
            bool(self.prompt_ids)
            and self.output_ids is not None
            and len(self.logprobs) == len(self.output_ids)
        )


class UpstreamProxy(DataProxy):
    """A data proxy whose completions come from an upstream OpenAI-compatible server."""

    def __init__(
        self,
        config,
        *,
        upstream: UpstreamClient,
        model_info,
        store,
        registry=None,
        token_ids: bool = False,
    ):
        super().__init__(
            config,
            tokenizer=None,
            model_info=model_info,
            store=store,
            router=None,
            worker_client=None,
            registry=registry,
        )
        self.upstream = upstream
        self.token_ids = token_ids

    async def completion(self, request: CompletionRequest, call: CallContext):
        raise bad_request(
            "/v1/completions is not recorded in front of an upstream server; use "
            "/v1/chat/completions",
            code="unsupported_with_upstream",
        )

    async def _chat(self, request, call, tools, keys, started, *, opening: bool):
        """`DataProxy.chat` (sessions, implicit sessions) with the upstream generating."""
        if request.n > 1:
            raise bad_request(
                "n > 1 is not recorded in front of an upstream server; send n separate calls",
                param="n",
                code="unsupported_with_upstream",
            )
        interaction_id = ids.interaction_id("chatcmpl", call.session_id)
        body = upstream_body(request, self.model_id, self.token_ids)
        if request.stream:
            stream = self.upstream.chat_stream(body)
            first = await anext(stream, None)  # an upstream error is raised before any byte
            if opening:
                await self._open_implicit(call)
            return self._relay(request, call, tools, interaction_id, started, first, stream)
        answer = await self.upstream.chat(body)
        if opening:
            await self._open_implicit(call)
        reply = UpstreamReply.from_answer(answer)
        await self._record(request, call, tools, interaction_id, started, reply)
        self.metrics.completions.labels(request.endpoint, reply.finish_reason).inc()
        return self._client_view(request, {**answer, "id": interaction_id})

    def _client_view(self, request: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
        """The upstream's answer without what the proxy asked for itself."""
        body.pop("prompt_token_ids", None)
        for choice in body.get("choices") or ():
            choice.pop("token_ids", None)
            if not request.decoding.logprobs:
                choice["logprobs"] = None
        return body

    async def _relay(self, request, call, tools, interaction_id, started, first, stream):
        reply, held, recorded = UpstreamReply(), [], False
        try:
            chunk = first
            while chunk is not None:
                reply.add_chunk(chunk)
                chunk = self._client_view(request, {**chunk, "id": interaction_id})
                choices = chunk.get("choices") or []
                if not choices or choices[0].get("finish_reason"):
                    held.append(chunk)  # sent once the call is durable
                else:
                    yield _sse(chunk)
                chunk = await anext(stream, None)
            recorded = True
            await self._record(request, call, tools, interaction_id, started, reply)
            self.metrics.completions.labels(request.endpoint, reply.finish_reason).inc()
            for chunk in held:
                if chunk.get("choices") or request.include_usage:
                    yield _sse(chunk)
            yield _sse("[DONE]")
        except ApiError as error:
            recorded = True
            yield _sse(error.to_json())
        finally:
            if not recorded:  # the client left: record what came back so far
                await stream.aclose()
                reply.finish_reason = "cancelled"
                self._abandoned_upstream(request, call, tools, interaction_id, started, reply)

    def _abandoned_upstream(self, *args) -> None:
        task = asyncio.get_running_loop().create_task(self._record(*args))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _record(self, request, call, tools, interaction_id, started, reply: UpstreamReply):
        """The call's events, durably, in the session's trajectory (module docstring)."""
        if call.ephemeral:  # implicit sessions off: a one-call trajectory
            state = await self.sessions.open(
                call.session_id, call.tenant, call.governance or {}, {}
            )
        else:
            state = await self.sessions.get(call.session_id, call.tenant)
        async with state.lock:
            start, rewritten = new_messages(state.known, request.messages)
            now = time.time()
            extra: dict[str, Any] = {
                "endpoint": request.endpoint,
                "upstream": self.upstream.name,
                "exact_tokens": reply.exact,
                "finish_reason": reply.finish_reason,
            }
            if rewritten:
                extra["context_rewritten"] = True
            if reply.usage:
                extra["usage"] = reply.usage
            attributed = composite_fields(call.composite)
            plain = EventMetadata(
                timestamp=now, session_id=call.session_id, model_id=self.model_id, **attributed
            )
            events = message_events(request.messages, start, tools, plain)
            metadata = EventMetadata(
                timestamp=now,
                latency_s=time.monotonic() - started,
                session_id=call.session_id,
                interaction_id=interaction_id,
                model_id=self.model_id,
                harness_fingerprint=harness_fingerprint(self.template_fingerprint, call.composite),
                extra=extra,
                **attributed,
            )
            events.append(self._reply_event(request, tools, reply, metadata))
            indices = await self.sessions.append(state, events)
            state.composite = call.composite
            if reply.finish_reason != "cancelled":
                state.interactions[interaction_id] = indices[-1]
                state.last_llm = indices[-1]
                echo = echoed_reply(reply.content, reply.tool_calls)
                state.known = [canonical(m) for m in request.messages] + [canonical(echo)]
                if self.implicit is not None:
                    key = conversation_keys([*request.messages, echo], tools)[-1]
                    self.implicit.note_turn(call.tenant, key, state.session_id)
            if call.ephemeral:
                await self.sessions.close(state, Outcome())

    def _reply_event(self, request, tools, reply: UpstreamReply, metadata) -> Event:
        action, error_class = reply_action(reply.content or "", reply.tool_calls, tools)
        if reply.finish_reason == "cancelled":
            error_class = "generation_cancelled"
        if reply.exact:
            n = len(reply.output_ids)
            generated = Generated(
                list(reply.output_ids),
                reply.logprobs,
                [0] * n,
                reply.content or "",
                reply.finish_reason,
            )
            event = llm_event(
                model_id=self.model_id,
                input_ids=reply.prompt_ids,
                generated=generated,
                decoding=self._plan_record(request),
                template_fingerprint=self.template_fingerprint,
                system_version=system_prompt_version(request.messages),
                tools=tools,
                action=action,
                metadata=metadata,
                current_version=0,
                moved=True,  # not our sampler: approximate replay
                error_class=error_class,
                reasoning=reply.reasoning,
            )
            return event
        observation: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            observation["tool_calls"] = reply.tool_calls
        if reply.reasoning is not None:
            observation["reasoning_content"] = reply.reasoning
        if reply.logprobs:
            metadata = dataclasses.replace(
                metadata,
                extra={
                    **metadata.extra,
                    "logprobs": {"tokens": reply.tokens, "logprobs": reply.logprobs},
                },
            )
        return Event(
            EventKind.MESSAGE,
            ReplayClass.NON_REPLAYABLE,
            observation=observation,
            action=action,
            metadata=metadata,
            error_class=error_class,
        )

    def _plan_record(self, request: ChatRequest) -> DecodingParams:
        d = request.decoding
        return DecodingParams(
            temperature=d.temperature,
            top_p=d.top_p,
            top_k=d.top_k,
            max_tokens=d.max_tokens,
            stop=d.stop,
            seed=d.seed,
            extra={
                "seed_given": d.seed is not None,
                "upstream": self.upstream.name,
                "tool_choice": request.tool_choice,
                "response_format": request.response_format,
                "choice": None if request.choice is None else list(request.choice),
                "reasoning_effort": request.reasoning_effort,
                "ignored_fields": list(request.ignored),
            },
        )
