"""Training rows from a trajectory, and fixed-shape batches from rows. Pure numpy, no I/O.

Layouts:
- `concat`: a trajectory's LLM calls merged into one row, valid when each call's input starts
  with the previous call's input + output (a growing multi-turn context). Tokens are the last
  call's input + output; every call's output tokens sit where that call generated them.
- `windowed`: one row per LLM call (its input + output), for harnesses that rebuild the prompt
  each turn (history windows, summaries).

Behaviour log-probs (`rollout_logp`): a call's `decoding.extra["sampled_logprobs"]` (under the
distribution actually sampled) when recorded, else its temperature-1 `output_logprobs`; a call
that recorded them under a transform (temperature, top-k, top-p) also carries that transform
per token (`SAMPLING_KEYS`), so the learner can take its log-probs the same way. A call
sampled under a token mask (`decoding.extra["grammar"]`: forced tool calls and JSON output;
`decoding.extra["think_budget"]`) carries its masks once `atdp_io.mask_replay.MaskReplay`
rebuilt them (`LLMTurn.masks`): its forced tokens leave the loss mask, the others carry their
mask (`atdp_io.token_masks`).

Rewards land on the last output token of the LLM call they belong to: an event's own rewards and
late rewards go to the nearest LLM call at or before the event they point at (late rewards for
the whole trajectory go to its last call); rewards with no LLM call before them are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from atdp_io.schema import DecodingParams, LateReward, Reward, Trajectory
from atdp_io.token_masks import (
    CallConstraint,
    CallMasks,
    MaskInterner,
    call_constraint,
    merge_into,
    pack_masks,
)

LAYOUTS = ("concat", "windowed")
# Batch keys present only when some row's tokens were sampled under a decoding transform.
SAMPLING_KEYS = ("sample_temperature", "sample_top_k", "sample_top_p")


class LayoutError(ValueError):
    """A trajectory cannot be laid out as asked (e.g. `concat` on a non-extending context)."""


class Sampling(NamedTuple):
    """The decoding transform an LLM call's tokens were drawn under (top_k 0 / top_p 1: off;
    temperature 0: greedy)."""

    temperature: float
    top_k: int
    top_p: float


class LLMTurn(NamedTuple):
    """The token streams of one LLM call (shapes as in `schema.LLMCall`).

    `behaviour_logprobs [N]`: log-probs under the distribution actually sampled (the call's
    `decoding.extra["sampled_logprobs"]`), None when not recorded (then `output_logprobs`, at
    temperature 1, are the behaviour). `sampling`: the transform those behaviour log-probs are
    under, None for the plain temperature-1 distribution. `constraint`: the grammar or
    thinking budget the call was sampled under (with recorded behaviour log-probs only), None
    when free; `masks`: its masks, once rebuilt (`atdp_io.mask_replay`).
    """

    event_index: int
    input_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    output_versions: np.ndarray
    loss_mask: np.ndarray
    behaviour_logprobs: np.ndarray | None = None
    sampling: Sampling | None = None
    constraint: CallConstraint | None = None
    masks: CallMasks | None = None

    @property
    def context_ids(self) -> np.ndarray:
        return np.concatenate([self.input_ids, self.output_ids])


def call_sampling(
    decoding: DecodingParams, n_out: int, where: str
) -> tuple[np.ndarray | None, Sampling | None]:
    """(behaviour_logprobs [N] or None, Sampling or None) of one LLM call's `decoding`.

    The transform applies only with recorded `sampled_logprobs`: without them the behaviour
    log-probs are `output_logprobs`, at temperature 1, and the learner must compare at
    temperature 1 too. Raises ValueError naming `where` on malformed `sampled_logprobs`.
    """
    raw = decoding.extra.get("sampled_logprobs")
    if raw is None:
        return None, None
    try:
        sampled = np.asarray(raw, np.float32)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: llm.decoding.extra.sampled_logprobs is not numeric") from err
    if sampled.shape != (n_out,):
        raise ValueError(
            f"{where}: llm.decoding.extra.sampled_logprobs has shape {sampled.shape}, "
            f"expected ({n_out},) like output_ids"
        )
    if n_out and not (np.all(np.isfinite(sampled)) and sampled.max() <= 1e-4):
        raise ValueError(f"{where}: llm.decoding.extra.sampled_logprobs must be finite and <= 0")
    transform = Sampling(float(decoding.temperature), int(decoding.top_k), float(decoding.top_p))
    return sampled, (None if transform == (1.0, 0, 1.0) else transform)


def sampled_call(turn: LLMTurn, decoding: DecodingParams, where: str) -> LLMTurn:
    """`turn` with its call's behaviour log-probs, decoding transform and token-mask source
    (grammar, thinking budget), as recorded in `decoding` (see `call_sampling`). A mask counts
    only with recorded behaviour log-probs: without them the behaviour is the unmasked
    temperature-1 distribution."""
    behaviour, sampling = call_sampling(decoding, turn.output_ids.shape[0], where)
    constraint = None if behaviour is None else call_constraint(decoding.extra, where)
    return turn._replace(behaviour_logprobs=behaviour, sampling=sampling, constraint=constraint)


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingView:
    """What training needs of a trajectory: its LLM calls and every reward, late ones included.

    `rewards` holds `(event_index, reward)`; event_index None means the whole trajectory.
    The reader builds it straight from storage, without decoding full event records.
    """

    trajectory_id: str
    turns: tuple[LLMTurn, ...]
    rewards: tuple[tuple[int | None, Reward], ...]
    extends: bool | None = None  # known to satisfy `extends_previous` (None: not checked yet)


def training_view(trajectory: Trajectory) -> TrainingView:
    turns = tuple(
        sampled_call(
            LLMTurn(
                i,
                e.llm.input_ids,
                e.llm.output_ids,
                e.llm.output_logprobs,
                e.llm.output_versions,
                e.llm.loss_mask,
            ),
            e.llm.decoding,
            f"trajectory {trajectory.trajectory_id!r} event {i}",
        )
        for i, e in trajectory.llm_events()
    )
    rewards = [(i, r) for i, e in enumerate(trajectory.events) for r in e.rewards]
    rewards += [
        (a.event_index, a.reward) for a in trajectory.annotations if isinstance(a, LateReward)
    ]
    return TrainingView(trajectory.trajectory_id, turns, tuple(rewards))


@dataclasses.dataclass(frozen=True, eq=False)
class Row:
    """One unpadded training row: every array `[L]`."""

    tokens: np.ndarray  # int32
    loss_mask: np.ndarray  # int32, 1 exactly on trainable output tokens
    rollout_logp: np.ndarray  # float32, 0 where loss_mask is 0
    rewards: np.ndarray  # float32
    versions: np.ndarray  # int32 policy version of each output token, -1 elsewhere
    turn_index: int  # LLM-call ordinal of the row's call (windowed) or 0 (concat)
    # The decoding transform of each token's call [L] (1 / 0 / 1 elsewhere: the identity),
    # None when no token of the row was sampled under one.
    sample_temperature: np.ndarray | None = None  # float32
    sample_top_k: np.ndarray | None = None  # int32
    sample_top_p: np.ndarray | None = None  # float32
    # Token masks (`atdp_io.token_masks`): each token's row of `mask_table` [M, W] int32
    # (-1: unmasked) [L] int32; both None when no token of the row is masked.
    mask_index: np.ndarray | None = None
    mask_table: np.ndarray | None = None

    @property
    def length(self) -> int:
        return self.tokens.shape[0]

    def min_version(self) -> int:
        """Smallest policy version among the row's output tokens (-1 when it has none)."""
        output = self.versions[self.versions >= 0]
        return int(output.min()) if output.size else -1


