"""The output grammar of a chat request: forced tool calls and JSON output as Lark grammars
(llguidance's dialect, with inline JSON Schemas `%json {...}`) the worker enforces with a token
mask (`serving/worker/constraints.py`).

- tool_choice "required" / a named function: exactly one Qwen tool-call block,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, calling one of the tools (the
  named one) with arguments valid for its `parameters` schema;
- response_format json_object / json_schema: one JSON object (matching the schema); with tools
  and tool_choice "auto" the reply may instead be a tool call;
- a choice list (`structured_outputs.choice`): exactly one of the strings, byte for byte (with
  tools and tool_choice "auto", or a tool call);
- otherwise None (free text).
A constrained reply ends when its grammar does: only the stop tokens are allowed then.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from serving.common.openai_requests import ChatRequest

# Qwen writes tool-call JSON with json.dumps' separators; a grammar that allowed any spacing
# would let a random model pad the output with whitespace until max_tokens.
_TAG = re.compile(r"<[^<>\s]+>")  # an added token Lark can name: `<action>`, `<|im_end|>`
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: Mapping[str, Any]) -> str:
    return f"%json {json.dumps({**schema, 'x-guidance': _COMPACT})}"


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    # No parameters: the arguments are exactly {} (not any object).
    parameters = function.get("parameters") or {"type": "object", "additionalProperties": False}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _added_tokens(tokenizer: Tokenizer) -> list[str]:
    """The tokenizer's added tokens, longest first (none without a `tokenizers` backend)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return []
    return sorted({t.content for t in backend.get_added_tokens_decoder().values()}, key=len)[::-1]


def _tag(tokenizer: Tokenizer, text: str) -> str:
    """An added token by name (Lark's `<name>`: the one token, never its spelling in bytes;
    llguidance treats every added token as special, whatever its `special` flag), or the
    quoted literal when the tokenizer has no such token."""
    return text if text in _added_tokens(tokenizer) else json.dumps(text)


def tool_call_rules(tools: Sequence[Mapping[str, Any]], tokenizer: Tokenizer) -> str:
    """Rules `call_block` (one tool-call block calling one of `tools`) and `call`."""
    schemas = [_call_schema(tool) for tool in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    open_tag, close_tag = _tag(tokenizer, TOOL_CALL_OPEN), _tag(tokenizer, TOOL_CALL_CLOSE)
    return f'call_block: {open_tag} "\\n" call "\\n" {close_tag}\ncall: {_json(schema)}\n'


def _literal(text: str, added: Sequence[str]) -> str:
    """`text` as a Lark sequence: its added tokens (e.g. `<action>`) by name, so the reply
    spells them as the one token the model was trained on; the rest as quoted strings."""
    if not added:
        return json.dumps(text)
    pieces = re.split("(" + "|".join(re.escape(t) for t in added) + ")", text)
    # Lark names an added token only in its `<...>` form; any other is spelled out
    return " ".join(p if p in added and _TAG.fullmatch(p) else json.dumps(p) for p in pieces if p)


def choice_rule(options: Sequence[str], tokenizer: Tokenizer) -> str:
    """Rule `answer`: exactly one of `options` (their text byte for byte)."""
    added = _added_tokens(tokenizer)
    return "answer: " + " | ".join(f"({_literal(o, added)})" for o in options) + "\n"


def choice_grammar(options: Sequence[str], tokenizer: Tokenizer) -> str:
    """The grammar of a reply that is one of `options` (a choice list without tools)."""
    return "start: answer\n" + choice_rule(options, tokenizer)


def output_grammar(
    request: ChatRequest, tools: Sequence[Mapping[str, Any]] | None, tokenizer: Tokenizer
) -> str | None:
    """The grammar the reply must match (see the module docstring), None for free text."""
    choice = request.tool_choice
    if tools and choice not in ("auto", "none"):
        chosen = (
            tools
            if choice == "required"
            else [t for t in tools if t["function"]["name"] == choice["name"]]
        )
        return "start: call_block\n" + tool_call_rules(chosen, tokenizer)
    response_format = request.response_format
    if request.choice is not None:
        answer = choice_rule(request.choice, tokenizer)
    elif response_format is None:
        return None
    else:
        schema = response_format.get("schema") or {"type": "object"}
        if response_format["type"] == "json_object":
            schema = {"type": "object"}
        answer = f"answer: {_json(schema)}\n"
    if tools and choice == "auto":
        return "start: answer | call_block\n" + answer + tool_call_rules(tools, tokenizer)
    return "start: answer\n" + answer
