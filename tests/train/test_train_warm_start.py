"""Behaviour cloning: NLL of demonstrated action tokens goes down; running out of data is named."""

import numpy as np
import pytest
from flax import nnx
from train_factories import episode, loader, tiny_policy, write_store

from atdp_io.loader import LoaderStarvedError
from sao_jax.train import BehaviourCloner, OptimizerConfig
from sao_jax.train.partition import path_string

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
