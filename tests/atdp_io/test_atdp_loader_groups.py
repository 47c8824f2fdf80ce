"""`LoaderConfig.group_by`: a group committed in one append never straddles two batches."""

import dataclasses
import tempfile

import grain
import hypothesis.strategies as st
import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory
from hypothesis import HealthCheck, given, settings

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig, LoaderStarvedError
from atdp_io.rows import trajectory_rows

ONE_SHARD = grain.sharding.ShardOptions(shard_index=0, shard_count=1)
GROUP_BY = "task.group_key"


def _member(group: int, member: int, turns: int, *, keyed: bool = True, out_len: int = 3):
    traj = agent_trajectory(
        f"g{group}-m{member}",
        seed=1000 * group + member,
        turns=turns,
        concat=False,
        prompt_len=8,
        out_len=out_len,
    )
    task = dict(traj.header.task, member=member)
    if keyed:
        task["group_key"] = f"run-w0-g{group}"
    return dataclasses.replace(traj, header=dataclasses.replace(traj.header, task=task))


def _write_groups(store, groups):
    """`groups`: per group the turns (= windowed rows) of each member; one append per group.
    A group given as a bare int is a keyless trajectory of that many turns."""
    written = []
    with store.writer("acme") as writer:
        for g, spec in enumerate(groups):
            if isinstance(spec, int):
                members = [_member(g, 0, spec, keyed=False)]
            else:
                members = [_member(g, m, turns) for m, turns in enumerate(spec)]
            writer.append(members)
            written.append(members)
    return written


def _loader(store, **config):
    fields = {"rows": 4, "seq_len": 64, "layout": "windowed", "group_by": GROUP_BY, **config}
    return AtdpLoader(
        store, ["acme"], principal="acme", config=LoaderConfig(**fields), clock=lambda: NOW
    )


def _owners(written):
    owner = {}
    for members in written:
        for traj in members:
            for row in trajectory_rows(traj, "windowed")[0]:
                owner[row.tokens.tobytes()] = traj.trajectory_id
    return owner


def _ids(batch, owner):
    """Trajectory ids in a batch, once each, in row order."""
    ids = []
    for r in np.flatnonzero(batch["traj_index"] >= 0):
        n = int(batch["segment_ids"][r].sum())
        tid = owner[batch["tokens"][r, :n].tobytes()]
        if tid not in ids:
            ids.append(tid)
    return ids


def _group_of(tid):
    return tid.split("-")[0]


def _assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


