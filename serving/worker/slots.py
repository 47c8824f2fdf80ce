"""Bookkeeping of one request while it holds a KV-cache slot.

A `Slot` collects the tokens the sampler produces for its request, decides when the request
is finished (stop token, length, stop string) and cuts what the engine delivers next into a
`TokenChunk`. It never touches device state: the engine owns the batch.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from serving.worker.constraints import TokenConstraint
from serving.worker.generation import (
    Finished,
    GenerationHandle,
    GenerationRequest,
    TextTracker,
    TokenChunk,
)


@dataclasses.dataclass
class Slot:
    """A request holding a cache slot. `live`: still active in the sampler's decode state;
    `top`: top log-probs of output tokens scored so far ([len(top)] <= [len(output)])."""

    handle: GenerationHandle
    stop_ids: frozenset[int]
    tracker: TextTracker
    admitted_at: float
    output: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    sampled: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    delivered: int = 0
    text: str = ""  # text not yet delivered
    live: bool = True
    finish: str | None = None
    stop_reason: str | int | None = None
    think_ids: tuple[int, int] | None = None  # (<think>, </think>) when the budget applies
    thinking: int | None = None  # tokens thought so far while inside <think>, else None

    @property
    def request(self) -> GenerationRequest:
        return self.handle.request

    @property
    def constraint(self) -> TokenConstraint | None:
        return self.handle.constraint

    def extend(
        self, tokens: list[int], logprobs: list[float], version: int, sampled: list[float]
    ) -> bool:
        """Append sampled tokens (policy log-probs, sampled-distribution log-probs) and decide
        whether the request is done. Returns True when a stop string ended it while the
        sampler still had it active (the engine must then deactivate the slot); tokens after
        the stop string are dropped."""
        if self.constraint is not None:
            for token in tokens:
                self.constraint.consume(token)
        if self.think_ids is not None:
            for token in tokens:
                if token == self.think_ids[0]:
                    self.thinking = 0
                elif token == self.think_ids[1]:
                    self.thinking = None
                elif self.thinking is not None:
                    self.thinking += 1
        self.output.extend(tokens)
        self.logprobs.extend(logprobs)
        self.sampled.extend(sampled)
        self.versions.extend([version] * len(tokens))
        max_tokens = self.request.max_tokens
        sampler_done = self.output[-1] in self.stop_ids or len(self.output) >= max_tokens
        delta, keep, stop = self.tracker.update(self.output, sampler_done)
        self.text += delta
        if keep is not None:
            del self.output[keep:], self.logprobs[keep:], self.versions[keep:]
            del self.sampled[keep:]
            self.finish, self.stop_reason = "stop", stop
        elif self.output[-1] in self.stop_ids:
            self.finish, self.stop_reason = "stop", self.output[-1]
        elif len(self.output) >= max_tokens:
            self.finish = "length"
        if self.finish is None:
            return False
        was_live, self.live = self.live, False
        return keep is not None and was_live and not sampler_done

    def start_budget(self, think_ids: tuple[int, int]) -> None:
        """Apply the request's thinking budget; a prompt that ends inside <think> (a template
        that opens the thinking block itself) starts the count at once."""
        self.think_ids = think_ids
        prompt = self.request.input_ids
        opened = max((i for i, t in enumerate(prompt) if t == think_ids[0]), default=-1)
        closed = max((i for i, t in enumerate(prompt) if t == think_ids[1]), default=-1)
        # a continued reply (`request.continues`) already spent its thinking tokens so far
        reply_start = len(prompt) - len(self.request.continues)
        spent = len(prompt) - max(opened + 1, reply_start)
        self.thinking = spent if opened > closed else None

    def next_mask(self, words: int) -> np.ndarray | None:
        """[words] int32 bitmask of the ids allowed next (the grammar's; or, under a thinking
        budget, no <think> at budget 0 and only </think> once the budget is spent), or None
        when every id is."""
        if self.constraint is not None:
            return self.constraint.bitmask()
        if self.think_ids is None:
            return None
        budget, (open_id, close_id) = self.request.think_budget, self.think_ids
        if self.thinking is None and budget == 0:
            mask = np.full((words,), -1, np.int32)
            mask.view(np.uint32)[open_id // 32] &= ~np.uint32(1 << (open_id % 32))
            return mask
        if self.thinking is not None and self.thinking >= budget:
            mask = np.zeros((words,), np.int32)
            mask.view(np.uint32)[close_id // 32] |= np.uint32(1 << (close_id % 32))
            return mask
        return None

    def needs_single_steps(self, steps: int) -> bool:
        """Whether the next `steps` tokens could need a mask (then decode one at a time)."""
        if not self.live:
            return False
        if self.constraint is not None:
            return True
        if self.think_ids is None:
            return False
        if self.thinking is None:
            return self.request.think_budget == 0
        return self.thinking + steps > self.request.think_budget

    def end(self, reason: str) -> bool:
        """Finish early (cancelled, timeout); returns whether the slot was live."""
        was_live = self.live
        self.finish, self.live = reason, False
        return was_live

    def score_row(self) -> tuple[list[int], int] | None:
        """(context tokens preceding the unscored output tokens, position of the first) for the
        top-logprob scorer, or None when nothing needs scoring."""
        if not self.request.top_logprobs or len(self.top) >= len(self.output):
            return None
        prompt = list(self.request.input_ids)
        begin = len(prompt) + len(self.top) - 1
        context = (prompt + self.output)[begin : len(prompt) + len(self.output) - 1]
        return context, begin

    def add_top(self, ids, values) -> None:
        k = self.request.top_logprobs
        for j in range(ids.shape[0]):
            self.top.append(
                [(int(i), float(v)) for i, v in zip(ids[j, :k], values[j, :k], strict=True)]
            )

    def next_events(self) -> tuple[list, bool]:
        """Events to deliver now and whether the request is complete (slot can be freed)."""
        events: list = []
        upto = len(self.output)
        if self.finish is None:  # ids go with their text: held-back text holds its ids back
            upto = min(upto, self.tracker.released)
        wants_top = bool(self.request.top_logprobs)
        if wants_top:
            upto = min(upto, len(self.top))
        if upto > self.delivered or self.text:
            top = self.top[self.delivered : upto] if wants_top else None
            events.append(
                TokenChunk(
                    self.output[self.delivered : upto],
                    self.logprobs[self.delivered : upto],
                    self.versions[self.delivered : upto],
                    self.text,
                    top,
                    self.sampled[self.delivered : upto],
                )
            )
            self.delivered, self.text = upto, ""
        done = self.finish is not None and self.delivered >= len(self.output)
        if done:
            events.append(self.finished())
        return events, done

    def finished(self) -> Finished:
        return Finished(
            finish_reason=self.finish,
            prompt_tokens=len(self.request.input_ids),
            completion_tokens=len(self.output),
            text=self.tracker.final_text(self.output),
            stop_reason=self.stop_reason,
            queue_s=self.admitted_at - self.handle.submitted_at,
        )

    def age_s(self) -> float:
        return time.monotonic() - self.handle.submitted_at
