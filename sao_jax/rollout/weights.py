"""Versioned, atomic weight publication from the learner to rollout workers.

The learner calls `publish(params, version)` after a policy step; workers call `latest()` (or
`sync_sampler`) between decode dispatches and swap in the newest complete snapshot. A snapshot
is published by replacing one reference under a lock, so a reader sees either the old or the
new (params, version) pair, never a mix.

Donation: the learner's jitted train steps may donate parameter buffers, which deletes them
once the next step runs. `publish` therefore stores its own device copy (`jax.device_put`
with `may_alias=False`), optionally placed straight onto the rollout mesh's shardings; the
learner may donate its buffers as soon as `publish` returns.

With `shardings` of another mesh (disaggregated rollout), the copy is resharded there by
`sao_jax.distributed.reshard`: a device-to-device `device_put` within a process or over the
same devices, else through host memory across hosts. The version is what workers compare.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from sao_jax.distributed.resharding import reshard
from sao_jax.rollout.sampler import Sampler


@dataclasses.dataclass(frozen=True, eq=False)
class WeightSnapshot:
    """One published parameter set: `params` (an nnx.State the publisher owns), `version`,
    and `published_at` (unix seconds)."""

    params: nnx.State
    version: int
    published_at: float


class WeightPublisher:
    """Holds the latest published snapshot; thread-safe.

    Args:
      shardings: optional pytree of shardings matching the params (e.g. the rollout mesh's);
        the published copy is placed there. None keeps the learner's placement.
    """

    def __init__(self, *, shardings: Any = None):
        self._shardings = shardings
        self._snapshot: WeightSnapshot | None = None
        self._cond = threading.Condition()
        self._listeners: list[Callable[[WeightSnapshot], None]] = []

    @property
    def version(self) -> int:
        """The latest published version (-1 before the first publish)."""
        snapshot = self._snapshot
        return -1 if snapshot is None else snapshot.version

    def latest(self) -> WeightSnapshot | None:
        """The latest complete snapshot, or None before the first publish."""
        return self._snapshot

    def publish(self, params: nnx.State | nnx.Module, version: int) -> WeightSnapshot:
        """Copy `params` (a model or its state) and make them the latest, stamped `version`.

        Versions must strictly increase. Listeners run after the swap, in this thread.
        """
        if isinstance(params, nnx.Module):
            params = nnx.state(params)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        current = self.version
        if version <= current:
            raise ValueError(f"version {version} is not newer than the published {current}")
        # Block until the copy exists: the caller may donate the originals right after.
        if self._shardings is None:
            copy = jax.block_until_ready(jax.device_put(params, may_alias=False))
        else:  # another mesh, possibly across hosts (sao_jax.distributed.resharding)
            copy = reshard(params, self._shardings)
        snapshot = WeightSnapshot(copy, version, time.time())
        with self._cond:
            if version <= self.version:  # a concurrent publish won the race
                raise ValueError(
                    f"version {version} is not newer than the published {self.version}"
                )
            self._snapshot = snapshot
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(snapshot)
        return snapshot

    def wait_for_version(self, version: int, timeout: float | None = None) -> WeightSnapshot:
        """Block until a snapshot of at least `version` is published; TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.version >= version, timeout):
                raise TimeoutError(
                    f"no weights of version >= {version} within {timeout} s "
                    f"(latest: {self.version})"
                )
            return self._snapshot

    def subscribe(self, listener: Callable[[WeightSnapshot], None]) -> Callable[[], None]:
        """Call `listener(snapshot)` after every publish; returns an unsubscribe function."""
        with self._cond:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._cond:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe


def sync_sampler(sampler: Sampler, publisher: WeightPublisher) -> bool:
    """Swap the publisher's latest snapshot into `sampler` if it is newer; True if swapped."""
    snapshot = publisher.latest()
    if snapshot is None or snapshot.version <= sampler.policy_version:
        return False
    sampler.update_weights(snapshot.params, snapshot.version)
    return True