def reward_per_call(
    trajectory: Trajectory | TrainingView, weights: Mapping[str, float] | None = None
) -> dict[int, float]:
    """Total reward credited to each LLM call, keyed by the call's event index.

    `weights` scales rewards by source (sources missing from it are ignored); None sums all.
    """
    view = _as_view(trajectory)
    llm_indices = [turn.event_index for turn in view.turns]
    totals = dict.fromkeys(llm_indices, 0.0)
    if not llm_indices:
        return totals

    def credit(event_index: int | None, reward: Reward) -> None:
        weight = 1.0 if weights is None else weights.get(reward.source)
        if not weight:
            return
        if event_index is None:
            target = llm_indices[-1]
        else:
            preceding = [i for i in llm_indices if i <= event_index]
            if not preceding:
                return
            target = preceding[-1]
        totals[target] += weight * reward.value

    for event_index, reward in view.rewards:
        credit(event_index, reward)
    return totals


def extends_previous(trajectory: Trajectory | TrainingView) -> bool:
    """True when every LLM call's input starts with the previous call's input + output."""
    previous = None
    for turn in _as_view(trajectory).turns:
        ids = turn.input_ids
        if previous is not None and not (
            ids.shape[0] >= previous.shape[0] and np.array_equal(ids[: previous.shape[0]], previous)
        ):
            return False
        previous = turn.context_ids
    return True


