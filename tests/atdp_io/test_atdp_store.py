"""The TensorStore buffer: lossless round trips, sessions, late records, one writer, purge."""

import dataclasses
import threading

import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory, stored_bytes, tool_event

from atdp_io import (
    AtdpStore,
    GovernanceUpdate,
    LateReward,
    Outcome,
    PartitionLockedError,
    Reward,
    SchemaError,
    VerdictUpdate,
    WriterError,
    WriterFencedError,
    codec,
)
from atdp_io.reader import TrajectoryNotFound
from atdp_io.schema import Verdict


def _without_redaction(value):
    """Export JSON minus the redaction statuses the writer fills in."""
    if isinstance(value, dict):
        return {k: _without_redaction(v) for k, v in value.items() if k != "redaction"}
    if isinstance(value, list):
        return [_without_redaction(v) for v in value]
    return value


def _reader(store, tenant="acme"):
    reader = store.reader(tenant, principal=tenant)
    reader.refresh()
    return reader


def test_append_and_read_back_is_lossless(tmp_path):
    store = AtdpStore.open(tmp_path)
    concat = agent_trajectory("concat", turns=3, seed=1)
    windowed = agent_trajectory("windowed", turns=2, seed=2, concat=False)
    with_tool = dataclasses.replace(
        agent_trajectory("tool", turns=1, seed=3),
        annotations=(LateReward("tool", 0, Reward(0.25, "user"), NOW),),
    )
    with_tool = dataclasses.replace(
        with_tool, events=(*with_tool.events, tool_event("lookup", {"id": 7}, {"ok": True}))
    )
    with store.writer("acme") as writer:
        assert writer.append([concat, windowed, with_tool]) == ["concat", "windowed", "tool"]
    reader = _reader(store)
    assert reader.trajectory_ids() == ["concat", "windowed", "tool"]
    for original in (concat, windowed, with_tool):
        stored = reader.read(original.trajectory_id)
        assert _without_redaction(codec.trajectory_to_export(stored)) == _without_redaction(
            codec.trajectory_to_export(original)
        )


def test_multi_turn_prompts_are_stored_once(tmp_path):
    store = AtdpStore.open(tmp_path)
    concat = agent_trajectory("c", turns=4, prompt_len=50, obs_len=7, out_len=5)
    windowed = agent_trajectory("w", turns=4, prompt_len=50, out_len=5, concat=False)
    with store.writer("acme") as writer:
        writer.append([concat])
        final_context = concat.llm_events()[-1][1].llm.context_ids.shape[0]
        assert writer.stats["tokens"] == final_context  # each shared prefix stored once
        writer.append([windowed])
        logical = sum(e.llm.context_ids.shape[0] for _, e in windowed.llm_events())
        assert writer.stats["tokens"] == final_context + logical


def test_session_events_are_visible_to_readers_as_they_are_acknowledged(tmp_path):
    store = AtdpStore.open(tmp_path)
    template = agent_trajectory("live", turns=2)
    reader = store.reader("acme", principal="acme")
    with store.writer("acme") as writer:
        session = writer.open_trajectory(template.header)
        reader.refresh()
        assert reader.trajectory_ids() == [] and reader.trajectory_ids(closed_only=False) == [
            "live"
        ]
        for i, event in enumerate(template.events):
            assert session.append_event(event) == i
            reader.refresh()
            assert len(reader.read("live").events) == i + 1
        session.add_reward(2.0, event_index=1, source="user")
        session.close(Outcome(success=True))
        with pytest.raises(WriterError, match="is closed"):
            session.append_event(template.events[0])
    reader.refresh()
    stored = reader.read("live")
    assert stored.closed and stored.outcome.success
    assert [(a.event_index, a.reward.value) for a in stored.annotations] == [(1, 2.0)]


def test_a_session_left_open_by_an_exception_is_closed_as_truncated(tmp_path):
    store = AtdpStore.open(tmp_path)
    template = agent_trajectory("boom", turns=1)
    with (
        store.writer("acme") as writer,
        pytest.raises(RuntimeError),
        writer.open_trajectory(template.header) as session,
    ):
        session.append_event(template.events[0])
        raise RuntimeError("env crashed")
    outcome = _reader(store).read("boom").outcome
    assert outcome == Outcome(success=False, terminated=False, info={"error_class": "RuntimeError"})


