"""OpenAI response bodies and stream chunks, built from generated tokens and text.

Tool calls: when the request exposes tools, the reply text is parsed with
`sao_jax.tokenizers.parse_tool_calls` (Qwen's `<tool_call>{json}</tool_call>` blocks). Blocks
that parse become `tool_calls` (finish_reason "tool_calls"); if none parses, the raw text is
returned as content, so a malformed call is visible to the agent rather than dropped. While
streaming, text is forwarded until a `<tool_call>` tag starts; the rest is parsed at the end.

Reasoning: a reply that starts with `<think>` has its thinking returned in `reasoning_content`
(the text up to `</think>`) and the rest in `content`; a reply that never closes `</think>` is
all reasoning (`content` None). So the client can always rebuild the exact reply text:
`"<think>" + reasoning_content + ("</think>" + content if content is not None else "")`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sao_jax.tokenizers import Tokenizer, parse_tool_calls
from sao_jax.tokenizers.tool_calls import TOOL_CALL_OPEN
from serving.common.ids import opaque_id

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclasses.dataclass(frozen=True)
class Reply:
    """The assistant reply: content (None when only tool calls, or when reasoning never
    closed), OpenAI tool_calls entries, the reasoning text (None without a `<think>` block)."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    tool_call_errors: list[str]
    reasoning: str | None = None


def split_reasoning(text: str) -> tuple[str | None, str | None]:
    """(reasoning, content) of a reply text (see the module docstring)."""
    if not text.startswith(THINK_OPEN):
        return None, text
    end = text.find(THINK_CLOSE, len(THINK_OPEN))
    if end < 0:
        return text[len(THINK_OPEN) :], None
    return text[len(THINK_OPEN) : end], text[end + len(THINK_CLOSE) :]


def parse_reply(text: str, finish_reason: str, tools_enabled: bool) -> Reply:
    """Split the generated text into reasoning, content and tool calls (module docstring)."""
    reasoning, content = split_reasoning(text)
    return parse_content(content, finish_reason, tools_enabled, reasoning)


def parse_content(
    content: str | None, finish_reason: str, tools_enabled: bool, reasoning: str | None = None
) -> Reply:
    """The reply from its content part (after any reasoning): content and tool calls."""
    if content is None or not tools_enabled or TOOL_CALL_OPEN not in content:
        return Reply(content, [], finish_reason, [], reasoning)
    parsed = parse_tool_calls(content)
    if not parsed.tool_calls:
        return Reply(content, [], finish_reason, parsed.errors, reasoning)
    calls = [c.to_openai(opaque_id("call_", 24)) for c in parsed.tool_calls]
    reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return Reply(parsed.content or None, calls, reason, parsed.errors, reasoning)


def _tag_prefix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningStreamFilter:
    """Splits streamed reply text into reasoning and content deltas, as `split_reasoning`
    splits the whole text: undecided while the text could still become `<think>`, then
    reasoning (holding back a tail that could start `</think>`), then content."""

    def __init__(self):
        self.state = "start"  # start | reasoning | content
        self.held = ""
        self.reasoning: str | None = None

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning, content) that may be sent now."""
        text = self.held + delta
        self.held = ""
        if self.state == "start":
            if text.startswith(THINK_OPEN):
                self.state, self.reasoning, text = "reasoning", "", text[len(THINK_OPEN) :]
            elif THINK_OPEN.startswith(text):
                self.held = text
                return "", ""
            else:
                self.state = "content"
        if self.state == "content":
            return "", text
        end = text.find(THINK_CLOSE)
        if end >= 0:
            self.state = "content"
            self.reasoning += text[:end]
            return text[:end], text[end + len(THINK_CLOSE) :]
        keep = _tag_prefix(text, THINK_CLOSE)
        out, self.held = text[: len(text) - keep], text[len(text) - keep :]
        self.reasoning += out
        return out, ""

    def flush(self) -> tuple[str, str]:
        """The held tail at the end of the reply: (reasoning, content)."""
        text, self.held = self.held, ""
        if self.state == "reasoning":
            self.reasoning += text
            return text, ""
        self.state = "content"
        return "", text

    @property
    def closed(self) -> bool:
        """Whether the reply has content (no reasoning, or reasoning that ended)."""
        return self.state != "reasoning"


class ToolCallStreamFilter:
    """Passes streamed text through until a tool-call block may start, then holds the rest."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.held = ""
        self.in_tool_call = False
        self.streamed = ""

    def feed(self, delta: str) -> str:
        """Text that may be sent now."""
        if not self.enabled:
            self.streamed += delta
            return delta
        if self.in_tool_call:
            self.held += delta
            return ""
        text = self.held + delta
        cut = text.find(TOOL_CALL_OPEN)
        if cut >= 0:
            self.in_tool_call, self.held = True, text[cut:]
            out = text[:cut]
        else:
            keep = _tag_prefix(text, TOOL_CALL_OPEN)  # could still become "<tool_call>"
            out, self.held = text[: len(text) - keep], text[len(text) - keep :]
        self.streamed += out
        return out


