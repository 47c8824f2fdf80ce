"""Behaviour cloning: NLL of demonstrated action tokens goes down; running out of data is named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_factories import VOCAB, episode, loader, tiny_policy, write_store

from atdp_io.loader import LoaderStarvedError
from sao_jax.train import BehaviourCloner, OptimizerConfig
from sao_jax.train.partition import path_string
from sao_jax.train.steps import learning_rate_schedule
from sao_jax.train.warm_start import imitation_counts

OPTIMIZER = OptimizerConfig(learning_rate=1e-2)
TRAINABLE = (r"(^|/)(moe|embed|final_norm)",)


def test_cloning_fits_the_demonstrated_actions_only(tmp_path):
    store = write_store(tmp_path, [episode(f"d{i}", seed=i, concat=False) for i in range(4)])
    batches = iter(loader(store, rows=12, seq_len=32, layout="windowed").epoch(num_epochs=None))
    policy = tiny_policy()
    frozen_before = {
        path_string(p): np.asarray(v.get_value())
        for p, v in nnx.to_flat_state(nnx.state(policy, nnx.Param))
        if "attn" in path_string(p)
    }
    cloner = BehaviourCloner(policy, OPTIMIZER, trainable=TRAINABLE)
    first = cloner.step(next(batches))
    seen = []
    last = cloner.run(batches, 30, lambda step, m: seen.append(step))
    assert seen == list(range(1, 31)) and cloner.steps == 31
    assert last["nll"] < 0.6 * first["nll"]  # the 4 episodes' replies are being memorised
    assert last["num_tokens"] == 4 * 3 * 3  # every demonstrated output token, nothing else
    after = nnx.state(cloner.policy_module(), nnx.Param)
    for path, variable in nnx.to_flat_state(after):
        name = path_string(path)
        if name in frozen_before:  # attention was not in the trainable patterns
            np.testing.assert_array_equal(variable.get_value(), frozen_before[name])


def test_running_out_of_demonstrations_is_an_error_naming_the_fix(tmp_path):
    store = write_store(tmp_path, [episode("d0", seed=0)])
    batches = iter(loader(store, rows=12, seq_len=32, layout="windowed").epoch(num_epochs=1))
    cloner = BehaviourCloner(tiny_policy(), OPTIMIZER, trainable=TRAINABLE)  # compiled above
    with pytest.raises(
        ValueError, match=r"ran out of demonstration batches after 1 of 3.*num_epochs=None"
    ):
        cloner.run(batches, 3)


@pytest.mark.timeout(60)
def test_demonstrations_longer_than_every_row_stop_cloning_with_an_error(tmp_path):
    # the rollout.history_length=2 stall: every demonstrated row is longer than seq_len
    store = write_store(tmp_path, [episode(f"d{i}", seed=i, concat=False) for i in range(3)])
    cloner = BehaviourCloner(tiny_policy(), OPTIMIZER, trainable=TRAINABLE)
    repeated = loader(store, rows=12, seq_len=8, layout="windowed").epoch(num_epochs=None)
    with pytest.raises(LoaderStarvedError, match=r"12 x 8 batch.*raise seq_len to at least"):
        cloner.run(iter(repeated), 3)
    once = loader(store, rows=12, seq_len=8, layout="windowed").epoch(num_epochs=1)
    with pytest.raises(ValueError, match=r"after 0 of 3 steps \(none at all.*seq_len"):
        cloner.run(iter(once), 3)
    assert cloner.steps == 0


def _reference_counts(policy, batch):
    """imitation_counts recomputed in numpy from the model's full logits."""
    logits = np.asarray(policy(batch["tokens"], positions=batch["positions"]))
    tokens, mask = batch["tokens"], batch["loss_mask"].astype(bool).copy()
    mask[:, 0] = False
    predicted = np.zeros_like(tokens)
    predicted[:, 1:] = logits[:, :-1].argmax(-1)
    log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    logp = np.zeros(tokens.shape)
    logp[:, 1:] = (
        np.take_along_axis(logits[:, :-1], tokens[:, 1:, None], -1)[..., 0] - log_z[:, :-1]
    )
    replies = wrong = 0
    for r in range(tokens.shape[0]):
        t = 0
        while t < tokens.shape[1]:
            if mask[r, t]:
                end = t
                while end < tokens.shape[1] and mask[r, end]:
                    end += 1
                replies += 1
                wrong += int((predicted[r, t:end] != tokens[r, t:end]).any())
                t = end
            else:
                t += 1
    correct = ((predicted == tokens) & mask).sum()
    return {
        "nll_sum": -logp[mask].sum(),
        "correct_tokens": correct,
        "action_tokens": mask.sum(),
        "replies": replies,
        "wrong_replies": wrong,
    }


