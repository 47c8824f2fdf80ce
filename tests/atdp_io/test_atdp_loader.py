"""The grain loaders: eligibility, never-split batches, shuffling, sharding, staleness,
checkpoints, and the online stream."""

import dataclasses
import threading
import time

import grain
import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import (
    AccessDenied,
    AtdpStore,
    ConsentStatus,
    Governance,
    GovernanceUpdate,
    ReviewStatus,
)
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.rows import trajectory_rows

ONE_SHARD = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


def _make(i: int, **kwargs):
    kwargs.setdefault("turns", 1 + i % 3)
    return agent_trajectory(
        f"t{i:02d}", seed=100 + i, concat=False, prompt_len=8, out_len=3, **kwargs
    )


def _row_owner(trajectories, layout="windowed"):
    """Maps a row's token bytes to (trajectory id, turn index)."""
    owner = {}
    for traj in trajectories:
        rows, _ = trajectory_rows(traj, layout)
        for row in rows:
            owner[row.tokens.tobytes()] = (traj.trajectory_id, row.turn_index)
    return owner


def _rows_of(batch, owner):
    out = []
    for r in range(batch["tokens"].shape[0]):
        if batch["traj_index"][r] < 0:
            assert not batch["segment_ids"][r].any()
            continue
        n = int(batch["segment_ids"][r].sum())
        out.append((owner[batch["tokens"][r, :n].tobytes()], int(batch["traj_index"][r])))
    return out


def _loader(store, **config):
    fields = {"rows": 4, "seq_len": 64, "layout": "windowed", **config}
    current = fields.pop("current_version", lambda: 0)
    return AtdpLoader(
        store,
        ["acme"],
        principal="acme",
        config=LoaderConfig(**fields),
        current_version=current,
        clock=lambda: NOW,
    )


@pytest.fixture
def store_with_mix(tmp_path):
    store = AtdpStore.open(tmp_path)
    eligible = [_make(i) for i in range(10)]
    blocked = {
        "not_training_eligible": _make(
            20,
            governance=dataclasses.replace(
                Governance.synthetic("acme", expires_at=None), training_eligible=False
            ),
        ),
        "expired": _make(21, expires_at=NOW - 1),
        "consent": _make(22),
        "human_review": _make(23),
    }
    reviewed = _make(
        24,
        governance=dataclasses.replace(
            Governance.synthetic("acme", expires_at=None), human_review=ReviewStatus.PENDING
        ),
    )
    pending = dataclasses.replace(
        reviewed, header=dataclasses.replace(reviewed.header, trajectory_id="t25")
    )
    with store.writer("acme") as writer:
        writer.append(eligible + list(blocked.values()) + [reviewed, pending])
        writer.annotate(
            GovernanceUpdate("t22", NOW, "user withdrew consent", consent=ConsentStatus.WITHDRAWN),
            GovernanceUpdate("t23", NOW, "reviewer rejected", human_review=ReviewStatus.REJECTED),
            GovernanceUpdate("t24", NOW, "reviewer approved", human_review=ReviewStatus.APPROVED),
        )
        open_session = writer.open_trajectory(_make(30).header)  # never closed: never loaded
        open_session.append_event(_make(30).events[0])
    return store, [*eligible, reviewed]


def test_epoch_yields_each_eligible_trajectory_once_and_never_splits_one(store_with_mix):
    store, eligible = store_with_mix
    owner = _row_owner(eligible)
    loader = _loader(store)
    batches = list(loader.epoch(shard=ONE_SHARD, seed=3))
    seen = {}
    for b, batch in enumerate(batches):
        assert batch["tokens"].shape == (4, 64) and batch["tokens"].dtype == np.int32
        for (trajectory_id, turn), slot in _rows_of(batch, owner):
            seen.setdefault(trajectory_id, []).append((b, slot, turn))
    assert sorted(seen) == sorted(t.trajectory_id for t in eligible)
    for trajectory_id, rows in seen.items():
        assert len({(b, slot) for b, slot, _ in rows}) == 1, f"{trajectory_id} was split"
        assert [turn for _, _, turn in rows] == list(range(len(rows)))
    stats = loader.stats.snapshot()
    for reason in ("not_training_eligible", "expired", "consent", "human_review"):
        assert stats[f"dropped_ineligible_{reason}"] == (2 if reason == "human_review" else 1)
    assert stats["trajectories_read"] == len(eligible)
    assert stats["rows_emitted"] == sum(len(rows) for rows in seen.values())


