"""Reading a window of a tenant's ATDP trajectories: by time, composite version, newest N.

The control plane reads as the tenant itself (its own partition, `principal` = the tenant)
for the purpose `evaluation` by default, which refuses only expired data; pass
`purpose="training"` to honour training eligibility too (what a policy update must train on).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from atdp_io import AtdpStore, SchemaError, Trajectory
from atdp_io.schema import check_tenant_id
from serving.control.facts import served_version
from serving.control.store import ControlError, InvalidTenant


class UnknownTenant(ControlError):
    """A tenant with no ATDP partition: nothing was ever recorded for it."""


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """Which trajectories of `tenant` to read.

    since / until: `header.created_at` bounds, unix seconds (since inclusive, until exclusive;
      None: open).
    versions: only trajectories served entirely by one of these composite versions (None: any).
    limit: the newest `limit` after the filters (None: all).
    closed_only: leave out trajectories still being written.
    purpose: the reader's purpose (see the module docstring).
    """

    tenant: str
    since: float | None = None
    until: float | None = None
    versions: tuple[int, ...] | None = None
    limit: int | None = None
    closed_only: bool = True
    purpose: str = "evaluation"

    def __post_init__(self):
        try:
            check_tenant_id(self.tenant)
        except SchemaError as error:
            raise InvalidTenant(f"invalid tenant {self.tenant!r}: {error}") from None
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
                raise ControlError(f"window.{name}: expected unix seconds, got {value!r}")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ControlError(f"window: until ({self.until}) must be after since ({self.since})")
        if self.versions is not None:
            object.__setattr__(self, "versions", tuple(self.versions))
            if not all(isinstance(v, int) and v >= 0 for v in self.versions):
                raise ControlError(f"window.versions: expected versions >= 0, got {self.versions}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ControlError(f"window.limit: expected a positive integer, got {self.limit!r}")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["versions"] = None if self.versions is None else list(self.versions)
        return out


def read_window(atdp: AtdpStore, spec: WindowSpec) -> list[Trajectory]:
    """The trajectories of `spec`, oldest first. An unknown tenant is an `UnknownTenant`
    error; an empty result is returned as such (`analyse` refuses it)."""
    known = atdp.tenants()
    if spec.tenant not in known:
        raise UnknownTenant(
            f"tenant {spec.tenant!r} has no recorded trajectories (tenants with data: {known})"
        )
    reader = atdp.reader(spec.tenant, principal=spec.tenant, purpose=spec.purpose)
    reader.refresh()
    entries = [
        e
        for e in reader.entries(closed_only=spec.closed_only)
        if (spec.since is None or e.header.created_at >= spec.since)
        and (spec.until is None or e.header.created_at < spec.until)
    ]
    entries.sort(key=lambda e: e.header.created_at)
    trajectories = reader.read_entries(entries) if entries else []
    if spec.versions is not None:
        wanted = set(spec.versions)
        trajectories = [t for t in trajectories if served_version(t) in wanted]
    if spec.limit is not None:
        trajectories = trajectories[-spec.limit :]
    return trajectories
