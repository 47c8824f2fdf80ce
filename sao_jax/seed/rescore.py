"""Skill-injected rows: the same sampled tokens, re-scored with a skill block in context.

Each row of a learner batch gets its trajectory's skill block placed before it, left-padded to
a fixed `max_skill_tokens` = S: row [R, T] -> [R, S + T] with the original tokens at columns
S.. S + T - 1 for every row. Padding columns have segment id 0 (attended by nothing), the block
takes positions 0..n-1 and the row's positions move up by n, so each row reads exactly
"block + row" and the action log-probs map back with the static slice `[:, S:]`. One jitted
forward of the policy over [R, S + T] scores the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from atdp_io.rows import SAMPLING_KEYS
from atdp_io.token_masks import MASK_KEYS

_SHIFTED_KEYS = ("tokens", "loss_mask", "rollout_logp", "rewards", "versions", "segment_ids")
# the decoding-transform keys (`SAMPLING_KEYS`, when the batch has them) shift too, so the
# teacher's log-probs are taken under the same transform as the student's; identity fill. So does
# a constrained call's `mask_index` (-1: no mask; its `mask_table` is per row, copied as is):
# the teacher scores the tokens under the same grammar mask as the student
_FILL = {"versions": -1, "sample_temperature": 1.0, "sample_top_p": 1.0, "mask_index": -1}


def fit_block(ids: list[int], max_skill_tokens: int) -> tuple[list[int], bool]:
    """A skill block within `max_skill_tokens` = S: a longer one keeps its first S - 2 and last
    2 tokens (the closing chat markers). Returns (ids, whether it was cut)."""
    if max_skill_tokens < 4:
        raise ValueError(f"max_skill_tokens must be >= 4, got {max_skill_tokens}")
    if len(ids) <= max_skill_tokens:
        return list(ids), False
    return [*ids[: max_skill_tokens - 2], *ids[-2:]], True


def skill_injected_batch(
    batch: Mapping[str, np.ndarray],
    block_ids: Mapping[int, list[int]],
    max_skill_tokens: int,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The batch with each trajectory's skill block in front of each of its rows.

    Args:
      batch: an `atdp_io` loader batch ([R, T] arrays, `traj_index` [R]).
      block_ids: token ids of the skill block per `traj_index` (rows of trajectories without
        one are only shifted).
      max_skill_tokens: S, the block budget; longer blocks are cut by `fit_block`, counted in
        `truncated`.
    Returns:
      (batch [R, S + T] with the same keys, stats: `truncated`, `block_tokens_mean`).
    """
    if max_skill_tokens < 4:
        raise ValueError(f"max_skill_tokens must be >= 4, got {max_skill_tokens}")
    tokens = np.asarray(batch["tokens"])
    rows, width, skill = tokens.shape[0], tokens.shape[1], max_skill_tokens
    out = {}
    extra = [k for k in (*SAMPLING_KEYS, MASK_KEYS[0]) if k in batch]
    for key in (*_SHIFTED_KEYS, *extra):
        value = np.asarray(batch[key])
        shifted = np.full((rows, skill + width), _FILL.get(key, 0), value.dtype)
        shifted[:, skill:] = value
        out[key] = shifted
    positions = np.zeros((rows, skill + width), np.int32)
    positions[:, skill:] = np.asarray(batch["positions"])
    if MASK_KEYS[1] in batch:
        out[MASK_KEYS[1]] = np.asarray(batch[MASK_KEYS[1]]).copy()
    out["traj_index"] = np.asarray(batch["traj_index"]).copy()
    out["turn_index"] = np.asarray(batch["turn_index"]).copy()
    truncated, lengths = 0, []
    segment = np.asarray(batch["segment_ids"])
    for r, k in enumerate(out["traj_index"]):
        ids = block_ids.get(int(k))
        if ids is None or not np.any(segment[r] > 0):
            continue
        ids, cut = fit_block(ids, skill)
        truncated += cut
        n = len(ids)
        out["tokens"][r, skill - n : skill] = ids
        out["segment_ids"][r, skill - n : skill] = 1
        positions[r, skill - n : skill] = np.arange(n)
        positions[r, skill:] += n
        lengths.append(n)
    out["positions"] = positions
    stats = {
        "truncated": float(truncated),
        "block_tokens_mean": float(np.mean(lengths)) if lengths else 0.0,
    }
    return out, stats


def skill_logprobs(
    logprobs_fn: Callable[[Mapping[str, np.ndarray]], np.ndarray],
    batch: Mapping[str, np.ndarray],
    block_ids: Mapping[int, list[int]],
    max_skill_tokens: int,
) -> tuple[np.ndarray, dict[str, float]]:
    """skill_logp [R, T]: log pi(token t | skill block + tokens < t), aligned with the batch.

    `logprobs_fn` maps a batch to [R, T'] shifted log-probs (`Learner.policy_logprobs`).
    """
    injected, stats = skill_injected_batch(batch, block_ids, max_skill_tokens)
    logp = np.asarray(logprobs_fn(injected))[:, max_skill_tokens:]
    mask = np.asarray(batch["loss_mask"]) > 0
    return np.where(mask, logp, 0.0).astype(np.float32), stats


def skill_top_logprobs(
    top_logprobs_fn: Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    batch: Mapping[str, np.ndarray],
    block_ids: Mapping[int, list[int]],
    max_skill_tokens: int,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The teacher's view of each action token with the skill in context, in one forward.

    `top_logprobs_fn` maps a batch to `logp` [R, T'] and `top_ids` / `top_logp` [R, T', k]
    (`Learner.policy_top_logprobs`). Returns `skill_logp` [R, T] (as `skill_logprobs`),
    `skill_top_ids` / `skill_top_logp` [R, T, k] (the k most likely tokens of the distribution
    predicting each action token, and their log-probs), all aligned with the batch and 0 off
    its action tokens, plus the injection's stats.
    """
    injected, stats = skill_injected_batch(batch, block_ids, max_skill_tokens)
    out = top_logprobs_fn(injected)
    mask = np.asarray(batch["loss_mask"]) > 0
    logp, ids, top = (
        np.asarray(out[k])[:, max_skill_tokens:] for k in ("logp", "top_ids", "top_logp")
    )
    return {
        "skill_logp": np.where(mask, logp, 0.0).astype(np.float32),
        "skill_top_ids": np.where(mask[..., None], ids, 0).astype(np.int32),
        "skill_top_logp": np.where(mask[..., None], top, 0.0).astype(np.float32),
    }, stats