def test_shuffle_is_seeded_and_shards_partition_the_data(store_with_mix):
    store, eligible = store_with_mix
    owner = _row_owner(eligible)

    def order(seed, shard=ONE_SHARD):
        batches = _loader(store).epoch(seed=seed, shard=shard)
        return [tid for batch in batches for (tid, turn), _ in _rows_of(batch, owner) if turn == 0]

    assert order(1) == order(1)
    assert order(1) != order(2)
    halves = [order(1, grain.sharding.ShardOptions(i, 2)) for i in range(2)]
    assert not set(halves[0]) & set(halves[1])
    assert sorted(halves[0] + halves[1]) == sorted(t.trajectory_id for t in eligible)


def test_staleness_uses_the_learner_version_at_batch_time(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([_make(i, version=i, turns=1) for i in range(6)])
    version = {"now": 5}
    loader = _loader(store, rows=1, max_staleness=2, current_version=lambda: version["now"])
    iterator = iter(loader.epoch(shard=ONE_SHARD, shuffle=False))
    first = next(iterator)
    assert first["versions"][first["loss_mask"] > 0].min() == 3  # versions 0..2 dropped
    version["now"] = 7  # the learner moved on: version 4 is now too old
    rest = list(iterator)
    assert [b["versions"][b["loss_mask"] > 0].min() for b in rest] == [5]
    assert loader.stats.snapshot()["dropped_stale_rows"] == 4

    mixed = agent_trajectory("mixed", turns=2, concat=False, version=0)
    newer = dataclasses.replace(
        mixed.events[2],
        llm=dataclasses.replace(mixed.events[2].llm, policy_version=9, output_versions=None),
    )
    mixed = dataclasses.replace(mixed, events=(*mixed.events[:2], newer, *mixed.events[3:]))
    with store.writer("acme") as writer:
        writer.append([mixed])
    for unit, rows_left in (("row", 1), ("trajectory", 0)):
        loader = _loader(store, max_staleness=0, staleness_unit=unit, current_version=lambda: 9)
        emitted = sum(int((b["traj_index"] >= 0).sum()) for b in loader.epoch(shard=ONE_SHARD))
        assert emitted == rows_left


def test_a_trajectory_carried_to_the_next_batch_is_checked_for_staleness_again(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:  # 1 row at version 5, then 2 rows at version 3
        writer.append([_make(0, version=5, turns=1), _make(1, version=3, turns=2)])
    version = {"now": 5}
    loader = _loader(store, rows=2, max_staleness=2, current_version=lambda: version["now"])
    iterator = iter(loader.stream(shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.2))
    first = next(iterator)  # t01 fits no more: carried over, fresh enough at version 5
    assert (first["traj_index"] >= 0).sum() == 1
    version["now"] = 6  # the learner moved on: version 3 is now too old
    later = [b for b in iterator if (b["traj_index"] >= 0).any()]
    assert later == []
    assert loader.stats.snapshot()["dropped_stale_rows"] == 2


def test_restoring_an_iterator_state_resumes_exactly(store_with_mix):
    store, _ = store_with_mix
    dataset = _loader(store, rows=3).epoch(shard=ONE_SHARD, seed=7, num_epochs=2)
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    state = iterator.get_state()
    expected = list(iterator)
    restored = iter(_loader(store, rows=3).epoch(shard=ONE_SHARD, seed=7, num_epochs=2))
    restored.set_state(state)
    got = list(restored)
    assert len(got) == len(expected) > 3
    for a, b in zip(got, expected, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_oversized_trajectories_are_dropped_or_refused(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([_make(0, turns=1), _make(1, turns=3)])
    loader = _loader(store, rows=2)
    batches = list(loader.epoch(shard=ONE_SHARD, shuffle=False))
    assert len(batches) == 1 and loader.stats.snapshot()["dropped_too_long"] == 1
    with pytest.raises(ValueError, match=r"'t01' .* needs 3 rows"):
        list(_loader(store, rows=2, too_long="error").epoch(shard=ONE_SHARD, shuffle=False))


def test_the_loader_checks_the_principal(store_with_mix):
    store, _ = store_with_mix
    with pytest.raises(AccessDenied):
        AtdpLoader(store, ["acme"], principal="globex", config=LoaderConfig(rows=1, seq_len=8))


def test_stream_delivers_new_commits_once_and_resumes_from_its_cursor(tmp_path):
    store = AtdpStore.open(tmp_path)
    trajectories = [_make(i, turns=1) for i in range(8)]
    owner = _row_owner(trajectories)
    writer = store.writer("acme")
    writer.append(trajectories[:2])

    def late_writes():
        for traj in trajectories[2:6]:
            time.sleep(0.05)
            writer.append([traj])

    thread = threading.Thread(target=late_writes)
    thread.start()
    loader = _loader(store, rows=2)
    iterator = iter(loader.stream(poll_interval_s=0.01, idle_timeout_s=1.0, shard=ONE_SHARD))
    first = [tid for (tid, _), _ in _rows_of(next(iterator), owner)]
    state = iterator.get_state()
    rest = [tid for batch in iterator for (tid, _), _ in _rows_of(batch, owner)]
    thread.join()
    assert first == ["t00", "t01"]
    assert rest == ["t02", "t03", "t04", "t05"]  # commit order, each once, blocking for new data

    writer.append(trajectories[6:])
    writer.close()
    resumed = iter(
        _loader(store, rows=2).stream(poll_interval_s=0.01, idle_timeout_s=0.2, shard=ONE_SHARD)
    )
    resumed.set_state(state)
    again = [tid for batch in resumed for (tid, _), _ in _rows_of(batch, owner)]
    assert again == ["t02", "t03", "t04", "t05", "t06", "t07"]


def test_stream_waits_for_a_late_reward_within_the_grace(tmp_path):
    store = AtdpStore.open(tmp_path)
    trajectories = [_make(i, turns=1, final_reward=0.0) for i in range(2)]
    owner = _row_owner(trajectories)
    writer = store.writer("acme")
    writer.append(trajectories)  # both closed, no late reward yet
    loader = _loader(store, rows=1, reward_grace_s=60.0)
    iterator = iter(loader.stream(poll_interval_s=0.01, shard=ONE_SHARD))
    got = []

    def read_one():
        got.append(next(iterator))

    reader = threading.Thread(target=read_one)
    reader.start()
    time.sleep(0.3)
    assert not got  # held back: t00 has no reward yet, and t01 waits behind it
    writer.add_reward("t00", 7.0, source="user")  # posted after the episode closed
    reader.join(timeout=30)
    assert [tid for (tid, _), _ in _rows_of(got[0], owner)] == ["t00"]
    assert got[0]["rewards"].sum() == pytest.approx(7.0)
    writer.close()
    # without a reward, a trajectory goes once the grace has passed
    quick = iter(
        _loader(store, rows=1, reward_grace_s=0.2).stream(
            poll_interval_s=0.01, idle_timeout_s=5.0, shard=ONE_SHARD
        )
    )
    start = time.monotonic()
    order = [tid for batch in quick for (tid, _), _ in _rows_of(batch, owner)]
    assert order == ["t00", "t01"] and time.monotonic() - start >= 0.2


def test_max_trajectories_closes_a_batch_that_still_has_free_rows(tmp_path):
    store = AtdpStore.open(tmp_path)
    trajectories = [_make(i, turns=1 + i % 2) for i in range(8)]  # 1 or 2 rows each
    owner = _row_owner(trajectories)
    with store.writer("acme") as writer:
        writer.append(trajectories)
    loader = _loader(store, rows=16, max_trajectories=3)
    stream = loader.stream(poll_interval_s=0.01, idle_timeout_s=0.2, shard=ONE_SHARD)
    batches = [sorted({tid for (tid, _), _ in _rows_of(batch, owner)}) for batch in stream]
    # 16 rows would hold all 12 rows at once; the limit cuts batches of 3 trajectories, in
    # commit order, the last one partial when the stream goes idle
    assert batches == [["t00", "t01", "t02"], ["t03", "t04", "t05"], ["t06", "t07"]]
    rows_only = _loader(store, rows=16).stream(poll_interval_s=0.01, idle_timeout_s=0.2)
    assert sum(1 for _ in rows_only) == 1


def _assert_rows_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.turn_index == y.turn_index
        for name in ("tokens", "loss_mask", "rollout_logp", "rewards", "versions"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name))


def test_the_storage_fast_path_lays_out_exactly_what_full_decoding_does(tmp_path):
    store = AtdpStore.open(tmp_path)
    chained = agent_trajectory("chained", turns=3, seed=1)
    rebuilt = agent_trajectory("rebuilt", turns=3, seed=2, concat=False)
    with store.writer("acme") as writer:
        writer.append([chained, rebuilt])
        # Two interleaved sessions: their token segments are not contiguous on storage.
        left = writer.open_trajectory(agent_trajectory("left", seed=3).header)
        right = writer.open_trajectory(agent_trajectory("right", seed=4).header)
        for a, b in zip(
            agent_trajectory("left", seed=3).events,
            agent_trajectory("right", seed=4).events,
            strict=True,
        ):
            left.append_event(a)
            right.append_event(b)
        left.close()
        right.close()
        writer.add_reward("chained", 0.5, event_index=2, source="user")
        writer.add_reward("left", -1.0, source="tests")
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    entries = reader.entries()
    for sources, weights in ((False, None), (True, {"env": 1.0, "user": 2.0})):
        views = reader.read_training_views(entries, reward_sources=sources)
        for entry, view in zip(entries, views, strict=True):
            full = reader.read(entry.trajectory_id)
            for layout in ("concat", "windowed"):
                fast, _ = trajectory_rows(view, layout, reward_weights=weights)
                slow, _ = trajectory_rows(full, layout, reward_weights=weights)
                _assert_rows_equal(fast, slow)
    assert [v.extends for v in reader.read_training_views(entries)] == [True, None, True, True]


def test_reward_weights_select_sources(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([_make(0, turns=1, final_reward=1.0)])
        writer.add_reward("t00", 5.0, event_index=0, source="user")
    for weights, total in ((None, 6.0), ({"user": 1.0}, 5.0), ({"env": 0.5}, 0.5)):
        batches = list(_loader(store, reward_weights=weights).epoch(shard=ONE_SHARD))
        assert sum(float(b["rewards"].sum()) for b in batches) == total


def test_a_purge_after_reading_keeps_the_trajectory_out_of_the_batch(tmp_path):
    store = AtdpStore.open(tmp_path)
    writer = store.writer("acme")
    writer.append([_make(i, turns=1) for i in range(3)])
    loader = _loader(store)
    items = loader.load_many(loader._snapshot())
    assert [i.trajectory_id for i in items] == ["t00", "t01", "t02"]
    writer.purge(["t01"], reason="deletion request")  # lands between read and emission
    writer.close()
    assert loader.still_allowed(items) == [True, False, True]
    assert loader.stats.snapshot()["dropped_purged"] == 1


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"rows": 0, "seq_len": 8}, "rows and seq_len must be >= 1"),
        ({"rows": 1, "seq_len": 8, "layout": "packed"}, "layout must be one of"),
        ({"rows": 1, "seq_len": 8, "too_long": "truncate"}, "too_long"),
        ({"rows": 1, "seq_len": 8, "max_staleness": -1}, "max_staleness"),
        ({"rows": 1, "seq_len": 8, "staleness_unit": "token"}, "staleness_unit"),
        ({"rows": 1, "seq_len": 8, "max_trajectories": 0}, "max_trajectories"),
        ({"rows": 1, "seq_len": 8, "max_trajectories": 2.5}, "max_trajectories"),
        ({"rows": 1, "seq_len": 8, "reward_grace_s": -1.0}, "reward_grace_s"),
    ],
)
def test_bad_loader_configs_are_refused(fields, problem):
    with pytest.raises(ValueError, match=problem):
        LoaderConfig(**fields)


