"""guarded(): passes items and errors through, and a failure elsewhere ends a blocked next()
without leaving its helper thread behind."""

import threading
import time

import pytest

from sao_jax.rollout.guard import guarded


def helpers_alive() -> int:
    return sum(t.name == "guarded-iterator" and t.is_alive() for t in threading.enumerate())


def test_items_and_the_iterators_own_errors_pass_through():
    assert list(guarded(iter(range(5)), lambda: None)) == [0, 1, 2, 3, 4]

    def broken():
        yield 1
        raise KeyError("bad row")

    with pytest.raises(KeyError, match="bad row"):
        list(guarded(broken(), lambda: None))
    assert helpers_alive() == 0


def test_a_failure_ends_a_blocked_next_and_the_helper_thread():
    def stream():  # like the ATDP stream: polls forever when nothing new is committed
        yield "first"
        while True:
            time.sleep(0.01)

    failed = threading.Event()

    def check():
        if failed.is_set():
            raise RuntimeError("worker died")

    items = guarded(stream(), check, poll_s=0.01)
    assert next(items) == "first"
    threading.Timer(0.1, failed.set).start()
    with pytest.raises(RuntimeError, match="worker died"):
        next(items)
    assert helpers_alive() == 0


def test_closing_early_stops_the_idle_helper():
    items = guarded(iter(range(100)), lambda: None)
    assert next(items) == 0
    items.close()
    time.sleep(0.05)
    assert helpers_alive() == 0