def _as_view(trajectory: Trajectory | TrainingView) -> TrainingView:
    return trajectory if isinstance(trajectory, TrainingView) else training_view(trajectory)


def trajectory_rows(
    trajectory: Trajectory | TrainingView,
    layout: str,
    *,
    reward_weights: Mapping[str, float] | None = None,
    concat_fallback: str = "windowed",
) -> tuple[list[Row], bool]:
    """Rows of one trajectory and whether `concat` fell back to `windowed`.

    `concat_fallback`: "windowed" lays out a non-extending trajectory one row per call;
    "error" raises `LayoutError` naming the trajectory.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    view = _as_view(trajectory)
    if not view.turns:
        return [], False
    rewards = reward_per_call(view, reward_weights)
    if layout == "concat":
        if view.extends if view.extends is not None else extends_previous(view):
            return [_concat_row(view, rewards)], False
        if concat_fallback == "error":
            raise LayoutError(
                f"trajectory {trajectory.trajectory_id!r}: an LLM call's input does not extend "
                "the previous input + output; use layout='windowed'"
            )
        if concat_fallback != "windowed":
            raise ValueError(
                f"concat_fallback must be 'windowed' or 'error', not {concat_fallback!r}"
            )
    rows = []
    for ordinal, turn in enumerate(view.turns):
        row = _empty_row(turn.context_ids, ordinal)
        start, reward = turn.input_ids.shape[0], rewards[turn.event_index]
        rows.append(_place_output(row, start, turn, reward, _where(view, turn)))
    return rows, layout == "concat"


def _empty_row(tokens: np.ndarray, turn: int) -> Row:
    n = tokens.shape[0]
    return Row(
        tokens=tokens.astype(np.int32),
        loss_mask=np.zeros(n, np.int32),
        rollout_logp=np.zeros(n, np.float32),
        rewards=np.zeros(n, np.float32),
        versions=np.full(n, -1, np.int32),
        turn_index=turn,
    )


def _place_output(row: Row, start: int, turn: LLMTurn, reward: float, where: str) -> Row:
    """Writes the call's output into `row` (in place); returns the row, replaced by a copy that
    carries sampling (and mask) arrays when this call is the first of the row with a transform
    (a token mask). Forced tokens leave the loss mask (`atdp_io.token_masks`)."""
    end = start + turn.output_ids.shape[0]
    loss_mask = turn.loss_mask
    if turn.constraint is not None:
        if turn.masks is None:
            raise ValueError(
                f"{where}: the call was sampled under a token mask (decoding.extra.grammar or "
                "think_budget); rebuild its masks first (atdp_io.mask_replay.MaskReplay; the loader: "
                "AtdpLoader(mask_replay=...)) so it trains with the masked ratio"
            )
        loss_mask = np.where(turn.masks.forced, 0, loss_mask).astype(loss_mask.dtype)
        if turn.masks.table.shape[0]:
            row = _place_masks(row, start, turn.masks)
    needs_sampling = turn.sampling is not None or row.mask_index is not None
    if needs_sampling and row.sample_temperature is None:
        n = row.length
        row = dataclasses.replace(
            row,
            sample_temperature=np.ones(n, np.float32),
            sample_top_k=np.zeros(n, np.int32),
            sample_top_p=np.ones(n, np.float32),
        )
    if turn.sampling is not None:
        row.sample_temperature[start:end] = turn.sampling.temperature
        row.sample_top_k[start:end] = turn.sampling.top_k
        row.sample_top_p[start:end] = turn.sampling.top_p
    behaviour = turn.output_logprobs if turn.behaviour_logprobs is None else turn.behaviour_logprobs
    row.loss_mask[start:end] = loss_mask
    row.rollout_logp[start:end] = np.where(loss_mask > 0, behaviour, 0.0)
    row.versions[start:end] = turn.output_versions
    # An empty output (the call produced nothing) keeps its reward on the last context token.
    row.rewards[max(end - 1, 0)] += reward
    return row


def _place_masks(row: Row, start: int, masks: CallMasks) -> Row:
    """A copy of `row` whose mask table also holds the call's masks (each distinct mask once),
    with the call's tokens from `start` pointing into it."""
    interner = MaskInterner(masks.table.shape[1])
    for mask in () if row.mask_table is None else row.mask_table:
        interner.add(mask)  # same order: the row's indices stay valid
    index = np.full(row.length, -1, np.int32) if row.mask_index is None else row.mask_index
    index[start : start + masks.index.shape[0]] = merge_into(interner, masks)
    return dataclasses.replace(row, mask_index=index, mask_table=interner.table())


