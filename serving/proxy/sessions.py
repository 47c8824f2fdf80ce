"""The data proxy's trajectories: one open ATDP trajectory per session, written durably.

A session's trajectory id is its session id. Every append goes through the tenant partition's
single `PartitionWriter` on a thread pool, so the event loop never waits on disk and concurrent
sessions share group commits; a call returns only once its records are committed. Session
state (the conversation recorded so far, interaction ids -> event indices) lives in memory and
is rebuilt from the trajectory itself after a restart.

Deletion and consent withdrawal run through the store (`AtdpStore.delete_trajectories`,
`withdraw_consent`), which uses this book's live writer of the tenant; a deleted session's
state is dropped, so it cannot be written to again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from atdp_io import (
    AtdpStore,
    Envelope,
    Event,
    EventKind,
    Outcome,
    PartitionLockedError,
    PartitionWriter,
    Redactor,
    TrajectoryHeader,
    TrajectoryNotFound,
    TrajectorySession,
    codec,
)
from atdp_io.governance import EligibilityPolicy, ineligibility_reason
from serving.common.errors import ApiError
from serving.common.governance import governance_from_json
from serving.proxy.conversation import Canonical, canonical
from serving.proxy.prefix import SampledTurn, TurnIndex
from serving.proxy.recording import conversation_from_events, is_first_sample

T = TypeVar("T")

# A scheduled purge of a tenant this proxy has not written yet holds a short-lived writer of
# its own; opening ours meanwhile is retried this many times, this far apart.
_LOCK_RETRIES, _LOCK_RETRY_S = 50, 0.1


@dataclasses.dataclass
class SessionState:
    """What the proxy knows about one session's trajectory."""

    session_id: str
    tenant: str
    writer_session: TrajectorySession | None  # None once closed
    known: list[Canonical] = dataclasses.field(default_factory=list)
    interactions: dict[str, int] = dataclasses.field(default_factory=dict)
    turns: TurnIndex = dataclasses.field(default_factory=TurnIndex)  # sampled turns, prefix.py
    reported: set[str] = dataclasses.field(default_factory=set)  # tool call ids on /rl/event
    last_llm: int | None = None
    cost_usd: float = 0.0  # sum of the recorded llm_calls' metadata.cost_usd
    composite: dict[str, Any] | None = None  # attribution of the last call's composite
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)

    @property
    def closed(self) -> bool:
        return self.writer_session is None