def test_writes_that_cannot_be_valid_are_refused_with_the_reason(tmp_path):
    store = AtdpStore.open(tmp_path)
    traj = agent_trajectory("t", turns=2)
    with store.writer("acme") as writer:
        writer.append([traj])
        with pytest.raises(SchemaError, match="already exists"):
            writer.append([traj])
        with pytest.raises(SchemaError, match="does not match the partition 'acme'"):
            writer.append([agent_trajectory("other", tenant="globex")])
        with pytest.raises(SchemaError, match="event_index: 4 is past the last event"):
            writer.annotate(LateReward("t", 4, Reward(1.0), NOW))
        with pytest.raises(WriterError, match="'ghost' is not in partition"):
            writer.add_reward("ghost", 1.0)
        with pytest.raises(WriterError, match="is closed"):
            writer.append_events("t", [traj.events[0]])
        # Annotations after close are what late-bound signals are for.
        writer.annotate(VerdictUpdate("t", 1, Verdict.TRUSTED, NOW))
        writer.append([agent_trajectory("t2")])  # the writer is still usable after refusals
    assert _reader(store).trajectory_ids() == ["t", "t2"]


def test_one_writer_per_partition_and_restart_continues(tmp_path):
    store = AtdpStore.open(tmp_path)
    writer = store.writer("acme")
    writer.append([agent_trajectory("a")])
    with pytest.raises(PartitionLockedError, match="already has a live writer"):
        store.writer("acme")
    writer.close()
    with pytest.raises(WriterError, match="closed"):
        writer.append([agent_trajectory("late")])
    with store.writer("acme") as again:
        again.append([agent_trajectory("b")])
    assert _reader(store).trajectory_ids() == ["a", "b"]
    assert _reader(store).head.writer_epoch == 2


def test_remote_style_kvstore_fences_a_taken_over_writer():
    # The memory kvstore stands in for GCS / S3: no file lock, only the head's compare-and-swap.
    store = AtdpStore.open({"driver": "memory", "path": "fence/"})
    first = store.writer("acme")
    first.append([agent_trajectory("a")])
    second = store.writer("acme")
    with pytest.raises(WriterFencedError, match="taken over"):
        first.append([agent_trajectory("lost")])
    second.append([agent_trajectory("b")])
    reader = _reader(store)
    assert reader.trajectory_ids() == ["a", "b"]
    assert len(reader.read("b").events) == 6


def test_a_commit_that_dies_before_its_head_write_stays_invisible(tmp_path, monkeypatch):
    store = AtdpStore.open(tmp_path)
    writer = store.writer("acme")
    writer.append([agent_trajectory("kept", seed=1)])

    def die(*args, **kwargs):
        raise OSError("process died between data commit and head write")

    monkeypatch.setattr(writer, "_write_head", die)
    with pytest.raises(OSError):
        writer.append([agent_trajectory("half", seed=2, turns=5)])
    with pytest.raises(WriterError, match="failed earlier"):
        writer.append([agent_trajectory("after", seed=3)])
    writer.close()
    assert _reader(store).trajectory_ids() == ["kept"]  # data past the head is not visible
    with store.writer("acme") as restarted:  # overwrites the orphaned tail
        restarted.append([agent_trajectory("next", seed=4)])
    reader = _reader(store)
    assert reader.trajectory_ids() == ["kept", "next"]
    expected = agent_trajectory("next", seed=4)
    for a, b in zip(reader.read("next").events, expected.events, strict=True):
        if a.llm is not None:
            np.testing.assert_array_equal(a.llm.context_ids, b.llm.context_ids)