def token_strings(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def chat_logprobs(
    tokenizer: Tokenizer,
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]] | None,
) -> dict[str, Any]:
    """OpenAI chat `logprobs` object: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for position, (token_id, logprob) in enumerate(zip(ids, logprobs, strict=True)):
        token = tokenizer.decode([token_id])
        alternatives = []
        for alt_id, alt_logprob in top[position] if top else ():
            alt = tokenizer.decode([alt_id])
            alternatives.append({"token": alt, "logprob": alt_logprob, "bytes": list(alt.encode())})
        content.append(
            {
                "token": token,
                "logprob": min(logprob, 0.0),
                "bytes": list(token.encode()),
                "top_logprobs": alternatives,
            }
        )
    return {"content": content}


def completion_logprobs(
    tokenizer: Tokenizer,
    ids: Sequence[int],
    logprobs: Sequence[float],
    top: Sequence[Sequence[tuple[int, float]]] | None,
    text_offset: int = 0,
) -> dict[str, Any]:
    """Legacy completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = token_strings(tokenizer, ids)
    offsets, position = [], text_offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [min(lp, 0.0) for lp in logprobs],
        "top_logprobs": [{tokenizer.decode([i]): lp for i, lp in row} for row in top]
        if top
        else None,
        "text_offset": offsets,
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    *,
    completion_id: str,
    created: int,
    model: str,
    choices: Sequence[tuple[Reply, dict[str, Any] | None, str]],
    usage_counts: dict[str, int],
    policy_version: int,
    system_fingerprint: str,
) -> dict[str, Any]:
    """choices: (reply, logprobs, interaction id) per sample; each choice carries its own
    `interaction_id` (a reward can name one choice of several)."""
    body_choices = []
    for index, (reply, logprobs, interaction) in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        body_choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": reply.finish_reason,
                "interaction_id": interaction,
            }
        )
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": system_fingerprint,
        "policy_version": policy_version,
        "choices": body_choices,
        "usage": usage_counts,
    }


def chat_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    system_fingerprint: str,
    delta: dict[str, Any] | None,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
    usage_counts: dict[str, int] | None = None,
    policy_version: int | None = None,
    index: int = 0,
    interaction_id: str | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    if interaction_id is not None:
        choice["interaction_id"] = interaction_id
    chunk: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": system_fingerprint,
        "choices": [] if delta is None else [choice],
    }
    if usage_counts is not None:
        chunk["usage"] = usage_counts
    if policy_version is not None:
        chunk["policy_version"] = policy_version
    return chunk


def tool_call_deltas(tool_calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each complete tool call as one streamed delta entry (with its index)."""
    return [{"index": i, **call} for i, call in enumerate(tool_calls)]


def text_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
    interaction_id: str | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if interaction_id is not None:
        choice["interaction_id"] = interaction_id
    return choice


def text_completion(
    *,
    completion_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    system_fingerprint: str,
    usage_counts: dict[str, int] | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": system_fingerprint,
        "choices": choices,
    }
    if usage_counts is not None:
        body["usage"] = usage_counts
    if policy_version is not None:
        body["policy_version"] = policy_version
    return body
