"""How many episodes a rollout engine may start: AReaL's staleness capacity over OUTSTANDING
episodes, so that episodes the learner will never wait for again stop blocking admission.

With eta = `max_staleness`, B = `episodes_per_version`, v = the latest published version and
v0 the version published when the engine was built:

    outstanding = started - dropped - max((v - v0) * B, consumed)
    a group of n starts only while outstanding + n <= (eta + 1) * B

- `dropped`: episodes the engine discarded as stale at completion (never written);
- `(v - v0) * B`: AReaL's assumption that each version published since trained on B episodes
  (counted from v0, so an engine built for a resumed run at version 50 does not start 50 * B
  episodes at once);
- `consumed`: episodes the learner's side reported as taken off its stream (trained on, or
  dropped by the loader as stale / too long / ineligible), through `mark_consumed`.

Without consumer reports this is AReaL's rule (started - dropped <= (eta + v - v0 + 1) * B).
Counting ever-started episodes alone livelocks whenever the learner passes episodes without
publishing a version (the loader drops them, or a policy step is skipped): nothing new may
start, so nothing new arrives, so no version is ever published. With the reports, a consumer
that has drained its stream leaves only the episodes in flight (or not yet read) outstanding,
and admission reopens. The bounded-staleness guarantee does not rest on admission: the engine
drops stale groups at completion and the loader filters by version at batch time.

Pure bookkeeping (not thread-safe): `RolloutEngine` calls it under its lock.
"""

from __future__ import annotations

import math


class AdmissionBudget:
    """Outstanding-episode accounting behind `RolloutEngine`'s admission.

    Args:
      max_staleness: eta >= 0, versions a sample may lag the latest weights.
      episodes_per_version: B >= 1, episodes the learner trains on per policy version.
      first_version: v0, the latest published version when admission begins (< 0: none).
    """

    def __init__(self, max_staleness: int, episodes_per_version: int, first_version: int = 0):
        if not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0, got {max_staleness!r}")
        if not isinstance(episodes_per_version, int) or episodes_per_version < 1:
            raise ValueError(
                f"episodes_per_version must be a positive int, got {episodes_per_version!r}"
            )
        self.capacity = (max_staleness + 1) * episodes_per_version
        self.first_version = max(first_version, 0)
        self.episodes_per_version = episodes_per_version
        self.started = 0
        self.dropped = 0
        self.consumed = 0
        self.committed = 0
        # (commit time, episodes) of written groups the consumer has not reported passing yet
        self._unconsumed: list[tuple[float, int]] = []

    def outstanding(self, version: int) -> int:
        """Episodes still counted against admission at published `version` (< 0: none yet)."""
        published = max(version - self.first_version, 0)
        retired = max(published * self.episodes_per_version, self.consumed)
        return self.started - self.dropped - retired

    def try_start(self, n: int, version: int) -> bool:
        """Start a group of `n` episodes if the budget allows it at `version`."""
        if n < 1:
            raise ValueError(f"a group has at least one episode, got n={n}")
        if self.outstanding(version) + n > self.capacity:
            return False
        self.started += n
        return True

    def drop(self, n: int) -> None:
        """`n` started episodes were discarded (stale at completion): never written."""
        self._check_count("drop", n)
        self.dropped += n

    def commit(self, n: int, at: float) -> None:
        """`n` started episodes became durable in the buffer at `time.monotonic()` `at`."""
        self._check_count("commit", n)
        self.committed += n
        self._unconsumed.append((at, n))

    def mark_consumed(self, committed_before: float) -> int:
        """The consumer has passed every episode committed before `committed_before` (a
        `time.monotonic()` value); returns how many episodes that newly retires."""
        if not isinstance(committed_before, int | float) or not math.isfinite(committed_before):
            raise ValueError(
                f"committed_before must be a finite time.monotonic() value, got "
                f"{committed_before!r}"
            )
        retired = sum(n for at, n in self._unconsumed if at <= committed_before)
        self._unconsumed = [(at, n) for at, n in self._unconsumed if at > committed_before]
        self.consumed += retired
        return retired

    @staticmethod
    def _check_count(what: str, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{what}: expected a positive episode count, got {n!r}")
