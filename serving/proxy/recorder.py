"""Writing one answered call into its session's trajectory, durably, before it is answered.

Under the session's lock: the messages new since the session's last call become message /
tool_call events, the completion becomes the llm_call event, and all of them go to disk in one
commit. Then the session's state moves on (the conversation as the agent will echo it, the
interaction id -> event index, the sampled turn later calls extend token-exactly, see
`prefix.py`). A tenant-key call without a session opens and closes its one-call trajectory
around the commit. A stream the client abandoned is recorded with what was generated, finish
reason `cancelled` (`record_abandoned`); it never becomes part of the conversation.

Each llm_call's `metadata.cost_usd` comes from the price table; once the call is durable its
cost is added to the session's total and to the per-tenant cost counter.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
from prometheus_client import Counter, Histogram

from atdp_io import DecodingParams, EventKind, EventMetadata, Outcome
from serving.proxy.attribution import composite_fields, harness_fingerprint
from serving.proxy.conversation import canonical, new_messages
from serving.proxy.implicit import ImplicitSessions
from serving.proxy.prefix import SampledTurn, conversation_keys, echoed_reply
from serving.proxy.pricing import PriceTable
from serving.proxy.recording import llm_event, message_events, reply_action, system_prompt_version
from serving.proxy.responses import Reply
from serving.proxy.runner import CallContext, Collected
from serving.proxy.sessions import SessionBook, SessionState


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """What the proxy knows about one call besides its output.

    messages / tools: the chat conversation and exposed tools (None for /v1/completions).
    sample_index: which of a request's `n` samples this is; the messages are recorded, and the
    conversation and the session's last completion move on, with sample 0 only.
    prompt: how the prompt ids were built ({"extends": interaction id, "reused_tokens": n}
    when an earlier sampled turn was reused, else {"rendered": True}); None for completions.
    """

    endpoint: str
    interaction_id: str
    started: float
    input_ids: list[int]
    decoding: DecodingParams
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    sample_index: int = 0
    prompt: dict[str, Any] | None = None


def _top_logprobs(collected: Collected) -> dict[str, list] | None:
    """Top log-probs as recorded: ids [N][k], log-probs [N][k] (None when not asked for)."""
    if not collected.top:
        return None
    return {
        "ids": [[int(i) for i, _ in row] for row in collected.top],
        "logprobs": [[min(float(v), 0.0) for _, v in row] for row in collected.top],
    }


def _already_reported(event, reported: set[str]) -> bool:
    """A tool result the agent reported on /rl/event before sending it back as a message."""
    if event.kind != EventKind.TOOL_CALL or not reported:
        return False
    return event.action.tool_calls[0].call_id in reported


class CallRecorder:
    def __init__(
        self,
        sessions: SessionBook,
        *,
        model_id: str,
        template_fingerprint: str,
        events_counter: Counter,
        append_seconds: Histogram,
        prices: PriceTable | None = None,
        cost_counter: Counter | None = None,
        implicit: ImplicitSessions | None = None,
    ):
        self.sessions = sessions
        self.model_id = model_id
        self.template_fingerprint = template_fingerprint
        self.events_counter = events_counter
        self.append_seconds = append_seconds
        self.prices = prices or PriceTable()
        self.cost_counter = cost_counter
        self.implicit = implicit

    async def _state_for(self, call: CallContext) -> SessionState:
        if call.ephemeral:
            return await self.sessions.open(call.session_id, call.tenant, call.governance or {}, {})
        return await self.sessions.get(call.session_id, call.tenant)

    def _metadata(self, call: CallContext, record: CallRecord, collected: Collected, extra: dict):
        prompt_tokens, completion_tokens = len(record.input_ids), len(collected.ids)
        return EventMetadata(
            timestamp=time.time(),
            latency_s=time.monotonic() - record.started,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self.prices.cost(self.model_id, prompt_tokens, completion_tokens),
            session_id=call.session_id,
            interaction_id=record.interaction_id,
            harness_fingerprint=harness_fingerprint(self.template_fingerprint, call.composite),
            model_id=self.model_id,
            extra=extra,
            **composite_fields(call.composite),
        )

    async def record(
        self,
        call: CallContext,
        record: CallRecord,
        collected: Collected,
        reply: Reply | None,
        *,
        abandoned: bool = False,
    ) -> int:
        """Append the call's events durably; returns the llm_call event's index. `abandoned`:
        the client left before the end (recorded as finish reason `cancelled`)."""
        generated = collected.generated(cancelled=abandoned)
        route = collected.route or call.route
        state = await self._state_for(call)
        async with state.lock:
            extra: dict[str, Any] = {
                "endpoint": record.endpoint,
                "worker": route.worker,
                "queue_s": generated.queue_s,
                "stop_reason": generated.stop_reason,
            }
            if route.moves:
                extra.update(moves=route.moves, repinned_from=route.previous_worker)
            if abandoned and collected.finished is not None:
                extra["worker_finish_reason"] = collected.finished.finish_reason
            if record.prompt is not None:
                extra["prompt"] = record.prompt
            if call.composite and call.composite.get("memory_notes"):
                extra["memory_notes"] = list(call.composite["memory_notes"])
            top = _top_logprobs(collected)
            if top is not None:
                extra["top_logprobs"] = top
            complete = generated.finish_reason in ("stop", "length")
            key = None
            if complete and record.messages is not None and reply is not None:
                echo = echoed_reply(reply.content, reply.tool_calls)
                key = conversation_keys([*record.messages, echo], record.tools)[-1]
                extra["conversation_key"] = key
            events, start = [], 0
            first_sample = record.sample_index == 0
            if record.messages is not None and first_sample:
                start, rewritten = new_messages(state.known, record.messages)
                if rewritten:
                    extra["context_rewritten"] = True
            metadata = self._metadata(call, record, collected, extra)
            if record.messages is not None and first_sample:
                plain = EventMetadata(
                    timestamp=metadata.timestamp,
                    session_id=call.session_id,
                    harness_fingerprint=metadata.harness_fingerprint,
                    model_id=self.model_id,
                    **composite_fields(call.composite),
                )
                events += [
                    e
                    for e in message_events(record.messages, start, record.tools, plain)
                    if not _already_reported(e, state.reported)
                ]
            content = generated.text if reply is None else (reply.content or "")
            reasoning = reply.reasoning if reply is not None else None
            calls = reply.tool_calls if reply is not None else []
            action, error_class = reply_action(content, calls, record.tools)
            if reply is not None and reply.tool_call_errors:
                extra["tool_call_errors"] = reply.tool_call_errors
                error_class = error_class or "malformed_tool_call"
            if generated.error or generated.finish_reason not in ("stop", "length"):
                error_class = f"generation_{generated.finish_reason}"
            events.append(
                llm_event(
                    model_id=self.model_id,
                    input_ids=record.input_ids,
                    generated=generated,
                    decoding=record.decoding,
                    template_fingerprint=self.template_fingerprint,
                    system_version=system_prompt_version(record.messages or []),
                    tools=record.tools,
                    action=action,
                    metadata=metadata,
                    current_version=collected.policy_version,
                    moved=route.moves > 0,
                    error_class=error_class,
                    reasoning=reasoning,
                )
            )
            begin = time.monotonic()
            indices = await self.sessions.append(state, events)
            state.composite = call.composite
            self.append_seconds.observe(time.monotonic() - begin)
            for event in events:
                self.events_counter.labels(event.kind.value).inc()
            if metadata.cost_usd is not None:  # counted once the call is durable, not before
                state.cost_usd += metadata.cost_usd
                if self.cost_counter is not None:
                    self.cost_counter.labels(call.tenant, self.model_id).inc(metadata.cost_usd)
            llm_index = indices[-1]
            if complete:
                state.interactions[record.interaction_id] = llm_index
                if first_sample:
                    state.last_llm = llm_index
                if key is not None:
                    # Every sample's turn is kept: the agent may continue any choice, and
                    # its next call then reuses that sample's ids. Only sample 0 moves the
                    # conversation the session expects next.
                    if first_sample:
                        echo = echoed_reply(reply.content, reply.tool_calls)
                        state.known = [canonical(m) for m in record.messages] + [canonical(echo)]
                    context = np.concatenate(
                        [
                            np.asarray(record.input_ids, np.int32),
                            np.asarray(generated.output_ids, np.int32),
                        ]
                    )
                    state.turns.add(SampledTurn(key, context, record.interaction_id))
                    if self.implicit is not None:
                        self.implicit.note_turn(call.tenant, key, state.session_id)
            if call.ephemeral:
                await self.sessions.close(state, Outcome())
        return llm_index

    async def record_failure(
        self, call: CallContext, record: CallRecord, collected: Collected
    ) -> None:
        """A generation that ended in an error is recorded too, when it produced tokens (the
        samples are real; finish_reason and error_class say what happened)."""
        if collected.finished is None or not collected.ids or call.ephemeral:
            return
        await self.record(call, record, collected, None)

    async def record_abandoned(
        self, call: CallContext, record: CallRecord, collected: Collected, reply: Reply | None
    ) -> None:
        """A stream the client left: what was generated, finish reason `cancelled` (also when
        the worker had finished). Nothing is recorded when no token was generated."""
        if not collected.ids:
            return
        await self.record(call, record, collected, reply, abandoned=True)
