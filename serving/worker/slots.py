"""Bookkeeping of one request while it holds a KV-cache slot.

A `Slot` collects the tokens the sampler produces for its request, decides when the request
is finished (stop token, length, stop string) and cuts what the engine delivers next into a
`TokenChunk`. It never touches device state: the engine owns the batch.
"""

from __future__ import annotations

import dataclasses
import time

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
