"""Rebuilds the token masks a served call was sampled under, from what the call recorded.

Two masks exist in the serving worker, both functions of the call's record only (never of the
weights), so replaying them over the recorded output ids gives the sampler's masks exactly:
- an output grammar (`decoding.extra.grammar`: forced tool calls, JSON output), replayed with
  llguidance through the worker's own rule (`atdp_io.grammar_masks`);
- a thinking budget (`decoding.extra.think_budget`, from `reasoning_effort`), when the
  tokenizer has `<think>` and `</think>` as single tokens: at budget 0 `<think>` is never
  allowed; once the budget is spent inside a thinking block only `</think>` is (forced). The
  rule is the worker's `Slot.next_mask` (serving/worker/slots.py); a test holds them equal.
A grammar takes precedence over a budget, as in the worker.

Cost: one llguidance mask per constrained output token (what the worker spent serving it),
on the loader's read threads; a budget costs a comparison per token.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import llguidance
import numpy as np
import tokenizers

from atdp_io.grammar_masks import grammar_steps, guidance_tokenizer, lark_matcher, stop_bitmask
from atdp_io.rows import LLMTurn, TrainingView
from atdp_io.token_masks import CallConstraint, CallMasks, ConstraintReplayError, collect_masks

THINK_TAGS = ("<think>", "</think>")


class MaskReplay:
    """Rebuilds constrained calls' masks with the served tokenizer (`tokenizer_json`, a
    Hugging Face `tokenizer.json`) and the model's vocabulary size `vocab_size` (the logits'
    width, which may exceed the tokenizer's). Thread-safe: the loader's read threads share one.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        backend = tokenizers.Tokenizer.from_str(tokenizer_json)
        think = tuple(backend.token_to_id(tag) for tag in THINK_TAGS)
        # the worker applies a budget only when both tags are single tokens
        self.think_ids: tuple[int, int] | None = None if None in think else think
        self._guidance: dict[tuple[int, ...], llguidance.LLTokenizer] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int) -> MaskReplay:
        """From a `sao_jax.tokenizers.HFTokenizer` (its `backend`, a `tokenizers.Tokenizer`)."""
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            raise ValueError("MaskReplay needs a Hugging Face `tokenizers` tokenizer")
        return cls(backend.to_str(), vocab_size)

    def view(self, view: TrainingView) -> TrainingView:
        """`view` with the masks of its constrained calls (`ConstraintReplayError` naming the
        trajectory and event of the first call that does not replay)."""
        if all(turn.constraint is None for turn in view.turns):
            return view
        turns = tuple(
            self.turn(t, f"trajectory {view.trajectory_id!r} event {t.event_index}")
            for t in view.turns
        )
        return dataclasses.replace(view, turns=turns)

    def turn(self, turn: LLMTurn, where: str) -> LLMTurn:
        """`turn` with its masks when it was constrained (as it is otherwise)."""
        constraint = turn.constraint
        if constraint is None:
            return turn
        if constraint.grammar is not None:
            masks = self.grammar_masks(constraint, turn.output_ids, where)
        else:
            masks = self.budget_masks(constraint, turn.input_ids, turn.output_ids, where)
        return turn._replace(masks=masks)

    def grammar_masks(
        self, constraint: CallConstraint, output_ids: np.ndarray, where: str
    ) -> CallMasks:
        """The grammar masks the sampler applied to `output_ids` [N]. `ConstraintReplayError`
        naming `where` when the grammar does not compile or a token lies outside its mask."""
        stops = constraint.stop_ids
        if any(t >= self.vocab_size for t in stops):
            raise ConstraintReplayError(
                f"{where}: stop ids {list(stops)} exceed the vocabulary ({self.vocab_size} ids)"
            )
        try:
            matcher = lark_matcher(self._guidance_tokenizer(stops), constraint.grammar)
        except ValueError as error:
            raise ConstraintReplayError(
                f"{where}: the recorded grammar does not compile: {error}"
            ) from None
        steps = grammar_steps(matcher, self.words, stop_bitmask(stops, self.words), output_ids)
        return collect_masks(steps, output_ids.shape[0], self.vocab_size, where, "grammar")

    def budget_masks(
        self,
        constraint: CallConstraint,
        input_ids: np.ndarray,
        output_ids: np.ndarray,
        where: str,
    ) -> CallMasks:
        """The thinking-budget masks the sampler applied to `output_ids` [N] after the prompt
        `input_ids`; none when the budget is unlimited or the tokenizer lacks the tags."""
        n = output_ids.shape[0]
        if constraint.think_budget is None or self.think_ids is None:
            return CallMasks(
                np.zeros(n, bool), np.full(n, -1, np.int32), np.zeros((0, self.words), np.int32)
            )
        steps = self._budget_steps(constraint.think_budget, input_ids, output_ids)
        return collect_masks(steps, n, self.vocab_size, where, "thinking budget")

    def _budget_steps(
        self, budget: int, input_ids: np.ndarray, output_ids: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray | None]]:
        """(token, the budget mask before it or None) along `output_ids`: the worker's rule."""
        open_id, close_id = self.think_ids
        prompt = input_ids.tolist()
        opened = max((i for i, t in enumerate(prompt) if t == open_id), default=-1)
        closed = max((i for i, t in enumerate(prompt) if t == close_id), default=-1)
        thinking = 0 if opened > closed else None  # tokens thought inside <think>, else None
        for token in output_ids.tolist():
            mask = None
            if thinking is None and budget == 0:
                mask = np.full((self.words,), -1, np.int32)
                mask.view(np.uint32)[open_id // 32] &= ~np.uint32(1 << (open_id % 32))
            elif thinking is not None and thinking >= budget:
                mask = stop_bitmask([close_id], self.words)
            yield token, mask
            if token == open_id:
                thinking = 0
            elif token == close_id:
                thinking = None
            elif thinking is not None:
                thinking += 1

    def _guidance_tokenizer(self, stop_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
        """The worker's llguidance tokenizer for calls that stop on `stop_ids`."""
        with self._lock:
            if stop_ids not in self._guidance:
                self._guidance[stop_ids] = guidance_tokenizer(
                    self.tokenizer_json, self.vocab_size, stop_ids
                )
            return self._guidance[stop_ids]
