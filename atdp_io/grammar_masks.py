"""The grammar mask rule of constrained decoding (llguidance), shared by the serving worker
and the training replay.

The serving worker (`serving/worker/constraints.py`) compiles a call's output grammar (Lark in
llguidance's dialect, recorded as `decoding.extra.grammar`) against the served tokenizer and,
before each token, turns llguidance's answer into the bitmask the sampler applies
(`allowed_bitmask`). A mask depends on the grammar and the tokens so far only, never on the
weights, so the same functions over the recorded output ids (`grammar_steps`, driven by
`atdp_io.mask_replay.MaskReplay`) rebuild the sampler's masks bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import llguidance
import numpy as np
import tokenizers


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


class TokenConstraint:
    """One request's grammar state: the next allowed ids, advanced token by token."""

    def __init__(self, matcher: llguidance.LLMatcher, words: int, stop_mask: np.ndarray):
        self.matcher = matcher
        self.words = words
        self.stop_mask = stop_mask

    def bitmask(self) -> np.ndarray:
        """[ceil(V / 32)] int32, bit i % 32 of word i // 32 set when id i may come next. A
        matcher in an error state (a broken grammar) allows only the stop tokens: the reply
        ends rather than leaving the grammar (`allowed_bitmask`)."""
        return allowed_bitmask(self.matcher, self.words, self.stop_mask)

    def consume(self, token: int) -> None:
        """Advance past a sampled token (the mask allowed it, so this cannot fail unless the
        grammar itself is broken; the matcher then allows only stop tokens)."""
        self.matcher.consume_token(int(token))

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None


def guidance_tokenizer(
    tokenizer_json: str, vocab_size: int, stop_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """llguidance's view of a Hugging Face `tokenizer.json` over `vocab_size` ids (the
    logits' width), `stop_ids` ending a sequence (allowed once the grammar is complete).

    llguidance reads byte-level and byte-fallback tokenizers itself. A tokenizer whose decoder
    only concatenates its pieces (`Fuse`, e.g. the word-level ALFWorld tokenizer) is given to it
    as the bytes of each piece, every added token marked special (as llguidance treats added
    tokens of the tokenizers it reads itself)."""
    decoder = (json.loads(tokenizer_json).get("decoder") or {}).get("type")
    if decoder == "Fuse":
        wrapper = llguidance.TokenizerWrapper(_FusedPieces(tokenizer_json, vocab_size, stop_ids))
        return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(stop_ids))
    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(stop_ids))


class _FusedPieces:
    """A tokenizer whose text is the concatenation of its pieces, as `TokenizerWrapper` takes
    it: the bytes of each id (added tokens prefixed with 0xff, llguidance's mark of a special
    token; ids past the vocabulary empty) and an encoder."""

    def __init__(self, tokenizer_json: str, vocab_size: int, stop_ids: Sequence[int]):
        self._backend = tokenizers.Tokenizer.from_str(tokenizer_json)
        added = {int(i) for i in self._backend.get_added_tokens_decoder()}
        self.tokens = []
        for token_id in range(vocab_size):
            piece = self._backend.id_to_token(token_id)
            data = b"" if piece is None else piece.encode("utf-8")
            self.tokens.append(b"\xff" + data if token_id in added else data)
        self.special_token_ids = sorted(added)
        self.eos_token_id = int(stop_ids[0]) if stop_ids else None
        self.bos_token_id = None

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._backend.encode(text, add_special_tokens=False).ids


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


def grammar_steps(
    matcher: llguidance.LLMatcher, words: int, stop_mask: np.ndarray, output_ids: np.ndarray
) -> Iterator[tuple[int, np.ndarray]]:
    """(token, the mask the worker applied before it) along `output_ids`, advancing `matcher`."""
    for token in output_ids.tolist():
        yield token, allowed_bitmask(matcher, words, stop_mask)
        matcher.consume_token(token)