def _batch(rng, rows=5, length=24):
    tokens = rng.integers(3, VOCAB, (rows, length)).astype(np.int32)
    mask = np.zeros((rows, length), np.int32)
    mask[0, 5:8] = 1  # one reply
    mask[1, 3:6] = mask[1, 9:14] = mask[1, 20:24] = 1  # three replies in a concat row
    mask[2, 0:4] = 1  # column 0 predicts nothing: a reply of tokens 1..3
    mask[4, 10:11] = 1  # row 3 has no action token
    return {
        "tokens": tokens,
        "loss_mask": mask,
        "positions": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
        "segment_ids": np.ones((rows, length), np.int32),
    }


def test_imitation_counts_match_a_reference_over_replies_of_every_layout():
    policy = tiny_policy()
    batch = _batch(np.random.default_rng(0))
    counts = jax.device_get(imitation_counts(policy, {k: jnp.asarray(v) for k, v in batch.items()}))
    reference = _reference_counts(policy, batch)
    assert reference["replies"] == 6 and reference["action_tokens"] == 3 + 12 + 3 + 1
    for key in ("correct_tokens", "action_tokens", "replies", "wrong_replies"):
        assert int(counts[key]) == int(reference[key]), key
    np.testing.assert_allclose(float(counts["nll_sum"]), reference["nll_sum"], rtol=1e-4)


def test_held_out_imitation_rises_to_exact_replies_when_cloning_memorises_them(tmp_path):
    store = write_store(tmp_path, [episode(f"d{i}", seed=i, concat=False) for i in range(2)])
    data = loader(store, rows=12, seq_len=32, layout="windowed")
    batches = iter(data.epoch(num_epochs=None))
    evaluation = [dict(b) for b in data.epoch(shuffle=False, num_epochs=1)]
    cloner = BehaviourCloner(tiny_policy(), OptimizerConfig(learning_rate=3e-2))
    before = cloner.evaluate(evaluation)
    assert before["replies"] == 2 * 3 and before["action_accuracy"] < 0.5
    cloner.run(batches, 150)  # 60 was on the edge of memorising on some CPUs (0.94 tokens)
    after = cloner.evaluate(evaluation)
    assert after["nll"] < 0.2 * before["nll"]
    assert after["token_accuracy"] == 1.0 and after["action_accuracy"] == 1.0
    empty = {k: np.zeros_like(v) for k, v in evaluation[0].items()}
    with pytest.raises(ValueError, match="no action token"):
        cloner.evaluate([empty])


def test_the_rate_warms_up_then_follows_a_cosine_to_its_final_fraction():
    config = OptimizerConfig(
        learning_rate=2.0, warmup_steps=10, decay_steps=100, final_fraction=0.1
    )
    rate = learning_rate_schedule(config)
    assert float(rate(0)) == 0.0 and float(rate(5)) == pytest.approx(1.0)
    assert float(rate(10)) == pytest.approx(2.0)
    assert float(rate(60)) == pytest.approx(1.1, rel=1e-5)  # half way down the cosine
    assert float(rate(110)) == float(rate(500)) == pytest.approx(0.2)
    assert learning_rate_schedule(OptimizerConfig(learning_rate=2.0)) == 2.0
    with pytest.raises(ValueError, match="final_fraction"):
        OptimizerConfig(final_fraction=1.5)
    with pytest.raises(ValueError, match="decay_steps"):
        OptimizerConfig(decay_steps=-1)
