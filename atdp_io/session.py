"""A trajectory written event by event (the serving data proxy's path).

Each call returns once its records are committed, so every acknowledged event survives a crash
of the writer; concurrent sessions share commits (see writer.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from atdp_io.schema import Event, Outcome


class TrajectoryWriter(Protocol):
    """What a session needs of its writer (`PartitionWriter`): each call durable on return."""

    def append_events(self, trajectory_id: str, events: Sequence[Event]) -> list[int]: ...

    def add_reward(
        self, trajectory_id: str, value: float, *, event_index: int | None, source: str
    ) -> None: ...

    def close_trajectory(self, trajectory_id: str, outcome: Outcome) -> None: ...


class TrajectorySession:
    """An open trajectory being written event by event; each call is durable on return.

    Used as a context manager, an exception inside the block closes the trajectory as truncated
    with the error class recorded.
    """

    def __init__(self, writer: TrajectoryWriter, trajectory_id: str):
        self._writer = writer
        self.trajectory_id = trajectory_id

    def append_event(self, event: Event) -> int:
        return self._writer.append_events(self.trajectory_id, [event])[0]

    def append_events(self, events: Sequence[Event]) -> list[int]:
        return self._writer.append_events(self.trajectory_id, events)

    def add_reward(self, value: float, *, event_index: int | None = None, source: str = "late"):
        self._writer.add_reward(self.trajectory_id, value, event_index=event_index, source=source)

    def close(self, outcome: Outcome | None = None) -> None:
        self._writer.close_trajectory(self.trajectory_id, outcome or Outcome())

    def __enter__(self) -> TrajectorySession:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            info = {"error_class": exc_type.__name__}
            self.close(Outcome(success=False, terminated=False, info=info))
