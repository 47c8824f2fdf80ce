"""Which trajectories a deletion or consent-withdrawal request selects, and its validation.

A request names its trajectories by one or more selectors, combined with AND:
- `session_id`: the header's `session_id` (the serving stack sets it to the session's id, which
  is also its trajectory id),
- `user_id`: the header's `task["user_id"]`, a string the writer recorded for the end user
  (nothing else is searched: no event payload, no metadata),
- `trajectory_ids`: explicit ids; one not in the partition (never written, or already erased)
  matches nothing, so a repeated request is idempotent.

Selection reads only the index (headers), never content. A bad request raises before anything
is written: `ValueError` for a malformed one, `UnknownTenantError` for a tenant without a
partition.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from atdp_io.index import PartitionIndex


class UnknownTenantError(LookupError):
    """The store has no partition for this tenant."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """A validated request's selectors (None: not used)."""

    session_id: str | None = None
    user_id: str | None = None
    trajectory_ids: tuple[str, ...] | None = None

    def as_detail(self) -> dict[str, Any]:
        """The selectors as an audit entry's detail."""
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "trajectory_ids": list(self.trajectory_ids) if self.trajectory_ids else None,
        }


def check_request(
    what: str,
    *,
    requested_by: Any,
    session_id: Any = None,
    user_id: Any = None,
    trajectory_ids: Any = None,
) -> Selection:
    """Validates a request's principal and selectors; raises `ValueError` naming the problem."""
    if not isinstance(requested_by, str) or not requested_by:
        raise ValueError(f"{what}: requested_by must be a non-empty string, got {requested_by!r}")
    for name, value in (("session_id", session_id), ("user_id", user_id)):
        # An empty id would match every trajectory written without one (all rollouts).
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{what}: {name} must be a non-empty string, got {value!r}")
    ids = None
    if trajectory_ids is not None:
        if isinstance(trajectory_ids, str | bytes) or not isinstance(trajectory_ids, Sequence):
            raise ValueError(f"{what}: trajectory_ids must be a list of strings")
        if not trajectory_ids:
            raise ValueError(f"{what}: trajectory_ids is empty")
        bad = [t for t in trajectory_ids if not isinstance(t, str) or not t]
        if bad:
            raise ValueError(f"{what}: trajectory_ids must be non-empty strings, got {bad[:3]!r}")
        ids = tuple(dict.fromkeys(trajectory_ids))
    if session_id is None and user_id is None and ids is None:
        raise ValueError(f"{what}: give session_id, user_id or trajectory_ids")
    return Selection(session_id, user_id, ids)


def select(index: PartitionIndex, selection: Selection, tenant: str) -> list[str]:
    """Ids of the committed, unpurged trajectories (open ones too) the selection matches.

    A listed id that is not in the partition (never written, or already erased) matches
    nothing: a deletion or withdrawal is idempotent, so a client that retries after a lost
    reply gets a success with fewer ids, not an error."""
    if selection.trajectory_ids is not None:
        candidates = [index.by_id[t] for t in selection.trajectory_ids if t in index.by_id]
    else:
        candidates = list(index.by_id.values())
    chosen = []
    for entry in candidates:
        header = entry.header
        if selection.session_id is not None and header.session_id != selection.session_id:
            continue
        if selection.user_id is not None and header.task.get("user_id") != selection.user_id:
            continue
        chosen.append(entry.trajectory_id)
    return chosen