group_specs = st.lists(
    st.one_of(st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(1, 2)),
    min_size=1,
    max_size=7,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=group_specs,
    rows=st.integers(2, 7),
    read_group=st.integers(1, 5),
    mode=st.sampled_from(["stream", "epoch"]),
    seed=st.integers(0, 3),
)
def test_a_batch_holds_every_member_of_a_group_or_none(groups, rows, read_group, mode, seed):
    with tempfile.TemporaryDirectory() as root:
        store = AtdpStore.open(root)
        written = _write_groups(store, groups)
        owner = _owners(written)
        loader = _loader(store, rows=rows)
        if mode == "stream":
            dataset = loader.stream(
                poll_interval_s=0.01, idle_timeout_s=0.05, shard=ONE_SHARD, read_group=read_group
            )
        else:
            dataset = loader.epoch(shard=ONE_SHARD, seed=seed, read_group=read_group)
        batches = [_ids(b, owner) for b in dataset]
    seen = [tid for batch in batches for tid in batch]
    assert len(seen) == len(set(seen))  # each trajectory at most once
    sizes = {_group_of(m[0].trajectory_id): len(m) for m in written}
    needed = {_group_of(m[0].trajectory_id): sum(len(t.events) // 2 for t in m) for m in written}
    for batch in batches:
        for group in {_group_of(tid) for tid in batch}:
            assert sum(_group_of(t) == group for t in batch) == sizes[group]
    fits = {g for g, n in needed.items() if n <= rows}
    assert {_group_of(t) for t in seen} == fits  # every group that fits, nothing else
    dropped = [m for m in written if _group_of(m[0].trajectory_id) not in fits]
    stats = loader.stats.snapshot()
    assert stats.get("dropped_too_long", 0) == sum(len(m) for m in dropped)
    if mode == "stream":  # commit order is kept
        assert seen == [
            t.trajectory_id for m in written for t in m if _group_of(t.trajectory_id) in fits
        ]


def test_groups_larger_than_a_batch_or_holding_a_too_long_member_are_dropped_or_refused(
    tmp_path,
):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([_member(0, m, 1) for m in range(3)])  # 3 rows: over rows=2
        writer.append([_member(1, 0, 1), _member(1, 1, 1, out_len=80)])  # a row over seq_len
        writer.append([_member(2, m, 1) for m in range(2)])
    loader = _loader(store, rows=2)
    batches = list(loader.epoch(shard=ONE_SHARD, shuffle=False))
    assert len(batches) == 1 and (batches[0]["traj_index"] >= 0).sum() == 2
    stats = loader.stats.snapshot()
    assert stats["dropped_too_long"] == 5 and stats["dropped_too_long_groups"] == 2
    with pytest.raises(ValueError, match=r"group of 3 trajectories from 'g0-m0'.*needs 3 rows"):
        list(_loader(store, rows=2, too_long="error").epoch(shard=ONE_SHARD, shuffle=False))
    starving = _loader(store, rows=2, starved_after=2).stream(shard=ONE_SHARD, idle_timeout_s=5)
    with pytest.raises(LoaderStarvedError, match=r"dropped 2 groups in a row.*rows per group"):
        next(iter(starving))


def test_restoring_a_grouped_iterator_resumes_exactly(tmp_path):
    store = AtdpStore.open(tmp_path)
    _write_groups(store, [[1, 1], [2], [1, 1, 1], 1, [1, 2], [1]])

    def epoch():
        return _loader(store, rows=3).epoch(shard=ONE_SHARD, seed=5, num_epochs=2, read_group=2)

    def stream():
        return _loader(store, rows=3).stream(
            shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.05, read_group=2
        )

    for make in (epoch, stream):
        total = len(list(make()))
        for taken in range(1, total):
            iterator = iter(make())
            for _ in range(taken):
                next(iterator)
            state = iterator.get_state()
            expected = list(iterator)
            restored = iter(make())
            restored.set_state(state)
            _assert_same_batches(list(restored), expected)
    ungrouped = iter(_loader(store, rows=3, group_by=None).stream(shard=ONE_SHARD))
    with pytest.raises(ValueError, match=r"saved with LoaderConfig\.group_by"):
        ungrouped.set_state(iter(stream()).get_state())


def test_stream_shards_deal_out_whole_groups(tmp_path):
    store = AtdpStore.open(tmp_path)
    written = _write_groups(store, [[1, 1]] * 4 + [1, [1, 1, 1], 1])
    owner = _owners(written)
    shards = []
    for index in range(2):
        shard = grain.sharding.ShardOptions(shard_index=index, shard_count=2)
        dataset = _loader(store, rows=3).stream(
            shard=shard, poll_interval_s=0.01, idle_timeout_s=0.05, read_group=1
        )
        shards.append({tid for batch in dataset for tid in _ids(batch, owner)})
    assert shards[0] and shards[1] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == {t.trajectory_id for m in written for t in m}
    assert not {_group_of(t) for t in shards[0]} & {_group_of(t) for t in shards[1]}


def test_default_splits_groups_and_keyless_data_batches_as_without_group_by(tmp_path):
    store = AtdpStore.open(tmp_path)
    written = _write_groups(store, [[1, 1, 1], [1, 1, 1]])
    owner = _owners(written)
    default = list(_loader(store, group_by=None).epoch(shard=ONE_SHARD, shuffle=False))
    split = [["g0-m0", "g0-m1", "g0-m2", "g1-m0"], ["g1-m1", "g1-m2"]]
    assert [_ids(b, owner) for b in default] == split
    grouped = list(_loader(store).epoch(shard=ONE_SHARD, shuffle=False))
    whole = [["g0-m0", "g0-m1", "g0-m2"], ["g1-m0", "g1-m1", "g1-m2"]]
    assert [_ids(b, owner) for b in grouped] == whole

    keyless = AtdpStore.open(tmp_path / "keyless")
    _write_groups(keyless, [1, 2, 1, 3, 2, 1, 1])
    for shuffle in (True, False):
        _assert_same_batches(
            list(_loader(keyless, group_by=None).epoch(shard=ONE_SHARD, seed=2, shuffle=shuffle)),
            list(_loader(keyless).epoch(shard=ONE_SHARD, seed=2, shuffle=shuffle)),
        )
    streams = [
        list(_loader(keyless, group_by=g).stream(shard=ONE_SHARD, idle_timeout_s=0.05))
        for g in (None, GROUP_BY)
    ]
    _assert_same_batches(*streams)


@pytest.mark.parametrize("group_by", ["task.", "task", "header.session_id", 3])
def test_a_group_by_naming_no_header_field_is_refused(group_by):
    with pytest.raises(ValueError, match="group_by"):
        LoaderConfig(rows=2, seq_len=8, group_by=group_by)


def test_max_trajectories_never_splits_a_group(tmp_path):
    store = AtdpStore.open(tmp_path)
    written = _write_groups(store, [[1, 1], [1, 1], [1, 1, 1], 1])
    loader = _loader(store, rows=32, max_trajectories=3)
    stream = loader.stream(shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.2)
    sizes = [int((batch["traj_index"] >= 0).sum()) for batch in stream]
    # group 1 would make 4 > 3: it waits; group 2 alone is 3; the keyless one follows
    assert sizes == [2, 2, 3, 1]
    assert sum(len(members) for members in written) == sum(sizes)
