"""One generation request as the worker sees it: token ids in, a stream of token chunks out.

`GenerationRequest` / `TokenChunk` / `Finished` are the worker's wire format too (JSON lines
over HTTP). `TextTracker` turns a growing list of output ids into text deltas, always at token
boundaries: it holds back an incomplete UTF-8 character and any tail that could start a stop
string, and cuts a stop-string hit at the last token before it, so the stop sequence never
reaches the client and the reply text is exactly the decode of the kept ids.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sao_jax.tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what a byte-level decode shows for an unfinished UTF-8 sequence


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """input_ids [P]; stop_token_ids None means the tokenizer's stop ids (EOS, <|im_end|>);
    grammar: a Lark grammar (llguidance dialect, see `constraints.py`) the output must match,
    enforced by a token mask while sampling (None: unconstrained); think_budget: at most this
    many tokens between <think> and </think> (</think> is forced then; 0: <think> is never
    sampled; None: no limit).

    continues: when the request continues a reply another worker started (and died in), the
    reply's ids so far -- the tail of `input_ids`; the grammar, the thinking budget, stop
    strings and the text see the whole reply. continued_chars: how many characters of that
    reply's text were already delivered (the rest, held back then, is delivered now)."""

    input_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None
    top_logprobs: int = 0
    request_id: str = ""
    timeout_s: float | None = None
    grammar: str | None = None
    think_budget: int | None = None
    continues: tuple[int, ...] = ()
    continued_chars: int = 0

    def __post_init__(self):
        n = len(self.continues)
        if n and tuple(self.input_ids[len(self.input_ids) - n :]) != tuple(self.continues):
            raise ValueError("continues must be the tail of input_ids (the reply so far)")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationRequest:
        data = dict(data)
        data["input_ids"] = tuple(data["input_ids"])
        data["stop"] = tuple(data.get("stop", ()))
        if data.get("stop_token_ids") is not None:
            data["stop_token_ids"] = tuple(data["stop_token_ids"])
        data["continues"] = tuple(data.get("continues", ()))
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class TokenChunk:
    """Tokens generated since the last chunk: ids [n], log-probs [n] (the policy's, at
    temperature 1), the policy version of each [n], the text they add, top log-probs [n][k]
    (id, logp), and sampled log-probs [n]: under the distribution each token was actually drawn
    from (temperature, top-k, top-p and grammar mask applied; 0 for greedy)."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    text: str
    top_logprobs: list[list[tuple[int, float]]] | None = None
    sampled_logprobs: list[float] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": "chunk", **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class Finished:
    """The end of a generation. finish_reason: stop | length | cancelled | timeout | error."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    text: str
    stop_reason: str | int | None = None
    error: str | None = None
    queue_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"type": "finished", **dataclasses.asdict(self)}


GenerationEvent = TokenChunk | Finished


def event_from_json(data: dict[str, Any]) -> GenerationEvent:
    data = dict(data)
    kind = data.pop("type")
    if kind == "chunk":
        if data.get("top_logprobs") is not None:
            data["top_logprobs"] = [[tuple(p) for p in row] for row in data["top_logprobs"]]
        return TokenChunk(**data)
    return Finished(**data)


class GenerationHandle:
    """The caller's end of a running generation: iterate it for events; `cancel()` frees the
    slot. Events are pushed from the engine thread with `loop.call_soon_threadsafe`."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.submitted_at = time.monotonic()
        self.deadline = None if request.timeout_s is None else self.submitted_at + request.timeout_s
        self.cancelled = False
        self.constraint = None  # the compiled grammar (`constraints.TokenConstraint`), if any
        self._queue: asyncio.Queue[GenerationEvent] = asyncio.Queue()

    def cancel(self) -> None:
        self.cancelled = True

    def push(self, event: GenerationEvent) -> None:
        """Called on the handle's event loop."""
        self._queue.put_nowait(event)

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """Chunks, then exactly one `Finished`. Leaving early cancels the generation."""
        try:
            while True:
                event = await self._queue.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self.cancel()


