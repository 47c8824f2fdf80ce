"""Which stored trajectories form one group that a batch must hold whole (`LoaderConfig.group_by`).

A GRPO group (the G rollouts of one prompt) is scored against itself: a member that lands in
another batch than the rest of its group gets a baseline from the wrong members. The rollout
engine commits a group in one append, and one append's trajectories close consecutively in the
partition's commit order and become visible in the same refresh. So a group is a *run*: the
trajectories that are consecutive in a tenant's close order and share a key read from their
headers (`group_by`). Runs are found from the index alone, before any trajectory is read.

A trajectory without the key (a purged one, a demonstration without the field) is a group of
its own. Two appends of the same key that commit back to back form one run; keys unique per
group (the rollout's `task.group_key`) never do.
"""

from __future__ import annotations

from collections.abc import Hashable

from atdp_io.index import PartitionIndex
from atdp_io.schema import TrajectoryHeader

# Header attributes a group key may be read from; `task.<name>` reads one entry of the task.
HEADER_FIELDS = ("session_id", "trajectory_id")


def check_group_by(group_by: str | None) -> None:
    """Raises ValueError unless `group_by` is None, a header field or `task.<name>`."""
    if group_by is None:
        return
    if not isinstance(group_by, str):
        raise ValueError(f"LoaderConfig.group_by must be a str or None, got {group_by!r}")
    if group_by in HEADER_FIELDS:
        return
    if group_by.startswith("task.") and len(group_by) > len("task."):
        return
    raise ValueError(
        f"LoaderConfig.group_by={group_by!r} names no header field: use one of "
        f"{HEADER_FIELDS} or 'task.<name>' (e.g. 'task.group_key', which rollouts write)"
    )


def group_key(header: TrajectoryHeader | None, group_by: str) -> Hashable | None:
    """The value of `group_by` in `header`, None when the header (or the field) is absent."""
    if header is None:
        return None
    if group_by in HEADER_FIELDS:
        return getattr(header, group_by) or None
    value = header.task.get(group_by[len("task.") :])
    if isinstance(value, dict | list):  # JSON containers are not hashable; compare them as text
        return repr(value)
    return value


def run_length_at(index: PartitionIndex, start: int, group_by: str) -> int:
    """How many trajectories from `start` in `index.close_order` share its key (>= 1)."""
    order = index.close_order
    key = group_key(index.by_row[order[start]].header, group_by)
    end = start + 1
    if key is not None:
        while end < len(order) and group_key(index.by_row[order[end]].header, group_by) == key:
            end += 1
    return end - start
