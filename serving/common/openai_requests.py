"""Validation of OpenAI chat / completions request bodies into typed requests.

Every problem is a 400 whose message names the field (`param`) and the real limit, as OpenAI
answers. What agents send is accepted (the compatibility table in docs/serving.md):
- the `developer` role is the system role (OpenAI's newer name for it); system messages may
  appear anywhere (rendered in place, as Qwen3's template does);
- `max_tokens` above the rest of the context is clamped to it (by the data proxy, which knows
  the prompt length); only values past MAX_TOKENS_LIMIT are refused;
- parameters this server does not apply (penalties, logit bias, `user`, `metadata`, vendor
  extensions, any unknown field) are validated when OpenAI defines them, then accepted and
  listed in `ignored`, which the data proxy records with the call, so the training data says
  which requested settings did not shape the sampled tokens.
Tools, `tool_choice`, `response_format` and tool-call ids are checked in `tool_specs.py`.

One vendor extension shapes the answer: vLLM's choice constraint, `"structured_outputs":
{"choice": [...]}` (or its older spelling `"guided_choice": [...]`): the reply is exactly one of
the listed strings (`ChatRequest.choice`; enforced by the worker's grammar mask, and recorded).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sao_jax.tokenizers.chat_template import normalize_tools, validate_messages
from serving.common.errors import ApiError, bad_request
from serving.common.tool_specs import (
    check_tool_call_ids,
    check_tools,
    parse_response_format,
    parse_tool_choice,
)

MAX_STOP_SEQUENCES = 4
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 8  # `n`: each choice is a sample holding a worker slot
MAX_TOKENS_LIMIT = 2**31 - 1  # past it a value is a mistake, not a request to clamp
MAX_REPLY_CHOICES = 4096  # `structured_outputs.choice`: options of one constrained reply
MAX_REPLY_CHOICE_CHARS = 8192
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# `reasoning_effort` as a thinking budget: tokens between <think> and </think> (None: no limit;
# 0: no thinking at all).
THINK_BUDGETS = {
    "none": 0,
    "minimal": 128,
    "low": 512,
    "medium": 2048,
    "high": 8192,
    "xhigh": 16384,
    "max": None,
}

# Fields that shape the answer; every other field is accepted and recorded as ignored.
_CHAT_FIELDS = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "n",
    "response_format",
    "reasoning_effort",
    "structured_outputs",
    "guided_choice",
}
_COMPLETION_FIELDS = {
    "model",
    "prompt",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "n",
    "best_of",
    "echo",
    "suffix",
}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclasses.dataclass(frozen=True)
class Decoding:
    """Decoding settings of one request. max_tokens None: as many as the context allows."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated `/v1/chat/completions` body.

    tool_choice: "auto" | "none" | "required" | {"name": function};
    response_format: None (text) or `tool_specs.parse_response_format`'s dict; n: choices;
    reasoning_effort: as sent (None: not given); choice: the strings the reply must be one of
    (None: unconstrained); ignored: names of fields that were accepted but do not shape the
    answer; endpoint: the API it came through ("chat", "responses").
    """

    model: str
    messages: list[dict[str, Any]]
    decoding: Decoding
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, str] = "auto"
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    choice: tuple[str, ...] | None = None
    ignored: tuple[str, ...] = ()
    endpoint: str = "chat"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatRequest:
        data = dict(data)
        data["decoding"] = _decoding_from_json(data["decoding"])
        data["ignored"] = tuple(data.get("ignored", ()))
        if data.get("choice") is not None:
            data["choice"] = tuple(data["choice"])
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A validated `/v1/completions` body: one prompt, as text or token ids."""

    model: str
    prompt: str | list[int]
    decoding: Decoding
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    ignored: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CompletionRequest:
        data = dict(data)
        data["decoding"] = _decoding_from_json(data["decoding"])
        data["ignored"] = tuple(data.get("ignored", ()))
        return cls(**data)


