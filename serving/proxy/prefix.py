"""Token-exact prompts: earlier assistant turns are the ids that were sampled, not re-tokenized.

An agent resends its whole conversation on every call, with our earlier replies as text.
Re-tokenizing that text can give other ids than the ones sampled (a reply cut by a stop string,
invalid UTF-8 that came back as U+FFFD, special tokens, a different BPE split), so the record
would train on a context the model never produced. Instead, every recorded completion is kept
as a `SampledTurn`: the key of its conversation (the messages it was given plus the reply as the
client will echo it) and its exact context ids (input + output). A new call whose messages
extend a turn's conversation is rendered as that turn's context ids, the end of its assistant
turn (`<|im_end|>` unless a stop token was sampled), then the new messages rendered with the
chat template. Anything else (an edited history, changed tools, a first call) is rendered from
scratch.

Keys: `conversation_keys(messages, tools)[j]` names `messages[:j]` under `tools`, chained
(sha256 of the previous key and the next message's canonical form, see `conversation.py`), so
one pass over the messages gives the key of every prefix. Keys are lowercase letters, like the
ids of `serving.common.ids`, so the ATDP redactor leaves them alone in recorded metadata.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sao_jax.tokenizers import Tokenizer, render_chatml
from sao_jax.tokenizers.chat_template import IM_END
from serving.common.ids import _SCREEN
from serving.proxy.conversation import canonical

MAX_TURNS = 64  # sampled turns kept per session (an agent rarely branches further back)


def _letters(digest: bytes) -> str:
    return "".join(chr(ord("a") + b % 26) for b in digest[:24])


def _key(data: str) -> str:
    digest = hashlib.sha256(data.encode()).digest()
    key = _letters(digest)
    while _SCREEN.might_match(key):  # deterministic re-draw, as rare as for opaque ids
        digest = hashlib.sha256(digest).digest()
        key = _letters(digest)
    return key


def conversation_keys(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[str]:
    """keys[j] names messages[:j] with these tools; len(messages) + 1 keys."""
    keys = [_key("tools:" + json.dumps(tools or None, sort_keys=True, ensure_ascii=False))]
    for message in messages:
        keys.append(_key(keys[-1] + json.dumps(canonical(message), ensure_ascii=False)))
    return keys


def echoed_reply(content: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The assistant message a client sends back for a reply (reasoning is not echoed)."""
    return {"role": "assistant", "content": content, "tool_calls": list(tool_calls)}


@dataclasses.dataclass(frozen=True)
class SampledTurn:
    """One recorded completion: `key` names its conversation including the echoed reply;
    `context_ids [P + N] int32` its input and sampled output ids."""

    key: str
    context_ids: np.ndarray
    interaction_id: str


class TurnIndex:
    """A session's most recent sampled turns, by conversation key (bounded, oldest dropped)."""

    def __init__(self, limit: int = MAX_TURNS):
        self.limit = limit
        self._turns: collections.OrderedDict[str, SampledTurn] = collections.OrderedDict()

    def add(self, turn: SampledTurn) -> None:
        self._turns[turn.key] = turn
        self._turns.move_to_end(turn.key)
        while len(self._turns) > self.limit:
            self._turns.popitem(last=False)

    def match(self, keys: Sequence[str]) -> tuple[SampledTurn, int] | None:
        """(the turn whose conversation is the longest proper prefix of the messages that
        `keys` name, how many messages it covers), or None."""
        for covered in range(len(keys) - 2, 0, -1):
            turn = self._turns.get(keys[covered])
            if turn is not None:
                return turn, covered
        return None

    def __len__(self) -> int:
        return len(self._turns)


def render_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    matched: tuple[SampledTurn, int] | None,
) -> list[int]:
    """Prompt ids: the matched turn's context + the rest rendered, or the whole chat."""
    if matched is None:
        return tokenizer.encode_chat(messages, tools=tools)
    turn, covered = matched
    context = turn.context_ids.tolist()
    # The sampled turn ends with a stop token, or was cut (stop string, length): then the
    # template's end of turn follows, as render_chatml writes it after an assistant message.
    joiner = "\n" if context and context[-1] in tokenizer.stop_ids else IM_END + "\n"
    rest = render_chatml(messages[covered:], add_generation_prompt=True)
    return context + tokenizer.encode(joiner + rest)
