"""Retention on a schedule: purge expired trajectories every few seconds, on a thread.

```python
schedule = PurgeSchedule(store, every_s=600.0).start()   # every tenant, as operator:retention
...
schedule.stop()                                           # waits for a purge in progress
```

Readers already refuse expired data at read time (governance.py); the schedule erases its
bytes. It purges through the process's live writer of a partition when there is one (see
`AtdpStore`), so a serving process or a learner that writes runs it beside its writers. A
partition whose writer lives in another process is skipped on that run (`PartitionLockedError`,
counted and logged) and tried again on the next.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from atdp_io.access import is_operator
from atdp_io.governance import is_expired
from atdp_io.reader import PartitionReader
from atdp_io.store import AtdpStore

log = logging.getLogger(__name__)

RETENTION_PRINCIPAL = "operator:retention"


class PurgeSchedule:
    """Runs `store.purge_expired` for `tenants` (None: every tenant at each run) every `every_s`
    seconds as `principal` (an operator, or the tenant itself when there is one tenant)."""

    def __init__(
        self,
        store: AtdpStore,
        *,
        every_s: float,
        tenants: Sequence[str] | None = None,
        principal: str = RETENTION_PRINCIPAL,
    ):
        if isinstance(every_s, bool) or not isinstance(every_s, int | float) or not every_s > 0:
            raise ValueError(f"PurgeSchedule: every_s must be a number > 0, got {every_s!r}")
        tenants = list(tenants) if tenants is not None else None
        if not is_operator(principal) and tenants != [principal]:
            raise ValueError(
                f"PurgeSchedule: principal {principal!r} must be an operator "
                "(operator:<name>) or the single tenant it purges"
            )
        self.store = store
        self.every_s = float(every_s)
        self.tenants = tenants
        self.principal = principal
        self.stats = {"runs": 0, "purged": 0, "errors": 0}
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._readers: dict[str, PartitionReader] = {}

    def run_once(self, now: float | None = None) -> dict[str, list[str]]:
        """One pass: purges every tenant's expired trajectories; returns their ids by tenant.

        A tenant that fails (its writer held elsewhere, an I/O error) is logged, counted in
        `stats["errors"]` and left for the next pass; the others are still purged.
        """
        purged = {}
        for tenant in self.tenants if self.tenants is not None else self.store.tenants():
            try:
                if not self._has_expired(tenant, now):
                    continue  # nothing to do: no writer opened, no audit entry written
                ids = self.store.purge_expired(tenant, principal=self.principal, now=now)
            except Exception as err:
                self.stats["errors"] += 1
                self.last_error = err
                log.warning("retention: purge of %r failed: %s", tenant, err)
                continue
            if ids:
                purged[tenant] = ids
                self.stats["purged"] += len(ids)
                log.info("retention: purged %d expired trajectories of %r", len(ids), tenant)
        self.stats["runs"] += 1
        return purged

    def _has_expired(self, tenant: str, now: float | None) -> bool:
        """From an index-only reader kept per tenant (opened, and audited, once)."""
        reader = self._readers.get(tenant)
        if reader is None:
            reader = self.store.reader(tenant, principal=self.principal, purpose="purge")
            self._readers[tenant] = reader
        reader.refresh()
        now = self.store.clock() if now is None else now
        return any(
            is_expired(e.governance(), now)
            for e in reader.index.by_id.values()  # open trajectories expire too
        )

    def start(self) -> PurgeSchedule:
        """Starts the background thread (a first pass runs at once); returns self."""
        if self._thread is not None:
            raise RuntimeError("PurgeSchedule: already started")
        self._thread = threading.Thread(target=self._loop, name="atdp-retention", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stops the thread, waiting (up to `timeout`) for a pass in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> PurgeSchedule:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.every_s)