def _where(view: TrainingView, turn: LLMTurn) -> str:
    return f"trajectory {view.trajectory_id!r} event {turn.event_index}"


def _concat_row(view: TrainingView, rewards: dict[int, float]) -> Row:
    row = _empty_row(view.turns[-1].context_ids, 0)
    for turn in view.turns:
        start = turn.input_ids.shape[0]
        row = _place_output(row, start, turn, rewards[turn.event_index], _where(view, turn))
    return row


def pack_batch(
    groups: Sequence[Sequence[Row]], rows: int, seq_len: int, pad_id: int = 0
) -> dict[str, np.ndarray]:
    """Pads rows into one fixed-shape batch; `groups[k]` are the rows of trajectory k.

    Returns `tokens [R, T] int32`, `loss_mask [R, T] int32`, `rollout_logp [R, T] float32`,
    `rewards [R, T] float32`, `versions [R, T] int32`, `positions [R, T] int32`,
    `segment_ids [R, T] int32` (1 on real tokens, 0 on padding), `traj_index [R] int32` (k, the
    trajectory's slot in this batch) and `turn_index [R] int32`; both -1 on padding rows.
    When some row carries a decoding transform, also `sample_temperature [R, T] float32`,
    `sample_top_k [R, T] int32` and `sample_top_p [R, T] float32` (`SAMPLING_KEYS`; the identity
    1 / 0 / 1 elsewhere); otherwise the batch is exactly as without them. When some row holds
    a masked token, also `MASK_KEYS`: `mask_index [R, T] int32` and `mask_table [R, M, W]
    int32` (`atdp_io.token_masks.pack_masks`; such a row always carries the sampling keys).
    """
    total = sum(len(g) for g in groups)
    if total > rows:
        raise ValueError(f"pack_batch: {total} rows do not fit a batch of {rows}")
    batch = {
        "tokens": np.full((rows, seq_len), pad_id, np.int32),
        "loss_mask": np.zeros((rows, seq_len), np.int32),
        "rollout_logp": np.zeros((rows, seq_len), np.float32),
        "rewards": np.zeros((rows, seq_len), np.float32),
        "versions": np.full((rows, seq_len), -1, np.int32),
        "positions": np.zeros((rows, seq_len), np.int32),
        "segment_ids": np.zeros((rows, seq_len), np.int32),
        "traj_index": np.full(rows, -1, np.int32),
        "turn_index": np.full(rows, -1, np.int32),
    }
    sampled = any(row.sample_temperature is not None for group in groups for row in group)
    if sampled:
        batch["sample_temperature"] = np.ones((rows, seq_len), np.float32)
        batch["sample_top_k"] = np.zeros((rows, seq_len), np.int32)
        batch["sample_top_p"] = np.ones((rows, seq_len), np.float32)
    r = 0
    for k, group in enumerate(groups):
        for row in group:
            n = row.length
            if n > seq_len:
                raise ValueError(f"pack_batch: a row of {n} tokens exceeds seq_len {seq_len}")
            batch["tokens"][r, :n] = row.tokens
            batch["loss_mask"][r, :n] = row.loss_mask
            batch["rollout_logp"][r, :n] = row.rollout_logp
            batch["rewards"][r, :n] = row.rewards
            batch["versions"][r, :n] = row.versions
            batch["positions"][r, :n] = np.arange(n, dtype=np.int32)
            batch["segment_ids"][r, :n] = 1
            batch["traj_index"][r] = k
            batch["turn_index"][r] = row.turn_index
            if row.sample_temperature is not None:
                batch["sample_temperature"][r, :n] = row.sample_temperature
                batch["sample_top_k"][r, :n] = row.sample_top_k
                batch["sample_top_p"][r, :n] = row.sample_top_p
            r += 1
    masked = [(row.mask_index, row.mask_table) for g in groups for row in g]
    tables = [table for _, table in masked if table is not None]
    if tables:
        packed = [None if index is None else (index, table) for index, table in masked]
        batch.update(pack_masks(packed, rows, seq_len, tables[0].shape[1]))
    return batch