class SessionBook:
    """Writers per tenant, session states, and the durable operations on them."""

    def __init__(
        self,
        store: AtdpStore,
        redactor_factory: Callable[[], Redactor],
        threads: int,
        envelope: Envelope,
    ):
        self.store = store
        self._redactor_factory = redactor_factory
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="atdp-write")
        self._writers: dict[str, PartitionWriter] = {}
        self._writer_lock = asyncio.Lock()
        self._sessions: dict[str, SessionState] = {}
        self._load_locks: dict[str, asyncio.Lock] = {}
        self.envelope = envelope

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking storage work on the writer pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def writer(self, tenant: str) -> PartitionWriter:
        writer = self._writers.get(tenant)
        if writer is not None:
            return writer
        async with self._writer_lock:
            if tenant not in self._writers:
                redactor = self._redactor_factory()
                for attempt in range(_LOCK_RETRIES):
                    try:
                        writer = await self.run(self.store.writer, tenant, redactor=redactor)
                        break
                    except PartitionLockedError:
                        if attempt == _LOCK_RETRIES - 1:
                            raise
                        await asyncio.sleep(_LOCK_RETRY_S)
                self._writers[tenant] = writer
            return self._writers[tenant]

    async def open(
        self,
        session_id: str,
        tenant: str,
        governance: Mapping[str, Any],
        task: Mapping[str, Any],
        created_at: float | None = None,
    ) -> SessionState:
        """Start the session's trajectory (its header is durable on return)."""
        try:
            header = TrajectoryHeader(
                trajectory_id=session_id,
                governance=governance_from_json(tenant, governance),
                created_at=created_at or time.time(),
                session_id=session_id,
                task=dict(task),
                envelope=self.envelope,
            )
        except ValueError as error:  # SchemaError names the field
            raise ApiError(400, f"invalid session governance or task: {error}") from None
        writer = await self.writer(tenant)
        writer_session = await self.run(writer.open_trajectory, header)
        state = SessionState(session_id, tenant, writer_session)
        self._sessions[session_id] = state
        return state

    def known(self, session_id: str) -> SessionState | None:
        """The session's state if this process holds it."""
        return self._sessions.get(session_id)

    async def get(self, session_id: str, tenant: str) -> SessionState:
        """The session's state, rebuilt from its trajectory if this process has not seen it."""
        state = self._sessions.get(session_id)
        if state is not None:
            if state.tenant != tenant:  # the gateway never routes this; refuse anyway
                raise ApiError(404, f"no session {session_id!r} for this tenant")
            return state
        lock = self._load_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            if session_id not in self._sessions:
                self._sessions[session_id] = await self._load(session_id, tenant)
        return self._sessions[session_id]

    async def _load(self, session_id: str, tenant: str) -> SessionState:
        writer = await self.writer(tenant)

        def read():
            # serving a session back, not training: only expiry is refused (atdp_io governance)
            reader = self.store.reader(tenant, principal=tenant, purpose="serving")
            reader.refresh()
            trajectory = reader.read(session_id)
            session = None if trajectory.closed else writer.resume(session_id)
            return trajectory, session

        try:
            trajectory, writer_session = await self.run(read)
        except TrajectoryNotFound:
            raise ApiError(
                404, f"no session {session_id!r} for this tenant", code="session_not_found"
            ) from None
        state = SessionState(session_id, tenant, writer_session)
        state.known = [canonical(m) for m in conversation_from_events(trajectory.events)]
        for index, event in enumerate(trajectory.events):
            if event.kind == EventKind.LLM_CALL:
                state.cost_usd += event.metadata.cost_usd or 0.0
                if is_first_sample(event):  # as recorder.py moves it
                    state.last_llm = index
                if event.metadata.interaction_id:
                    state.interactions[event.metadata.interaction_id] = index
            if event.metadata.extra.get("reported") and event.action is not None:
                state.reported.update(c.call_id for c in event.action.tool_calls if c.call_id)
            if event.kind == EventKind.LLM_CALL:
                key = event.metadata.extra.get("conversation_key")
                if key:
                    context = np.concatenate([event.llm.input_ids, event.llm.output_ids])
                    state.turns.add(SampledTurn(key, context, event.metadata.interaction_id))
        return state

    async def append(self, state: SessionState, events: Sequence[Event]) -> list[int]:
        """Append events to an open session; durable on return."""
        if state.writer_session is None:
            raise ApiError(409, f"session {state.session_id!r} has ended", code="session_ended")
        return await self.run(state.writer_session.append_events, list(events))

    async def close(self, state: SessionState, outcome: Outcome) -> None:
        if state.writer_session is None:
            raise ApiError(
                409, f"session {state.session_id!r} has already ended", code="session_ended"
            )
        await self.run(state.writer_session.close, outcome)
        state.writer_session = None

    async def add_reward(
        self, state: SessionState, value: float, event_index: int | None, source: str
    ) -> None:
        """A late-bound reward (appended; the recorded events are never rewritten)."""
        writer = await self.writer(state.tenant)
        await self.run(
            writer.add_reward, state.session_id, value, event_index=event_index, source=source
        )

    async def delete(
        self, tenant: str, *, requested_by: str, reason: str, **selector: Any
    ) -> list[str]:
        """Erases `tenant`'s trajectories matching `selector` (session_id, user_id or
        trajectory_ids); returns their ids. Audited by the store.

        The tenant's live sessions are locked meanwhile (a call holds its session's lock only
        while it appends), so no append races the erasure: a deleted session's next call finds
        it ended (409) instead of a writer that no longer knows its trajectory.
        """
        await self.writer(tenant)  # the store then purges through this live writer
        async with contextlib.AsyncExitStack() as held:
            for state in [s for s in self._sessions.values() if s.tenant == tenant]:
                await held.enter_async_context(state.lock)
            deleted = await self.run(
                self.store.delete_trajectories,
                tenant,
                requested_by=requested_by,
                reason=reason,
                **selector,
            )
            for trajectory_id in deleted:
                state = self._sessions.pop(trajectory_id, None)
                if state is not None:
                    state.writer_session = None  # its writer state is gone with the data
        return deleted

    async def withdraw_consent(
        self, tenant: str, *, requested_by: str, **selector: Any
    ) -> list[str]:
        """Marks consent withdrawn on `tenant`'s trajectories matching `selector` (a governance
        update each; training readers then skip them). Audited by the store."""
        await self.writer(tenant)
        return await self.run(
            self.store.withdraw_consent, tenant, requested_by=requested_by, **selector
        )

    async def export(
        self,
        tenant: str | None,
        *,
        requested_by: str,
        session_id: str | None = None,
        eligible_only: bool = False,
        include_open: bool = True,
    ) -> AsyncIterator[bytes]:
        """Trajectories of `tenant` (None: every tenant in the store) as atdp_io export JSON
        lines; each tenant's export is recorded in its audit log."""
        tenants = [tenant] if tenant is not None else await self.run(self.store.tenants)
        for name in tenants:
            reader, entries, now = await self.run(
                self._export_entries, name, requested_by, session_id, eligible_only, include_open
            )
            for begin in range(0, len(entries), 16):
                # checked at the listing's instant: a record that expires while the export
                # streams was listed as allowed, and must not cut the stream short
                chunk = entries[begin : begin + 16]
                batch = await self.run(reader.read_entries, chunk, now=now)
                for trajectory in batch:
                    line = {"tenant": name, "trajectory": codec.trajectory_to_export(trajectory)}
                    yield (json.dumps(line, ensure_ascii=False) + "\n").encode()

    def _export_entries(self, tenant, requested_by, session_id, eligible_only, include_open):
        reader = self.store.reader(tenant, principal=tenant, purpose="export")
        reader.refresh()
        now = time.time()
        entries = reader.entries(closed_only=not include_open, now=now)
        if session_id is not None:
            entries = [e for e in entries if e.trajectory_id == session_id]
        if eligible_only:
            policy, records = EligibilityPolicy(), reader.index.records
            entries = [
                e
                for e in entries
                if not ineligibility_reason(e.governance(), e.redaction(records), now, policy)
            ]
        self.store.access.audit(
            tenant,
            principal=requested_by,
            action="export",
            purpose="export",
            allowed=True,
            detail={"trajectories": len(entries), "session_id": session_id},
        )
        return reader, entries, now

    async def shutdown(self) -> None:
        for writer in self._writers.values():
            await self.run(writer.close)
        self._writers.clear()
        self._pool.shutdown(wait=True)
