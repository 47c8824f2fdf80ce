"""A loader that can only drop what it reads says so (`LoaderStarvedError`) instead of spinning:
a repeated epoch that keeps nothing would loop forever, a stream would wait forever."""

import dataclasses

import grain
import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import AtdpStore, Governance
from atdp_io.loader import AtdpLoader, LoaderConfig, LoaderStarvedError

ONE_SHARD = grain.sharding.ShardOptions(shard_index=0, shard_count=1)
# prompt 8 + reply 3: every row is 11 tokens long
ROW_TOKENS = 11


def _trajectory(i: int, turns: int = 1, **kwargs):
    return agent_trajectory(
        f"t{i:02d}", seed=100 + i, concat=False, prompt_len=8, out_len=3, turns=turns, **kwargs
    )


def _store(tmp_path, trajectories):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append(trajectories)
    return store


def _loader(store, **config):
    fields = {"rows": 4, "seq_len": 64, "layout": "windowed", **config}
    return AtdpLoader(
        store, ["acme"], principal="acme", config=LoaderConfig(**fields), clock=lambda: NOW
    )


@pytest.mark.timeout(20)
def test_a_repeated_epoch_that_drops_every_trajectory_raises_instead_of_spinning(tmp_path):
    store = _store(tmp_path, [_trajectory(i) for i in range(6)])
    loader = _loader(store, seq_len=ROW_TOKENS - 1)
    batches = iter(loader.epoch(shard=ONE_SHARD, seed=3, num_epochs=None))
    with pytest.raises(LoaderStarvedError, match="raise seq_len to at least 11") as error:
        next(batches)
    message = str(error.value)
    assert "6 trajectories of this epoch" in message and "4 x 10 batch" in message
    assert loader.stats.snapshot()["dropped_too_long"] == 6  # one pass, not more


@pytest.mark.timeout(20)
def test_a_repeated_epoch_names_the_rows_a_trajectory_needs(tmp_path):
    store = _store(tmp_path, [_trajectory(i, turns=3) for i in range(3)])
    loader = _loader(store, rows=2)
    with pytest.raises(
        LoaderStarvedError, match=r"up to 3 rows per trajectory.*rows to at least 3"
    ):
        next(iter(loader.epoch(shard=ONE_SHARD, num_epochs=None)))
    # a finite epoch ends by itself: it stays a plain (empty) pass
    assert list(_loader(store, rows=2).epoch(shard=ONE_SHARD, num_epochs=2)) == []


@pytest.mark.timeout(20)
def test_one_trajectory_that_fits_keeps_a_repeated_epoch_going(tmp_path):
    # four too long and one that fits, reshuffled each pass: the fitting one is often far from
    # the last one kept, across pass boundaries, and that must not read as starvation
    store = _store(tmp_path, [_trajectory(i, turns=2) for i in range(4)] + [_trajectory(9)])
    loader = _loader(store, rows=1, seq_len=ROW_TOKENS)
    batches = iter(loader.epoch(shard=ONE_SHARD, seed=0, num_epochs=None, read_group=2))
    real_rows = [int((next(batches)["traj_index"] >= 0).sum()) for _ in range(40)]
    assert real_rows == [1] * 40
    assert loader.stats.snapshot()["dropped_too_long"] >= 39 * 4


@pytest.mark.timeout(20)
def test_a_restored_iterator_that_drops_everything_still_raises(tmp_path):
    store = _store(tmp_path, [_trajectory(i) for i in range(4)])
    # (read_group 2: grain cannot take len() of an endless dataset batched by 1)
    fits = iter(_loader(store).epoch(shard=ONE_SHARD, seed=1, num_epochs=None, read_group=2))
    next(fits)
    state = fits.get_state()
    starved = iter(
        _loader(store, seq_len=ROW_TOKENS - 1).epoch(
            shard=ONE_SHARD, seed=1, num_epochs=None, read_group=2
        )
    )
    starved.set_state(state)
    with pytest.raises(LoaderStarvedError, match="too long"):
        next(starved)


@pytest.mark.timeout(20)
def test_a_repeated_epoch_of_ineligible_trajectories_raises(tmp_path):
    ineligible = Governance.synthetic("acme", expires_at=None)
    ineligible = dataclasses.replace(ineligible, training_eligible=False)
    store = _store(tmp_path, [_trajectory(i, governance=ineligible) for i in range(3)])
    with pytest.raises(
        LoaderStarvedError, match=r"3 trajectories.*ineligible, purged or without LLM calls"
    ):
        next(iter(_loader(store).epoch(shard=ONE_SHARD, num_epochs=None)))


@pytest.mark.timeout(20)
def test_a_stream_that_only_drops_raises_after_starved_after_in_a_row(tmp_path):
    store = _store(tmp_path, [_trajectory(i, turns=3) for i in range(5)])
    stream = _loader(store, rows=2, starved_after=5).stream(
        shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=60.0
    )
    with pytest.raises(LoaderStarvedError, match="dropped 5 trajectories in a row"):
        next(iter(stream))

    # below the threshold (or with it off) the stream just goes idle, as before
    for starved_after in (6, 0):
        quiet = _loader(store, rows=2, starved_after=starved_after).stream(
            shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.2
        )
        assert list(quiet) == []


@pytest.mark.timeout(20)
def test_a_kept_trajectory_resets_the_streams_count(tmp_path):
    # 2 too long, 1 that fits, 2 too long: never 3 in a row
    turns = [3, 3, 1, 3, 3]
    store = _store(tmp_path, [_trajectory(i, turns=t) for i, t in enumerate(turns)])
    stream = _loader(store, rows=2, starved_after=3).stream(
        shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.2
    )
    batches = list(stream)
    assert len(batches) == 1 and (batches[0]["traj_index"] >= 0).sum() == 1


def test_a_negative_starved_after_is_refused():
    with pytest.raises(ValueError, match="starved_after must be >= 0, got -1"):
        LoaderConfig(rows=1, seq_len=8, starved_after=-1)
