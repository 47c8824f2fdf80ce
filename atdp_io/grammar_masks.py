"""The grammar mask rule of constrained decoding, and its replay over a recorded call.

The serving worker (`serving/worker/constraints.py`) compiles a call's output grammar (Lark in
llguidance's dialect, recorded as `decoding.extra.grammar`) against the served tokenizer and,
before each token, turns llguidance's answer into the bitmask the sampler applies
(`allowed_bitmask`: that rule lives here and the worker calls it). A mask depends on the
grammar and the tokens so far only, never on the weights, so `GrammarReplay` -- the same
library, grammar, tokenizer and vocabulary size, over the recorded output ids -- rebuilds the
sampler's masks bit for bit, and the learner can take its log-probs under them
(`atdp_io.token_masks` holds the result).

Cost: one llguidance mask per output token, what the worker spent serving it (microseconds
to a millisecond or two per token at a 152k vocabulary), on the loader's read threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import llguidance
import numpy as np

from atdp_io.rows import LLMTurn, TrainingView
from atdp_io.token_masks import (
    CallConstraint,
    CallMasks,
    ConstraintReplayError,
    MaskInterner,
    allowed_count,
    allows,
)


def stop_bitmask(stop_ids: Sequence[int], words: int) -> np.ndarray:
    """[words] int32 bitmask allowing exactly `stop_ids`."""
    mask = np.zeros((words,), np.uint32)
    for token in stop_ids:
        mask[token // 32] |= np.uint32(1 << (token % 32))
    return mask.view(np.int32)


def allowed_bitmask(matcher: llguidance.LLMatcher, words: int, stop_mask: np.ndarray) -> np.ndarray:
    """[words] int32, bit i % 32 of word i // 32 set when id i may come next. A matcher in an
    error state (a broken grammar), or one allowing nothing, allows only the stop tokens: the
    reply ends rather than leaving the grammar."""
    if matcher.is_error():
        return stop_mask.copy()
    mask = np.zeros((words,), np.int32)
    bits = np.frombuffer(matcher.compute_bitmask(), np.int32)
    n = min(len(bits), words)
    mask[:n] = bits[:n]
    return mask if mask.any() else stop_mask.copy()


def guidance_tokenizer(
    tokenizer_json: str, vocab_size: int, stop_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face `tokenizer.json` over `vocab_size` ids (the
    logits' width), `stop_ids` ending a sequence (allowed once the grammar is complete)."""
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(stop_ids))


def lark_matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    """A matcher of `grammar`; ValueError with llguidance's message when it does not compile."""
    try:
        matcher = llguidance.LLMatcher(
            tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0
        )
    except (ValueError, RuntimeError) as error:
        raise ValueError(str(error)) from None
    if matcher.is_error():
        raise ValueError(matcher.get_error())
    return matcher


class GrammarReplay:
    """Rebuilds constrained calls' masks with the served tokenizer (`tokenizer_json`, a
    Hugging Face `tokenizer.json`) and the model's vocabulary size `vocab_size` (the logits'
    width, which may exceed the tokenizer's). Thread-safe: the loader's read threads share one.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._tokenizers: dict[tuple[int, ...], llguidance.LLTokenizer] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int) -> GrammarReplay:
        """From a `sao_jax.tokenizers.HFTokenizer` (its `backend`, a `tokenizers.Tokenizer`)."""
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            raise ValueError("GrammarReplay needs a Hugging Face `tokenizers` tokenizer")
        return cls(backend.to_str(), vocab_size)

    def _tokenizer(self, stop_ids: tuple[int, ...]) -> llguidance.LLTokenizer:
        """The worker's llguidance tokenizer for calls that stop on `stop_ids`."""
        with self._lock:
            if stop_ids not in self._tokenizers:
                self._tokenizers[stop_ids] = guidance_tokenizer(
                    self.tokenizer_json, self.vocab_size, stop_ids
                )
            return self._tokenizers[stop_ids]

    def call_masks(
        self, constraint: CallConstraint, output_ids: np.ndarray, where: str
    ) -> CallMasks:
        """The masks the sampler applied to `output_ids` [N]. Raises `ConstraintReplayError`
        naming `where` when the grammar does not compile or a token lies outside its mask."""
        if any(t >= self.vocab_size for t in constraint.stop_ids):
            raise ConstraintReplayError(
                f"{where}: stop ids {list(constraint.stop_ids)} exceed the vocabulary "
                f"({self.vocab_size} ids)"
            )
        try:
            matcher = lark_matcher(self._tokenizer(constraint.stop_ids), constraint.grammar)
        except ValueError as error:
            raise ConstraintReplayError(
                f"{where}: the recorded grammar does not compile: {error}"
            ) from None
        stop_mask = stop_bitmask(constraint.stop_ids, self.words)
        interner = MaskInterner(self.words)
        n = output_ids.shape[0]
        forced, index = np.zeros(n, bool), np.full(n, -1, np.int32)
        for i, token in enumerate(output_ids.tolist()):
            mask = allowed_bitmask(matcher, self.words, stop_mask)
            if not 0 <= token < self.vocab_size or not allows(mask, token):
                raise ConstraintReplayError(
                    f"{where}: output token {i} (id {token}) is outside the mask of the recorded "
                    "grammar (a grammar, tokenizer or vocabulary other than the served ones?)"
                )
            count = allowed_count(mask)
            if count == 1:
                forced[i] = True
            elif count:  # an empty mask (no stop ids) allows every id: nothing to rebuild
                index[i] = interner.add(mask)
            matcher.consume_token(token)
        return CallMasks(forced, index, interner.table())

    def turn(self, turn: LLMTurn, where: str) -> LLMTurn:
        """`turn` with its masks when it was constrained (as it is otherwise)."""
        if turn.constraint is None:
            return turn
        return turn._replace(masks=self.call_masks(turn.constraint, turn.output_ids, where))

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
