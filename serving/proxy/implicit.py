"""Sessions for unmodified agents: tenant-key chat calls grouped into trajectories by prefix.

An agent that only has a tenant key (no `/rl/start_session`) still resends its conversation on
every call. A tenant-key chat call whose messages extend a reply this proxy generated for the
same tenant (the conversation key of a sampled turn, `prefix.py`) joins that reply's
trajectory; any other call opens a new one (task `{"implicit": true}`). So a multi-turn agent
becomes one multi-turn trajectory, with token-exact prompts, and a reward posted with a
completion id (`/rl/set_reward {"interaction_id"}`, tenant key) finds it.

An implicit trajectory is closed after `idle_s` seconds without a call (and when the proxy
shuts down); rewards may still arrive afterwards. Two agents whose conversations are identical
up to a reply (same messages, same sampled reply) cannot be told apart and share a trajectory
(as branches). With several data proxies, only calls that reach the same proxy are grouped.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class ImplicitSessions:
    """The open implicit sessions of every tenant, and the conversation keys that lead there."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._keys: dict[str, dict[str, str]] = {}  # tenant -> conversation key -> session id
        self._used: dict[str, tuple[str, float]] = {}  # session id -> (tenant, last call time)
        self._busy: dict[str, int] = {}  # session id -> calls in flight

    def find(self, tenant: str, keys: Sequence[str]) -> str | None:
        """The open session whose latest matching reply is the longest proper prefix of the
        conversation that `keys` name (`prefix.conversation_keys`), or None."""
        known = self._keys.get(tenant)
        if not known:
            return None
        for covered in range(len(keys) - 2, 0, -1):
            session_id = known.get(keys[covered])
            if session_id is not None and session_id in self._used:
                return session_id
        return None

    def begin(self, tenant: str, session_id: str) -> None:
        """A call of the session started (a new session is open from now on); not idle
        until `done`."""
        self._used[session_id] = (tenant, time.monotonic())
        self._busy[session_id] = self._busy.get(session_id, 0) + 1

    def done(self, session_id: str) -> None:
        """A call ended (answered, refused or abandoned); idle time counts from now."""
        count = self._busy.pop(session_id, 1) - 1
        if count > 0:
            self._busy[session_id] = count
        self.touch(session_id)

    def touch(self, session_id: str) -> None:
        if session_id in self._used:
            self._used[session_id] = (self._used[session_id][0], time.monotonic())

    def note_turn(self, tenant: str, key: str, session_id: str) -> None:
        """A reply was recorded in `session_id`: a call extending it joins that session."""
        if session_id in self._used:
            self._keys.setdefault(tenant, {})[key] = session_id
            self.touch(session_id)

    def idle(self, now: float | None = None) -> list[str]:
        """Sessions without a call for `idle_s` seconds."""
        now = time.monotonic() if now is None else now
        return [
            s
            for s, (_, used) in self._used.items()
            if now - used >= self.idle_s and not self._busy.get(s)
        ]

    def open_sessions(self) -> list[str]:
        return list(self._used)

    def forget(self, session_id: str) -> None:
        """The session closed: later calls extending it open a new one."""
        tenant, _ = self._used.pop(session_id, (None, 0.0))
        self._busy.pop(session_id, None)
        keys = self._keys.get(tenant, {})
        for key in [k for k, s in keys.items() if s == session_id]:
            del keys[key]