def test_default_shard_is_this_jax_process(store_with_mix):
    store, eligible = store_with_mix
    batches = list(_loader(store).epoch(seed=0))  # one process: one shard holding everything
    assert sum(int((b["turn_index"] == 0).sum()) for b in batches) == len(eligible)


def test_a_loader_shard_is_the_default_of_its_epochs_and_streams(store_with_mix):
    """A process reading a tenant of its own sets the shard once (here: the second half)."""
    store, eligible = store_with_mix
    owner = _row_owner(eligible)
    second = grain.sharding.ShardOptions(shard_index=1, shard_count=2)

    def ids(batches):
        return {tid for batch in batches for (tid, _), _ in _rows_of(batch, owner)}

    def loader(shard):
        return AtdpLoader(
            store,
            ["acme"],
            principal="acme",
            config=LoaderConfig(rows=4, seq_len=64, layout="windowed"),
            clock=lambda: NOW,
            shard=shard,
        )

    half = ids(_loader(store).epoch(seed=1, shard=second))
    assert half and half != {t.trajectory_id for t in eligible}
    assert ids(loader(second).epoch(seed=1)) == half

    def streamed(shard=None):
        return ids(loader(shard).stream(poll_interval_s=0.01, idle_timeout_s=0.2))

    halves = [streamed(grain.sharding.ShardOptions(i, 2)) for i in range(2)]
    # stream shards split the trajectories evenly (each trajectory of the fixture spans an
    # even number of records: sharding by record row once gave shard 1 nothing)
    assert halves[0] and halves[1] and not halves[0] & halves[1]
    assert halves[0] | halves[1] == streamed(ONE_SHARD)
    assert ids(loader(second).epoch(seed=1, shard=ONE_SHARD)) == ids(
        _loader(store).epoch(seed=1, shard=ONE_SHARD)
    )  # an explicit shard still wins
