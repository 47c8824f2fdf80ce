"""Token masks of constrained LLM calls, as training data. Pure numpy, no I/O.

A call served under an output grammar (forced tool call, JSON output) or a thinking budget
drew each token from the policy restricted to the ids allowed at that point: the same
transform (temperature, top-k, top-p) applied to logits with the other ids at -inf. For the
learner's ratio to equal the sampler's, it must apply the same allowed set at each of those
tokens. `atdp_io.mask_replay` rebuilds the sets from the recorded call; this module holds them.

Per call (`CallMasks`), each output token is either
- **forced**: the grammar allowed exactly one id (tags, keys, punctuation, the stop token
  after a complete reply). Its masked probability is 1 under any weights: no gradient, ratio
  1 by construction. The rows leave it out of `loss_mask` (like a tool result): it is not a
  decision of the policy, and counting it would only dilute the token-mean loss by however
  much boilerplate the grammar forces.
- **masked**: an index into the call's table of distinct bitmasks;
- **free**: no mask applied (a thinking budget not reached).

In a batch (`pack_masks`, keys `MASK_KEYS`): `mask_index [R, T] int32` (the token's mask in
its row's table, -1: unmasked) and `mask_table [R, M, W] int32` (row r's distinct masks;
bit i % 32 of word i // 32 set when id i is allowed; W = ceil(V / 32), the sampler's layout).
Size bound: 4 W bytes per distinct mask and row, 18,992 bytes at a 151,936-id vocabulary;
M (the most distinct masks of a row, rounded up to a power of two so batches share compiled
shapes) is at most the row's masked action tokens, and far fewer in practice: a JSON
grammar's masks repeat (inside a string, inside a number, after a key). 64 rows x 256 masks
is ~311 MB at that vocabulary; per-token bitmasks would cost the same 19 KB per *token*.
Rows, not the batch, own tables so that every batch array stays row-indexed (sharded over
the batch axis, compacted and gathered across hosts like the other [R, ...] keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

# Batch keys present only when some row holds a masked token.
MASK_KEYS = ("mask_index", "mask_table")


class ConstraintReplayError(ValueError):
    """A recorded grammar does not compile, or does not allow a recorded output token."""


class CallConstraint(NamedTuple):
    """What a constrained call's masks are rebuilt from: its grammar (Lark, llguidance's
    dialect; None: none), the stop ids it ended on (allowed once the grammar is complete) and
    its thinking budget (tokens between <think> and </think>; None: unlimited). A grammar
    takes precedence over the budget, as in the worker."""

    grammar: str | None
    stop_ids: tuple[int, ...]
    think_budget: int | None = None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def call_constraint(extra: Mapping[str, Any], where: str) -> CallConstraint | None:
    """The `CallConstraint` of a call's `decoding.extra` (None without a grammar or a
    thinking budget). Raises ValueError naming `where` when `grammar`, `stop_token_ids` or
    `think_budget` is malformed."""
    grammar, budget = extra.get("grammar"), extra.get("think_budget")
    if grammar is None and budget is None:
        return None
    if grammar is not None and (not isinstance(grammar, str) or not grammar):
        raise ValueError(f"{where}: llm.decoding.extra.grammar must be a non-empty string")
    if budget is not None and not _is_id(budget):
        raise ValueError(f"{where}: llm.decoding.extra.think_budget must be an int >= 0")
    stops = extra.get("stop_token_ids", ())
    if not isinstance(stops, Sequence) or not all(_is_id(t) for t in stops):
        raise ValueError(f"{where}: llm.decoding.extra.stop_token_ids must be a list of ids >= 0")
    return CallConstraint(grammar, tuple(stops), budget)


class MaskInterner:
    """Distinct bitmasks [W] int32 in first-seen order; `add` returns a mask's index."""

    def __init__(self, words: int):
        self.words = words
        self._index: dict[bytes, int] = {}
        self._masks: list[np.ndarray] = []

    def add(self, mask: np.ndarray) -> int:
        key = mask.tobytes()
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self._masks)
            self._masks.append(mask)
        return index

    def table(self) -> np.ndarray:
        """[M, W] int32."""
        return np.asarray(self._masks, np.int32).reshape(len(self._masks), self.words)


class CallMasks(NamedTuple):
    """The masks of one call's N output tokens: `forced [N] bool` (one allowed id),
    `index [N] int32` (row of `table` holding the token's mask, -1 on forced and free tokens)
    and `table [M, W] int32` (the call's distinct masks of more than one id)."""

    forced: np.ndarray
    index: np.ndarray
    table: np.ndarray


def allowed_count(mask: np.ndarray, vocab: int | None = None) -> int:
    """Ids below `vocab` (None: all) a bitmask [W] int32 allows."""
    return int(np.unpackbits(mask.view(np.uint8), bitorder="little")[:vocab].sum())


def allows(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def collect_masks(
    steps: Iterable[tuple[int, np.ndarray | None]], n: int, vocab: int, where: str, source: str
) -> CallMasks:
    """`CallMasks` of a call's `n` output tokens from `(token, mask applied before it or
    None)` per token, in order. A mask allowing nothing allows every id (the sampler's rule),
    so it is free. Raises `ConstraintReplayError` naming `where` and `source` (what the masks
    come from) at the first token outside its mask."""
    interner = MaskInterner((vocab + 31) // 32)
    forced, index = np.zeros(n, bool), np.full(n, -1, np.int32)
    for i, (token, mask) in enumerate(steps):
        if mask is None:
            continue
        if not 0 <= token < vocab or not allows(mask, token):
            raise ConstraintReplayError(
                f"{where}: output token {i} (id {token}) is outside the mask of the recorded "
                f"{source} (a {source}, tokenizer or vocabulary other than the served ones?)"
            )
        count = allowed_count(mask, vocab)
        if count == 1:
            forced[i] = True
        elif count:
            index[i] = interner.add(mask)
    return CallMasks(forced, index, interner.table())


def merge_into(interner: MaskInterner, call: CallMasks) -> np.ndarray:
    """The call's `index` [N] re-pointed into `interner` (adding its masks); -1 stays -1."""
    remap = np.asarray([interner.add(mask) for mask in call.table] + [-1], np.int32)
    return remap[call.index]  # index -1 picks the trailing -1


def bucket_masks(count: int) -> int:
    """A table size for `count` distinct masks: the next power of two (at least 1)."""
    return 1 << max(count - 1, 0).bit_length()


def pack_masks(
    rows: Sequence[tuple[np.ndarray, np.ndarray] | None], num_rows: int, seq_len: int, words: int
) -> dict[str, np.ndarray]:
    """`MASK_KEYS` of a batch from each row's `(mask_index [L], mask_table [M_r, W])` (None:
    no masked token), rows placed in order from row 0: `mask_index [R, T]` (-1 padding) and
    `mask_table [R, bucket_masks(max M_r), W]` (zero padding)."""
    most = max((row[1].shape[0] for row in rows if row is not None), default=0)
    index = np.full((num_rows, seq_len), -1, np.int32)
    table = np.zeros((num_rows, bucket_masks(most), words), np.int32)
    for r, row in enumerate(rows):
        if row is not None:
            index[r, : row[0].shape[0]] = row[0]
            table[r, : row[1].shape[0]] = row[1]
    return {"mask_index": index, "mask_table": table}
