"""Packed rows: the backbone runs on a batch's real tokens only, several rows to a packed row.

A loader batch is `[R, T]` with one LLM call (windowed) or one trajectory (concat) per row,
left-aligned and padded to T. In an RL batch of the tiny ALFWorld preset about half of the
positions are padding (prompts of 100-200 tokens in rows of 224) and whole rows are empty (a
version's episodes fill 60-90 of 128 rows), yet the transformer computes every position.

Packing places the rows' real tokens one after another in `R_p` packed rows of `T_p` positions
(first-fit decreasing), each row a segment of its own: tokens attend only within their segment
(`segment_ids`) and positions restart with it, so every token sees exactly the context it had
in its own row. Only the backbone runs on the packed grid; its outputs are read back in the
batch's own `[R, T]` coordinates (`gather_hidden`, `unpack`), so losses, advantages and metrics
are computed exactly as without packing (same values up to float summation order).

This is verl's "remove padding" / MaxText's packing with segment ids, with the unpacking map kept
next to the batch instead of packing the loader's rows themselves: the advantage math, which
links a trajectory's rows in turn order, never sees the packed layout.

Host side (numpy): `plan_packing` and `pack_batch` build the `PACK_KEYS` arrays. Device side
(traced): `packed_inputs`, `gather_hidden`, `unpack`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:
    from sao_jax.train.steps import Placement

PACK_KEYS = ("packed_tokens", "packed_positions", "packed_segment_ids", "pack_row", "pack_offset")


def row_lengths(segment_ids: np.ndarray) -> np.ndarray:
    """[R] tokens each row must keep: up to and including its last non-padding token."""
    real = np.asarray(segment_ids) != 0
    last = real.shape[1] - np.argmax(real[:, ::-1], axis=1)
    return np.where(real.any(axis=1), last, 0).astype(np.int64)


def plan_packing(
    lengths: np.ndarray,
    packed_len: int,
    *,
    row_multiple: int = 1,
    min_rows: int = 0,
    geometric: bool = True,
) -> tuple[np.ndarray, np.ndarray, int]:
    """First-fit decreasing of rows of `lengths` into packed rows of `packed_len` positions.

    Args:
      lengths: [R] tokens of each row (0: an empty row, placed nowhere).
      packed_len: T_p, positions per packed row; every length must fit.
      row_multiple: the packed row count is rounded up to the next bucket of this multiple,
        `row_multiple` x {1, 2, 3, 4, 6, 8, 12, ...} (`bucket_rows`: each count is a compiled
        shape, so a run compiles two or three instead of one per batch, at most a third of
        the rows padding; a multiple of the row shards under a mesh).
      min_rows: at least this many packed rows (several processes agree on one count).
      geometric: False rounds the count up to a multiple of `row_multiple` only
        (`bucket_rows`).
    Returns:
      (pack_row [R] int32, pack_offset [R] int32, packed_rows): row r's tokens go to packed row
      `pack_row[r]` starting at column `pack_offset[r]`; empty rows get (0, 0).
    """
    lengths = np.asarray(lengths, np.int64)
    if row_multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {row_multiple}")
    if lengths.size and lengths.max() > packed_len:
        raise ValueError(
            f"plan_packing: a row of {int(lengths.max())} tokens does not fit packed rows of "
            f"{packed_len}"
        )
    pack_row = np.zeros(lengths.shape, np.int32)
    pack_offset = np.zeros(lengths.shape, np.int32)
    used: list[int] = []  # tokens placed in each packed row so far
    for r in np.argsort(-lengths, kind="stable"):
        n = int(lengths[r])
        if n == 0:
            break  # sorted: only empty rows follow
        bin_index = next(
            (i for i, filled in enumerate(used) if filled + n <= packed_len), len(used)
        )
        if bin_index == len(used):
            used.append(0)
        pack_row[r], pack_offset[r] = bin_index, used[bin_index]
        used[bin_index] += n
    count = max(len(used), min_rows, 1)
    return pack_row, pack_offset, bucket_rows(count, row_multiple, geometric=geometric)


def bucket_rows(count: int, multiple: int, *, geometric: bool = True) -> int:
    """The smallest of `multiple` x {1, 2, 3, 4, 6, 8, 12, 16, ...} (powers of two and 1.5x
    them) that holds `count`: few distinct shapes, at most a third of them padding. With
    `geometric=False`, the smallest multiple of `multiple` (for batches whose counts stay close
    together, such as cloning batches of a fixed number of turns)."""
    if multiple < 1:
        raise ValueError(f"row_multiple must be >= 1, got {multiple}")
    units = -(-count // multiple)
    if not geometric:
        return units * multiple
    power = 1
    while power < units:
        if power >= 2 and power * 3 // 2 >= units:
            return power * 3 // 2 * multiple
        power *= 2
    return power * multiple


def pack_batch(
    batch: Mapping[str, np.ndarray],
    *,
    packed_len: int | None = None,
    row_multiple: int = 1,
    min_rows: int = 0,
    pad_id: int = 0,
    geometric: bool = True,
) -> dict[str, np.ndarray]:
    """The `PACK_KEYS` arrays of a loader batch (`tokens`, `positions`, `segment_ids` [R, T]).

    Each row keeps its own positions and becomes its own segment(s): a row's segment s becomes
    segment `slot * (S + 1) + s` of its packed row (S the batch's largest segment id, slot the
    row's order in its packed row), so no two rows of a packed row share a segment.

    Returns `packed_tokens`, `packed_positions`, `packed_segment_ids` [R_p, T_p] int32 and
    `pack_row`, `pack_offset` [R] int32 (see `plan_packing`, also for `geometric`); T_p =
    `packed_len` (default T).
    """
    tokens = np.asarray(batch["tokens"])
    segment_ids = np.asarray(batch["segment_ids"])
    positions = np.asarray(batch["positions"])
    rows, length = tokens.shape
    packed_len = length if packed_len is None else packed_len
    lengths = row_lengths(segment_ids)
    pack_row, pack_offset, count = plan_packing(
        lengths, packed_len, row_multiple=row_multiple, min_rows=min_rows, geometric=geometric
    )
    packed_tokens = np.full((count, packed_len), pad_id, np.int32)
    packed_positions = np.zeros((count, packed_len), np.int32)
    packed_segments = np.zeros((count, packed_len), np.int32)
    stride = int(segment_ids.max(initial=0)) + 1
    slots = np.zeros(count, np.int64)
    for r in range(rows):
        n = int(lengths[r])
        if n == 0:
            continue
        p, start = pack_row[r], pack_offset[r]
        packed_tokens[p, start : start + n] = tokens[r, :n]
        packed_positions[p, start : start + n] = positions[r, :n]
        seg = segment_ids[r, :n]
        packed_segments[p, start : start + n] = np.where(seg > 0, slots[p] * stride + seg, 0)
        slots[p] += 1
    return {
        "packed_tokens": packed_tokens,
        "packed_positions": packed_positions,
        "packed_segment_ids": packed_segments,
        "pack_row": pack_row,
        "pack_offset": pack_offset,
    }


def packed_fraction(batch: Mapping[str, np.ndarray]) -> float:
    """Share of the packed grid's positions that hold real tokens (host side)."""
    segments = np.asarray(batch["packed_segment_ids"])
    return float((segments != 0).mean()) if segments.size else 0.0


def pack_for_placement(
    host: Mapping[str, np.ndarray],
    placement: Placement,
    row_multiple: int,
    *,
    packed_len: int | None = None,
    geometric: bool = True,
) -> dict[str, np.ndarray]:
    """`pack_batch` of this process's rows, shaped for `placement`: packed rows of
    `packed_len` positions (default: the batch's row length), their count a bucket
    (`bucket_rows`, `geometric` or not) of a multiple of `row_multiple` and of this process's
    row shards, the same on every process (an exchange with several); `pack_row` indexes the
    global packed grid."""
    processes = jax.process_count()
    multiple = math.lcm(row_multiple, max(1, placement.row_shards() // processes))
    lengths = row_lengths(host["segment_ids"])
    length = np.shape(host["tokens"])[1] if packed_len is None else packed_len
    _, _, count = plan_packing(lengths, length, row_multiple=multiple, geometric=geometric)
    if processes > 1:
        from sao_jax.distributed.host_sync import allgather_numbers

        count = int(allgather_numbers([count]).max())
    packed = pack_batch(
        host, packed_len=length, row_multiple=multiple, min_rows=count, geometric=geometric
    )
    if processes > 1:
        packed["pack_row"] = packed["pack_row"] + jax.process_index() * count
    return packed


def compact_rows(
    host: Mapping[str, np.ndarray], placement: Placement, row_multiple: int
) -> dict[str, np.ndarray]:
    """The batch without its empty rows, in their order, padded with empty rows to a bucket.

    A loader batch has room for more rows than a version's episodes fill (the tiny preset's
    12 episodes fill ~100-150 of 256); every per-row computation after the backbone -- the
    heads at the action tokens, GAE, the losses -- would run on them. `host` holds only [R, ...]
    arrays (the learner's batch keys); the row count becomes `bucket_rows` of the rows holding
    a token (a multiple of `row_multiple` and of this process's row shards, the same on every
    process), never more than R. `traj_index` is renumbered densely in its order (slots index
    per-trajectory sums of R + 1 segments, so they must stay below the new R).
    """
    rows = np.shape(host["segment_ids"])[0]
    processes = jax.process_count()
    multiple = math.lcm(row_multiple, max(1, placement.row_shards() // processes))
    filled = np.asarray(host["segment_ids"]).any(axis=1)
    count = min(rows, bucket_rows(max(int(filled.sum()), 1), multiple))
    if processes > 1:
        from sao_jax.distributed.host_sync import allgather_numbers

        count = int(allgather_numbers([count]).max())
    if count == rows:
        return dict(host)
    empty = np.flatnonzero(~filled)[: count - int(filled.sum())]
    keep = np.sort(np.concatenate([np.flatnonzero(filled), empty]))
    out = {key: np.asarray(value)[keep] for key, value in host.items()}
    traj = out["traj_index"]
    valid = traj >= 0
    dense = np.unique(traj[valid], return_inverse=True)[1] if valid.any() else traj[valid]
    out["traj_index"] = np.where(valid, 0, -1).astype(traj.dtype)
    out["traj_index"][valid] = dense
    return out


# -- device side --------------------------------------------------------------------------------


def is_packed(batch: Mapping[str, jax.Array]) -> bool:
    return "packed_tokens" in batch


def packed_inputs(batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(tokens, positions, segment_ids) the backbone runs on: the packed grid when the batch
    carries one, else the batch's own rows."""
    if is_packed(batch):
        return batch["packed_tokens"], batch["packed_positions"], batch["packed_segment_ids"]
    return batch["tokens"], batch["positions"], batch["segment_ids"]


def _flat_index(batch: Mapping[str, jax.Array], rows: jax.Array, columns: jax.Array) -> jax.Array:
    """Positions (`rows`, `columns`) of the batch's rows (same shape) -> indices into the
    flattened packed grid."""
    packed = batch["packed_tokens"]
    flat = batch["pack_row"][rows] * packed.shape[1] + batch["pack_offset"][rows] + columns
    return jnp.clip(flat, 0, packed.size - 1)


def gather_hidden(
    batch: Mapping[str, jax.Array], hidden: jax.Array, rows: jax.Array, columns: jax.Array
) -> jax.Array:
    """Backbone outputs [R_p, T_p, D] (or [R, T, D] unpacked) at positions (`rows`, `columns`)
    [G, N] of the batch's rows -> [G, N, D]. Line g of `rows` names rows of the g-th block of
    R / G consecutive rows only (G = R: each line one row), so an unpacked batch gathers block
    by block and a batch sharded over its rows needs no communication. Columns past a row's
    tokens read some other position: mask them."""
    if is_packed(batch):
        flat = hidden.reshape(-1, hidden.shape[-1])
        return jnp.take(flat, _flat_index(batch, rows, columns), axis=0)
    groups = rows.shape[0]
    num_rows, length = hidden.shape[:2]
    per_group = num_rows // groups
    blocks = hidden.reshape(groups, per_group * length, hidden.shape[-1])
    local = (rows % per_group) * length + columns
    return jax.vmap(lambda block, i: block[i])(blocks, local)


def unpack(batch: Mapping[str, jax.Array], packed: jax.Array) -> jax.Array:
    """Per-position results on the packed grid [R_p, T_p, ...] -> the batch's rows [R, T, ...]
    (positions past a row's tokens hold another position's value: mask them). Unpacked input
    is returned as it is."""
    if not is_packed(batch):
        return packed
    num_rows, length = batch["tokens"].shape
    rows = jnp.broadcast_to(jnp.arange(num_rows)[:, None], (num_rows, length))
    columns = jnp.broadcast_to(jnp.arange(length), (num_rows, length))
    flat = packed.reshape(-1, *packed.shape[2:])
    return jnp.take(flat, _flat_index(batch, rows, columns), axis=0)