class TextTracker:
    """Output ids -> emitted text, with stop strings and incomplete characters held back.

    Token-exact: the text emitted is always the decode of a whole-token prefix of the output
    (special tokens included, only a final stop token left out), so what the client receives is
    exactly `decode(kept ids)`. A stop string cuts the reply at the last token boundary before
    it (a token that straddles the stop string's start is dropped with it); text that could
    still start a stop string, or an unfinished UTF-8 character, is held back in whole tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop: Sequence[str],
        stop_ids: frozenset[int],
        *,
        prefix: Sequence[int] = (),
        sent: int = 0,
    ):
        """prefix: ids of the reply generated before (by a worker that died), `sent` of its
        characters already emitted; `update` then takes the ids generated after it."""
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.stop_ids = stop_ids
        self.prefix = list(prefix)
        self.sent = sent  # characters already emitted
        self._released = len(self.prefix)  # leading ids whose text is all emitted
        self.stopped_text: str | None = None  # the reply when a stop string ended it
        self._searched = 0  # stop strings cannot start before this character
        # A prefix of the output that ends on a whole character, and its text: every later
        # text is `_base_text + decode(ids[_base:])`, so an update decodes only the new tail
        # (byte-level decoding of a split after a complete character is the concatenation).
        self._base = 0
        self._base_text = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _text(self, ids: Sequence[int], count: int) -> str:
        """decode(ids[:count]) for count >= the base."""
        return self._base_text + self._decode(ids[self._base : count])

    def _content_ids(self, ids: Sequence[int]) -> Sequence[int]:
        # a final stop token ends the turn; its own text is never part of the reply
        return ids[:-1] if ids and ids[-1] in self.stop_ids else ids

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop string) of the stop string complete first in `text`: the earliest end,
        at a tie the earliest start. Streaming one character at a time stops there, so the cut
        does not depend on how many tokens each update brings (by earliest start, "a>>" with
        stops ">" and "a>>" cut at ">" when it came in two updates and before "a" in one)."""
        hits = []
        for stop in self.stop:
            start = text.find(stop, self._searched)
            if start >= 0:
                hits.append((start + len(stop), start, stop))
        if not hits:
            return None
        _, start, stop = min(hits)
        return start, stop

    def _holdback(self, text: str) -> int:
        """Characters at the end of `text` that may not be sent yet: an unfinished UTF-8
        character, and before it any tail that could start a stop string."""
        whole = text.rstrip(REPLACEMENT_CHAR)
        prefix = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(whole)), prefix, -1):
                if whole.endswith(stop[:n]):
                    prefix = n
                    break
        return len(text) - len(whole) + prefix

    def _boundary(self, ids: Sequence[int], text: str, chars: int) -> tuple[int, str]:
        """(k, decode(ids[:k])) for the most leading tokens whose text is a prefix of
        `text[:chars]` (binary search on length from the base, then back off past a split
        character). The base itself always qualifies: it was sent, or it is empty."""
        low, high = self._base, len(ids)
        while low < high:
            mid = (low + high + 1) // 2
            if len(self._text(ids, mid)) <= chars:
                low = mid
            else:
                high = mid - 1
        while low > self._base:
            prefix = self._text(ids, low)
            if len(prefix) <= chars and text.startswith(prefix):
                return low, prefix
            low -= 1
        return self._base, self._base_text

    def _advance(self, count: int, prefix: str) -> None:
        """Move the base to `count` tokens (text `prefix`) if they end on a whole character."""
        if count > self._base and not prefix.endswith(REPLACEMENT_CHAR):
            self._base, self._base_text = count, prefix

    def update(self, ids: list[int], finished: bool) -> tuple[str, int | None, str | None]:
        """Returns (new text to emit, token count to keep if a stop string ended the reply,
        the stop string). With a stop hit, `ids[:keep]` is the reply up to the last token
        boundary before the stop string and the reply text is exactly their decode. With a
        prefix, `ids` and `keep` count the tokens after it (a stop string that starts inside
        the prefix keeps none of them)."""
        if self.prefix:
            delta, keep, stop = self._update(self.prefix + ids, finished)
            return delta, None if keep is None else max(0, keep - len(self.prefix)), stop
        return self._update(ids, finished)

    @property
    def released(self) -> int:
        """How many of the ids after the prefix have had all their text emitted: ids past it
        are held back with their text (a stop string may yet start inside one and drop it)."""
        return max(0, self._released - len(self.prefix))

    def _update(self, ids: list[int], finished: bool) -> tuple[str, int | None, str | None]:
        content = self._content_ids(ids)
        text = self._text(content, len(content))
        hit = self._find_stop(text) if self.stop else None
        keep = None
        if hit is not None:
            keep, text = self._boundary(ids, text, hit[0])
            self.stopped_text = text
            emit_to = len(text)
            self._released = keep
        elif finished:
            emit_to = len(text)
            self._released = len(ids)
        else:
            if self.stop:
                longest = max(len(s) for s in self.stop)
                self._searched = max(0, len(text.rstrip(REPLACEMENT_CHAR)) - longest + 1)
            held = self._holdback(text)
            if held:
                count, prefix = self._boundary(content, text, len(text) - held)
            else:
                count, prefix = len(content), text
            emit_to = len(prefix)
            self._advance(count, prefix)
            self._released = max(self._released, count)
        delta = text[self.sent : max(emit_to, self.sent)]
        self.sent = max(self.sent, emit_to)
        return delta, keep, hit[1] if hit else None

    def final_text(self, ids: list[int]) -> str:
        """The whole reply (stop string and stop token excluded): `decode` of the kept ids."""
        if self.stopped_text is not None:
            return self.stopped_text
        content = self._content_ids(self.prefix + list(ids))
        return self._text(content, len(content))
