"""Iterate a blocking iterator while watching for a failure elsewhere.

The learner blocks in `next()` of the ATDP loader's stream until rollout workers commit new
episodes. If every worker has died, that `next()` would wait forever. `guarded` runs each
`next()` in a helper thread, only while the caller waits for it (so the iterator is idle, and
checkpointable, between items), and polls `check()` meanwhile; when `check()` raises, the
blocked `next()` is abandoned: an asynchronous exception ends the helper at its next Python
instruction (the stream's poll loop runs one every poll interval), so no thread outlives the
iteration. An iterator abandoned that way must not be used again.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class _Abandoned(BaseException):
    """Raised inside the helper thread to end a `next()` nobody waits for any more."""


def _raise_in(thread: threading.Thread, exception: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident), ctypes.py_object(exception)
    )


def guarded(
    iterator: Iterator[T], check: Callable[[], None], *, poll_s: float = 0.2
) -> Iterator[T]:
    """Yield the items of `iterator`; call `check()` every `poll_s` while waiting for one and
    let its exception end the iteration (the pending `next()` is abandoned)."""
    requests: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()
    state = threading.Lock()
    fetching = False

    def pump() -> None:
        try:
            while requests.get():
                try:
                    item = (True, next(iterator))
                except _Abandoned:
                    return
                except BaseException as e:  # StopIteration included: handed to the caller
                    item = (False, e)
                results.put(item)
                if not item[0]:
                    return
        except _Abandoned:  # arrived just after the fetch finished
            return

    helper = threading.Thread(target=pump, name="guarded-iterator", daemon=True)
    helper.start()
    try:
        while True:
            with state:
                fetching = True
            requests.put(True)
            while True:
                try:
                    ok, value = results.get(timeout=poll_s)
                    break
                except queue.Empty:
                    check()
            with state:
                fetching = False
            if not ok:
                if isinstance(value, StopIteration):
                    return
                raise value
            yield value
    finally:
        requests.put(False)
        with state:
            if fetching and helper.is_alive():
                _raise_in(helper, _Abandoned)
        helper.join(timeout=10.0)
