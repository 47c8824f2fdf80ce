"""SEED's skill-injected batch keeps each action token's decoding transform in place, so the
teacher's log-probs are taken under the same transform as the student's."""

import numpy as np

from atdp_io.rows import SAMPLING_KEYS
from sao_jax.seed.rescore import skill_injected_batch


def _sampled_batch():
    """One row of 6 tokens whose last 3 were sampled at temperature 0.7, top-k 5."""
    tokens = np.asarray([[3, 4, 5, 6, 7, 8], [0] * 6], np.int32)
    loss_mask = np.asarray([[0, 0, 0, 1, 1, 1], [0] * 6], np.int32)
    batch = {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "rollout_logp": -0.5 * loss_mask.astype(np.float32),
        "rewards": np.zeros((2, 6), np.float32),
        "versions": np.where(loss_mask > 0, 0, -1).astype(np.int32),
        "positions": np.asarray([np.arange(6), np.zeros(6)], np.int32),
        "segment_ids": np.asarray([[1] * 6, [0] * 6], np.int32),
        "traj_index": np.asarray([0, -1], np.int32),
        "turn_index": np.asarray([0, -1], np.int32),
        "sample_temperature": np.where(loss_mask > 0, 0.7, 1.0).astype(np.float32),
        "sample_top_k": np.where(loss_mask > 0, 5, 0).astype(np.int32),
        "sample_top_p": np.ones((2, 6), np.float32),
    }
    return batch


def test_sampling_keys_shift_with_the_tokens_and_fill_with_the_identity():
    batch = _sampled_batch()
    out, _ = skill_injected_batch(batch, {0: [7, 8, 9, 10, 11]}, 8)
    for key in SAMPLING_KEYS:
        np.testing.assert_array_equal(out[key][:, 8:], batch[key])
    np.testing.assert_array_equal(out["sample_temperature"][:, :8], 1.0)
    np.testing.assert_array_equal(out["sample_top_k"][:, :8], 0)
    np.testing.assert_array_equal(out["sample_top_p"][:, :8], 1.0)
    action = out["loss_mask"] > 0
    np.testing.assert_allclose(out["sample_temperature"][action], 0.7)
    np.testing.assert_array_equal(out["sample_top_k"][action], 5)
    plain = {k: v for k, v in batch.items() if k not in SAMPLING_KEYS}
    assert not set(SAMPLING_KEYS) & set(skill_injected_batch(plain, {}, 8)[0])
