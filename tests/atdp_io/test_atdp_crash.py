"""Crash safety with a real `kill -9` of a writer process in the middle of writing.

Every call the writer acknowledged must be readable after the kill, nothing half-written may be
visible, and a restarted writer must continue on top of whatever the dead one left behind.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from atdp_crash_writer import HELD, batch_template, session_template

from atdp_io import AtdpStore, Outcome

HERE = pathlib.Path(__file__).parent


def _run_and_kill(root, mode: str, acks_before_kill: int, delay_s: float = 0.0) -> list[str]:
    """Starts the writer, SIGKILLs it `delay_s` after the n-th ack; returns every ack printed."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, str(HERE / "atdp_crash_writer.py"), str(root), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    acks = []
    try:
        while len(acks) < acks_before_kill:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"writer exited early: {child.stderr.read()}")
            acks.append(line.strip())
        time.sleep(delay_s)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    acks.extend(line.strip() for line in child.stdout)  # flushed before the kill: acknowledged
    assert child.returncode == -signal.SIGKILL
    return acks


def _assert_events_match(stored, template, n_events):
    assert len(stored.events) >= n_events
    for got, want in zip(stored.events, template.events, strict=False):
        assert got.kind == want.kind
        if want.llm is not None:
            np.testing.assert_array_equal(got.llm.context_ids, want.llm.context_ids)
            np.testing.assert_array_equal(got.llm.output_logprobs, want.llm.output_logprobs)


def test_kill_during_sessions_keeps_every_acknowledged_event(tmp_path):
    acks = _run_and_kill(tmp_path, "sessions", acks_before_kill=120)
    acked_events: dict[str, int] = {}
    acked_closed = set()
    for ack in acks:
        kind, trajectory_id, *rest = ack.split()
        acked_events.setdefault(trajectory_id, 0)
        if kind == "event":
            acked_events[trajectory_id] = max(acked_events[trajectory_id], int(rest[0]) + 1)
        elif kind == "close":
            acked_closed.add(trajectory_id)
    store = AtdpStore.open(tmp_path)
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    visible = set(reader.trajectory_ids(closed_only=False))
    assert set(acked_events) <= visible
    assert acked_closed <= set(reader.trajectory_ids())
    for trajectory_id in visible:  # whatever is visible decodes and matches what was written
        template = session_template(int(trajectory_id[1:]))
        _assert_events_match(
            reader.read(trajectory_id), template, acked_events.get(trajectory_id, 0)
        )
    # A restarted writer resumes an interrupted session and finishes it.
    unfinished = sorted(visible - set(reader.trajectory_ids()))
    assert f"s{HELD}" in unfinished
    with store.writer("acme") as writer:
        for trajectory_id in unfinished:
            template = session_template(int(trajectory_id[1:]))
            session = writer.resume(trajectory_id)
            done = len(reader.read(trajectory_id).events)
            session.append_events(list(template.events[done:]))
            session.close(Outcome(success=True))
    reader.refresh()
    for trajectory_id in unfinished:
        stored = reader.read(trajectory_id)
        assert stored.closed
        _assert_events_match(stored, session_template(int(trajectory_id[1:])), 6)


# An append takes ~25 ms (about a third of it in the data commit): the delays land the kill
# before, inside and after the commit of the next trajectory.
@pytest.mark.parametrize("delay_s", [0.0, 0.008, 0.016, 0.024])
def test_kill_during_large_appends_leaves_no_half_trajectory(tmp_path, delay_s):
    acks = _run_and_kill(tmp_path, "batch", 3, delay_s)
    acked = [a.split()[1] for a in acks]
    store = AtdpStore.open(tmp_path)
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    visible = reader.trajectory_ids(closed_only=False)
    # In order; at most one more than acknowledged (committed, killed before printing the ack).
    assert visible[: len(acked)] == acked and len(visible) <= len(acked) + 1
    assert reader.trajectory_ids() == visible  # nothing partial: every visible one is closed
    for trajectory_id in visible:
        template = batch_template(int(trajectory_id[1:]))
        _assert_events_match(reader.read(trajectory_id), template, len(template.events))
    with store.writer("acme") as writer:  # the dead writer's tail is overwritten cleanly
        writer.append([batch_template(999)])
    reader.refresh()
    _assert_events_match(reader.read("b999"), batch_template(999), 40)
