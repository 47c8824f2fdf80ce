"""Applying a composite to a chat request: what the model sees.

The client's request is never changed; `apply_chat` returns new messages and tools.

Harness (system message). Let S be the client's system (or developer) message when it is the
first message. "prepend": the system message becomes the harness system prompt, S, then each
instruction, separated by blank lines. "replace": the harness prompt then the instructions; S
is dropped. Without harness text and in "prepend" mode the messages are left as sent.

Memory (retrieval, deterministic). A note matches a text when one of its keys occurs in it as
whole words, case-insensitively; its score is the number of its distinct keys that occur.
Notes are injected incrementally, so that a longer conversation only ever adds to what an
earlier call of the same conversation saw (the proxy's token-exact prefix reuse then still
holds): at each user message i, the notes not injected yet that match messages[0..i] are
ranked by score (ties: their order in the memory) and the best ones, up to `top_k` notes in the
whole conversation, go into one system message just before message i:

    Relevant notes from memory:
    - <note text>

Reply choices. With `harness.reply_choices`, the options the client's last user message lists
(by its pattern) become the replies allowed (`Applied.reply_choices`, the template around each
option); the gateway sends them as the request's choice list unless the client constrained
the output itself. A last user message that lists nothing leaves the reply free.

Tools. For each tool the client exposes: a `Tools` schema override replaces its `parameters`;
a harness tool-description override replaces its `description`. Tools the client does not
expose are never added (the agent could not run them).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from serving.control.composite import CompositePolicy, Harness, Memory, MemoryNote, Tools
from serving.proxy.conversation import message_text

MEMORY_HEADER = "Relevant notes from memory:"


@dataclasses.dataclass(frozen=True)
class Applied:
    """A chat request as the model will see it, and which notes were retrieved into it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    memory_notes: tuple[str, ...] = ()
    reply_choices: tuple[str, ...] | None = None


def _pattern(key: str) -> re.Pattern:
    words = [re.escape(w) for w in key.lower().split()]
    return re.compile(r"(?<!\w)" + r"\s+".join(words) + r"(?!\w)")


def system_message(
    messages: Sequence[Mapping[str, Any]], harness: Harness
) -> tuple[dict[str, Any] | None, int]:
    """(the system message the model sees, or None; how many leading client messages it
    stands for: 1 when it takes the client's system message's place, else 0)."""
    has_client = bool(messages) and messages[0].get("role") in ("system", "developer")
    if not harness.edits_system:
        return (dict(messages[0]), 1) if has_client else (None, 0)
    parts = [harness.system_prompt]
    if has_client and harness.system_mode == "prepend":
        parts.append(message_text(messages[0]))
    parts += list(harness.instructions)
    text = "\n\n".join(p for p in parts if p)
    role = messages[0].get("role", "system") if has_client else "system"
    return ({"role": role, "content": text} if text else None), int(has_client)


def retrieve(
    messages: Sequence[Mapping[str, Any]], memory: Memory
) -> list[tuple[int, list[MemoryNote]]]:
    """[(index of a user message, the notes injected before it)], by the rule above."""
    if not memory.notes or memory.top_k == 0:
        return []
    patterns = [[_pattern(k) for k in note.keys] for note in memory.notes]
    found: list[set[int]] = [set() for _ in memory.notes]  # keys seen so far, per note
    injected: set[int] = set()
    out = []
    for i, message in enumerate(messages):
        text = message_text(message).lower()
        for n, keys in enumerate(patterns):
            if n not in injected:
                found[n].update(
                    k for k, p in enumerate(keys) if k not in found[n] and p.search(text)
                )
        if message.get("role") != "user" or len(injected) >= memory.top_k:
            continue
        ranked = sorted(
            (n for n in range(len(memory.notes)) if n not in injected and found[n]),
            key=lambda n: (-len(found[n]), n),
        )[: memory.top_k - len(injected)]
        if ranked:
            injected.update(ranked)
            out.append((i, [memory.notes[n] for n in ranked]))
    return out


def memory_message(notes: Sequence[MemoryNote]) -> dict[str, str]:
    return {
        "role": "system",
        "content": "\n".join([MEMORY_HEADER, *(f"- {n.text}" for n in notes)]),
    }


def apply_tools(
    tools: Sequence[Mapping[str, Any]] | None, harness: Harness, overrides: Tools
) -> list[dict[str, Any]] | None:
    """The tools with schema and description overrides (module docstring)."""
    if tools is None:
        return None
    out = []
    for tool in tools:
        tool = copy.deepcopy(dict(tool))
        function = tool.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if name in overrides.schemas:
                function["parameters"] = copy.deepcopy(dict(overrides.schemas[name].parameters))
            if name in harness.tool_descriptions:
                function["description"] = harness.tool_descriptions[name]
        out.append(tool)
    return out


def apply_chat(
    composite: CompositePolicy,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
) -> Applied:
    """The messages and tools the model sees under `composite` (memory is retrieved from the
    client's conversation, before the harness adds its system text)."""
    spec = composite.spec
    injections = dict(retrieve(messages, spec.memory))
    system, start = system_message(messages, spec.harness)
    shown = [] if system is None else [system]
    for i in range(start, len(messages)):
        if i in injections:
            shown.append(memory_message(injections[i]))
        shown.append(dict(messages[i]))
    notes = tuple(n.id for i in sorted(injections) for n in injections[i])
    tools_shown = apply_tools(tools, spec.harness, spec.tools)
    return Applied(shown, tools_shown, notes, reply_choices(messages, spec.harness))


def reply_choices(
    messages: Sequence[Mapping[str, Any]], harness: Harness
) -> tuple[str, ...] | None:
    """The replies `harness.reply_choices` allows after `messages` (None: free)."""
    if harness.reply_choices is None:
        return None
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    return None if last is None else harness.reply_choices.replies(message_text(last))