def test_concurrent_sessions_group_commit_and_readers_see_consistent_prefixes(tmp_path):
    store = AtdpStore.open(tmp_path)
    writer = store.writer("acme")
    n_threads, template = 6, agent_trajectory("x", turns=3)
    stop, seen, errors = threading.Event(), [], []

    def session_worker(k):
        try:
            header = dataclasses.replace(template.header, trajectory_id=f"s{k}")
            with writer.open_trajectory(header) as session:
                for event in template.events:
                    session.append_event(event)
        except Exception as err:  # surfaced below
            errors.append(err)

    def read_worker():
        reader = store.reader("acme", principal="acme")
        while not stop.is_set():
            reader.refresh()
            for trajectory_id in reader.trajectory_ids(closed_only=False):
                seen.append(len(reader.read(trajectory_id).events))

    readers = [threading.Thread(target=read_worker) for _ in range(2)]
    workers = [threading.Thread(target=session_worker, args=(k,)) for k in range(n_threads)]
    for t in readers + workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    writer.close()
    assert not errors
    reader = _reader(store)
    assert sorted(reader.trajectory_ids()) == [f"s{k}" for k in range(n_threads)]
    for k in range(n_threads):
        stored = reader.read(f"s{k}")
        assert [e.kind for e in stored.events] == [e.kind for e in template.events]
        np.testing.assert_array_equal(
            stored.events[-2].llm.context_ids, template.events[-2].llm.context_ids
        )
    assert all(0 <= n <= len(template.events) for n in seen)
    # Each durable call commits once at most; concurrent callers may share a commit.
    calls = n_threads * (2 + len(template.events))
    assert reader.head.commits <= calls


def test_purge_erases_bytes_and_readers_stop_serving(tmp_path):
    store = AtdpStore.open(tmp_path)
    marker = "PURGE-ME-observation"
    doomed = agent_trajectory("doomed", seed=5, expires_at=NOW - 1)
    doomed = dataclasses.replace(
        doomed,
        events=tuple(
            dataclasses.replace(e, observation=marker) if e.llm is None else e
            for e in doomed.events
        ),
    )
    kept = agent_trajectory("kept", seed=6, expires_at=None)
    shortened = agent_trajectory("shortened", seed=7, expires_at=NOW + 1e6)
    with store.writer("acme") as writer:
        writer.append([doomed, kept, shortened])
        writer.annotate(GovernanceUpdate("shortened", NOW, "user request", expires_at=NOW - 5))
        writer.add_reward("doomed", 1.0)
        reader = _reader(store)
        assert writer.purge_expired(now=NOW) == ["doomed", "shortened"]
        with pytest.raises(WriterError, match="not in partition"):
            writer.add_reward("doomed", 1.0)
    reader.refresh()
    assert reader.trajectory_ids() == ["kept"]
    with pytest.raises(TrajectoryNotFound):
        reader.read("doomed")
    raw = stored_bytes(tmp_path)
    assert marker.encode() not in raw
    doomed_tokens = doomed.events[0].llm.input_ids.astype("<i4").tobytes()
    assert doomed_tokens not in raw
    assert kept.events[0].llm.input_ids.astype("<i4").tobytes() in raw
    fresh = _reader(store)  # a reader built after the purge indexes tombstones, not zeros
    assert fresh.trajectory_ids() == ["kept"]
    assert len(fresh.read("kept").events) == 6


def test_a_rejected_call_writes_nothing_at_all(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([agent_trajectory("a")])
        batch = [agent_trajectory("b"), agent_trajectory("c"), agent_trajectory("a")]
        with pytest.raises(SchemaError, match="'a' already exists"):
            writer.append(batch)
        with pytest.raises(SchemaError, match="'d' already exists"):
            writer.append([agent_trajectory("d"), agent_trajectory("d")])
        notes = [LateReward("a", 0, Reward(1.0), NOW), LateReward("a", 99, Reward(1.0), NOW)]
        with pytest.raises(SchemaError, match="event_index: 99"):
            writer.annotate(*notes)
        writer.append([agent_trajectory("b")])  # "b" was never staged by the failed call
    reader = _reader(store)
    assert reader.trajectory_ids() == ["a", "b"]
    assert reader.read("a").annotations == ()


def test_append_async_pipelines_and_is_durable_after_flush(tmp_path):
    store = AtdpStore.open(tmp_path)
    writer = store.writer("acme")
    futures = [
        writer.append_async([agent_trajectory(f"t{k}-{i}", seed=k) for i in range(3)])
        for k in range(5)
    ]
    writer.flush()
    assert [f.result() for f in futures][2] == ["t2-0", "t2-1", "t2-2"]
    assert writer.stats["commits"] <= 5
    late = writer.append_async([agent_trajectory("last")])
    writer.close()  # waits for the pending commit before releasing the lock
    assert late.done() and late.result() == ["last"]
    assert len(_reader(store).trajectory_ids()) == 16