def _decoding_from_json(data: Mapping[str, Any]) -> Decoding:
    data = dict(data)
    data["stop"] = tuple(data.get("stop", ()))
    return Decoding(**data)


# ----------------------------------------------------------------------------- field checks


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(body: Mapping, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number, got {_type_name(value)}", param=name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be in [{low}, {high}], got {value}", param=name)
    return float(value)


def _integer(body: Mapping, name: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(value)}", param=name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be in [{low}, {high}], got {value}", param=name)
    return value


def _boolean(body: Mapping, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, got {_type_name(value)}", param=name)
    return value


def _stop(body: Mapping) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(
            f"'stop' has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES}", param="stop"
        )
    if any(not s for s in stops):
        raise bad_request("'stop' sequences must not be empty strings", param="stop")
    return tuple(stops)


def _unsupported(body: Mapping, name: str, allowed: tuple[Any, ...], what: str) -> None:
    if name in body and body[name] not in allowed:
        raise bad_request(f"'{name}'={body[name]!r} is not supported: {what}", param=name)


def _ignored_fields(body: Mapping, honoured: set[str]) -> tuple[str, ...]:
    """Names of the fields that do not shape the answer (validated where OpenAI defines them,
    see `_check_ignored`): recorded, never refused, as OpenAI-compatible servers do."""
    _check_ignored(body)
    return tuple(sorted(name for name in body if name not in honoured))


def _model(body: Mapping) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required (a string naming a served model)", param="model")
    return model


def _stream(body: Mapping) -> tuple[bool, bool]:
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options")
    if not stream:
        raise bad_request(
            "'stream_options' is only allowed with stream=true", param="stream_options"
        )
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise bad_request(
            "'stream_options.include_usage' must be a boolean", param="stream_options"
        )
    return stream, include


def _check_ignored(body: Mapping) -> None:
    """Ignored fields OpenAI (or vLLM) defines still get their type and range checked, so a
    malformed body is refused the same way wherever it is sent."""
    for name in ("presence_penalty", "frequency_penalty"):
        _number(body, name, 0.0, -2.0, 2.0)
    _number(body, "repetition_penalty", 1.0, 0.0, 2.0**31)
    _number(body, "min_p", 0.0, 0.0, 1.0)
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(
            isinstance(k, str) and k.lstrip("-").isdigit() for k in bias
        ):
            raise bad_request(
                "'logit_bias' must map token ids (as strings) to numbers", param="logit_bias"
            )
        for key, value in bias.items():
            _number({key: value}, key, 0.0, -100.0, 100.0)
    _boolean(body, "parallel_tool_calls")
    for name in ("user", "service_tier", "safety_identifier", "prompt_cache_key"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad_request(f"'{name}' must be a string", param=name)
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise bad_request("'metadata' must be an object", param="metadata")


def _choices(body: Mapping) -> int:
    return _integer(body, "n", 1, 1, MAX_CHOICES)


def _sampling(body: Mapping, max_tokens_field: str | None = None) -> dict[str, Any]:
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p <= 0.0:
        raise bad_request("'top_p' must be in (0, 1]; use temperature=0 for greedy", param="top_p")
    max_tokens = _max_tokens(body, "max_tokens")
    if max_tokens_field is not None:
        newer = _max_tokens(body, max_tokens_field)
        max_tokens = newer if newer is not None else max_tokens
    top_k = _integer(body, "top_k", 0, -1, MAX_TOKENS_LIMIT)
    return dict(
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p,
        top_k=max(top_k, 0),  # vLLM convention: -1 disables top-k
        max_tokens=max_tokens,
        stop=_stop(body),
        seed=_integer(body, "seed", None, -(2**63), 2**63 - 1),
    )


def _max_tokens(body: Mapping, name: str) -> int | None:
    """At least 1; a value above the rest of the context is clamped later (the proxy knows
    the prompt's length), so only values no context could ever hold are refused."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {_type_name(value)}", param=name)
    if value < 1:
        raise bad_request(f"'{name}' must be >= 1, got {value}", param=name)
    if value > MAX_TOKENS_LIMIT:
        raise bad_request(
            f"'{name}' is {value}; the largest accepted value is {MAX_TOKENS_LIMIT} (2**31 - 1; "
            "values above the rest of the model's context are clamped to it)",
            param=name,
        )
    return value


def _reasoning_effort(body: Mapping) -> str | None:
    value = body.get("reasoning_effort")
    if value is not None and value not in REASONING_EFFORTS:
        raise bad_request(
            f"'reasoning_effort' {value!r} is invalid: one of {list(REASONING_EFFORTS)}",
            param="reasoning_effort",
        )
    return value


def normalize_roles(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`developer` messages become `system` messages (OpenAI's two names for one role); an
    assistant message without content or tool calls has content "" (a reply that was all
    reasoning comes back with `content: null`, and agents echo it as they got it)."""
    return [_normalize_role(m) if isinstance(m, Mapping) else m for m in messages]


def _normalize_role(message: Mapping[str, Any]) -> Mapping[str, Any]:
    role = message.get("role")
    if role == "developer":
        return {**message, "role": "system"}
    if role == "assistant" and message.get("content") is None and not message.get("tool_calls"):
        return {**message, "content": ""}
    return message


# ----------------------------------------------------------------------------- endpoints


def _tool_message_ids(messages: Sequence[Mapping[str, Any]]) -> None:
    for index, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise bad_request(
                f"messages[{index}].tool_calls must be a list of tool calls",
                param=f"messages[{index}].tool_calls",
            )
        if message.get("role") == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise bad_request(
                f"messages[{index}]: a tool message needs 'tool_call_id' (the id of the call "
                "it answers)",
                param=f"messages[{index}].tool_call_id",
            )
        for call_index, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") if isinstance(call, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                raise bad_request(
                    f"messages[{index}].tool_calls[{call_index}] needs function.name",
                    param=f"messages[{index}].tool_calls",
                )
            if arguments is not None and not isinstance(arguments, (str, dict)):
                raise bad_request(
                    f"messages[{index}].tool_calls[{call_index}].function.arguments must be a "
                    "JSON string",
                    param=f"messages[{index}].tool_calls",
                )


def parse_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated chat messages (roles normalized) or a 400 naming the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages", param="messages")
    messages = normalize_roles(messages)
    try:
        validate_messages(messages)
    except (TypeError, ValueError) as error:
        raise bad_request(f"invalid 'messages': {error}", param="messages") from None
    _tool_message_ids(messages)
    check_tool_call_ids(messages)
    return messages


def parse_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Normalized, validated tool specs (None for none)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("'tools' must be a list of tool specs", param="tools")
    try:
        tools = normalize_tools(tools) or None
    except (TypeError, ValueError) as error:
        raise bad_request(f"invalid 'tools': {error}", param="tools") from None
    if tools is not None:
        check_tools(tools)
    return tools


def parse_chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """Validate a chat completions body (a JSON object); raises a 400 `ApiError`."""
    ignored = _ignored_fields(body, _CHAT_FIELDS)
    model = _model(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"))
    tool_choice = parse_tool_choice(body.get("tool_choice"), tools)
    response_format = parse_response_format(body.get("response_format"))
    choice = parse_reply_choice(body)
    if choice is not None and response_format is not None:
        raise bad_request(
            "send one output constraint: 'response_format' or a choice list, not both",
            param="response_format",
        )
    if choice is not None and forces_tool_call(tools, tool_choice):
        raise bad_request(
            "a choice list constrains the reply text; it cannot be combined with a forced "
            "tool call ('tool_choice' 'required' or a named function)",
            param="tool_choice",
        )
    logprobs = _boolean(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top_logprobs and not logprobs:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    stream, include_usage = _stream(body)
    decoding = Decoding(
        **_sampling(body, "max_completion_tokens"), logprobs=logprobs, top_logprobs=top_logprobs
    )
    return ChatRequest(
        model=model,
        messages=messages,
        decoding=decoding,
        tools=tools,
        tool_choice=tool_choice,
        stream=stream,
        include_usage=include_usage,
        n=_choices(body),
        response_format=response_format,
        reasoning_effort=_reasoning_effort(body),
        choice=choice,
        ignored=ignored,
    )


def forces_tool_call(tools: Sequence[Any] | None, tool_choice: str | Mapping[str, str]) -> bool:
    """Whether `tool_choice` forces a call ("required" or a named function) among `tools`."""
    return bool(tools) and tool_choice not in ("auto", "none")


def parse_reply_choice(body: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The options of vLLM's choice constraint (`structured_outputs.choice`, or the older
    top-level `guided_choice`), None when the request sends neither."""
    structured, legacy = body.get("structured_outputs"), body.get("guided_choice")
    if structured is not None and legacy is not None:
        raise bad_request(
            "send 'structured_outputs.choice' or 'guided_choice', not both", param="guided_choice"
        )
    if structured is not None:
        if not isinstance(structured, Mapping):
            raise bad_request(
                '\'structured_outputs\' must be an object, e.g. {"choice": ["yes", "no"]}',
                param="structured_outputs",
            )
        other = sorted(set(structured) - {"choice"})
        if other:
            raise bad_request(
                f"'structured_outputs' supports only 'choice' here, not {other}; for JSON use "
                "'response_format'",
                param="structured_outputs",
            )
        return _choice_list(structured.get("choice"), "structured_outputs.choice")
    if legacy is not None:
        return _choice_list(legacy, "guided_choice")
    return None


def _choice_list(value: Any, param: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request(f"'{param}' must be a non-empty list of strings", param=param)
    if len(value) > MAX_REPLY_CHOICES:
        raise bad_request(
            f"'{param}' has {len(value)} options; at most {MAX_REPLY_CHOICES}", param=param
        )
    for index, option in enumerate(value):
        if not isinstance(option, str) or not option:
            raise bad_request(f"'{param}[{index}]' must be a non-empty string", param=param)
        if len(option) > MAX_REPLY_CHOICE_CHARS:
            raise bad_request(
                f"'{param}[{index}]' is {len(option)} characters; at most {MAX_REPLY_CHOICE_CHARS}",
                param=param,
            )
    return tuple(dict.fromkeys(value))  # duplicates name one option


def _prompt(body: Mapping) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("'prompt' must not be empty", param="prompt")
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("send one prompt per request (batches are not supported)", param="prompt")
    raise bad_request(
        "'prompt' must be a non-empty string or a non-empty list of token ids", param="prompt"
    )


def parse_completion_request(body: Mapping[str, Any]) -> CompletionRequest:
    """Validate a (legacy) completions body; raises a 400 `ApiError`."""
    ignored = _ignored_fields(body, _COMPLETION_FIELDS)
    model = _model(body)
    prompt = _prompt(body)
    _unsupported(body, "best_of", (1, None), "one sample per request")
    _unsupported(body, "echo", (False, None), "the prompt is not echoed")
    _unsupported(body, "suffix", (None, ""), "insertion is not supported")
    top_logprobs = _integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    stream, include_usage = _stream(body)
    sampling = _sampling(body)
    if sampling["max_tokens"] is None:
        sampling["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
    decoding = Decoding(
        **sampling, logprobs=top_logprobs is not None, top_logprobs=top_logprobs or 0
    )
    return CompletionRequest(
        model,
        prompt,
        decoding,
        stream=stream,
        include_usage=include_usage,
        n=_choices(body),
        ignored=ignored,
    )


def check_model(requested: str, served: Sequence[str]) -> None:
    """404 `model_not_found` unless `requested` is one of the served model ids."""
    if requested not in served:
        raise ApiError(
            404,
            f"the model {requested!r} does not exist; this server serves {list(served)}",
            param="model",
            code="model_not_found",
        )
