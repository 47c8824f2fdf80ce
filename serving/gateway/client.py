"""A client of the gateway's RL endpoints, for agent harnesses and the learner.

Completions go through the official `openai` client (`session.openai()`); this client covers
what OpenAI's API has no words for: sessions, rewards, export and the admin operations.

    gateway = GatewayClient("http://127.0.0.1:8000", admin_key)
    session = gateway.start_session("acme", task_id="ticket-42")
    reply = session.openai().chat.completions.create(model=..., messages=[...])
    with session.timed("tool", "search", arguments=args, call_id=call.id) as event:
        event.result = search(**args)              # the agent's own tool: latency, errors
    session.set_reward(1.0, interaction_id=reply.id)
    session.end(success=True)                       # its answer has the session's cost_usd
    gateway.delete("acme", user_id="user-7")        # or withdraw_consent(...): data rights

Synchronous, over urllib (`serving.common.client.BlockingClient`); errors come back as
`ApiError` with the server's status and OpenAI error fields (an unreachable gateway: 503).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

from serving.common.client import BlockingClient


@dataclasses.dataclass
class TimedEvent:
    """What `Session.timed` reports: set `result` (and any /rl/event field in `fields`)."""

    fields: dict[str, Any]
    result: Any = None


def type_name(error: BaseException) -> str:
    return type(error).__name__


@dataclasses.dataclass(frozen=True)
class Session:
    """A started session: its id and key, bound to the gateway that issued it."""

    gateway_url: str
    session_id: str
    api_key: str
    model: str | None
    timeout_s: float = 120.0

    def _client(self) -> BlockingClient:
        return BlockingClient(self.gateway_url, api_key=self.api_key, timeout_s=self.timeout_s)

    def openai(self, **kwargs: Any):
        """An `openai.OpenAI` client whose calls are recorded in this session."""
        import openai

        return openai.OpenAI(base_url=self.gateway_url + "/v1", api_key=self.api_key, **kwargs)

    def set_reward(
        self, reward: float, *, interaction_id: str | None = None, source: str = "user"
    ) -> dict[str, Any]:
        """Reward one completion (its response id) or, without one, the last completion."""
        body = {"reward": reward, "interaction_id": interaction_id, "source": source}
        return self._client().call("/rl/set_reward", body)

    def event(self, type: str, name: str, **fields: Any) -> dict[str, Any]:
        """Report a tool call, retrieval, memory operation or approval (`type` "tool",
        "retrieval", "memory", "approval"; `fields` as `/rl/event`: call_id, arguments,
        result, approved, error, latency_s, version, interaction_id)."""
        body = {"type": type, "name": name, **{k: v for k, v in fields.items() if v is not None}}
        return self._client().call("/rl/event", body)

    @contextlib.contextmanager
    def timed(self, type: str, name: str, **fields: Any) -> Iterator[TimedEvent]:
        """Time a boundary and report it when the block ends, with the exception's type as
        its error if one escaped (then re-raised):

            with session.timed("tool", "search", arguments={"q": q}, call_id=call.id) as event:
                event.result = search(q)
        """
        event = TimedEvent(dict(fields))
        start = time.monotonic()
        try:
            yield event
        except BaseException as error:
            event.fields["error"] = f"{type_name(error)}: {error}"[:500]
            raise
        finally:
            event.fields["latency_s"] = time.monotonic() - start
            if event.result is not None:
                event.fields["result"] = event.result
            self.event(type, name, **event.fields)

    def end(self, *, success: bool | None = None, info: dict[str, Any] | None = None) -> dict:
        body = {"success": success, "info": info or {}}
        return self._client().call("/rl/end_session", body)

    def cost(self) -> float:
        """US dollars of the session's recorded calls so far (None-priced calls add nothing)."""
        answer = self._client().call("/rl/session_cost", {})
        return answer["cost_usd"]


class GatewayClient:
    """The RL endpoints with an admin or tenant key."""

    def __init__(self, url: str, key: str, *, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s
        self._client = BlockingClient(self.url, api_key=key, timeout_s=timeout_s)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        return self._client.call(path, body)

    def start_session(
        self,
        tenant: str | None = None,
        *,
        task_id: str | None = None,
        task: dict | None = None,
        user_id: str | None = None,
    ) -> Session:
        body = {"tenant": tenant, "task_id": task_id, "task": task or {}, "user_id": user_id}
        answer = self._post("/rl/start_session", body)
        return Session(
            self.url, answer["session_id"], answer["api_key"], answer["model"], self.timeout_s
        )

    def set_reward(
        self,
        reward: float,
        *,
        session_id: str | None = None,
        interaction_id: str | None = None,
        source: str = "user",
    ) -> dict[str, Any]:
        body = {
            "reward": reward,
            "session_id": session_id,
            "interaction_id": interaction_id,
            "source": source,
        }
        return self._post("/rl/set_reward", body)

    def event(self, type: str, name: str, **fields: Any) -> dict[str, Any]:
        """Report an event with this client's key (a tenant key: give `session_id`, or the
        `interaction_id` of the completion it follows); fields as `Session.event`."""
        body = {"type": type, "name": name, **{k: v for k, v in fields.items() if v is not None}}
        return self._post("/rl/event", body)

    def end_session(self, session_id: str, *, success: bool | None = None, info=None) -> dict:
        body = {"session_id": session_id, "success": success, "info": info or {}}
        return self._post("/rl/end_session", body)

    def export(
        self,
        tenant: str | None = None,
        *,
        session_id: str | None = None,
        eligible_only: bool = False,
        include_open: bool = True,
    ) -> Iterator[dict[str, Any]]:
        """Exported trajectories, one `{"tenant", "trajectory"}` object per line."""
        body = {
            "tenant": tenant,
            "session_id": session_id,
            "eligible_only": eligible_only,
            "include_open": include_open,
        }
        raw = self._client.request("/rl/export", body)
        return (json.loads(line) for line in raw.splitlines() if line.strip())

    def delete(
        self,
        tenant: str | None = None,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        trajectory_ids: list[str] | None = None,
        reason: str | None = None,
    ) -> list[str]:
        """Erases the trajectories selected by exactly one of session / user / ids; their ids."""
        body = {
            "tenant": tenant,
            "session_id": session_id,
            "user_id": user_id,
            "trajectory_ids": trajectory_ids,
            "reason": reason,
        }
        return self._post("/rl/delete", body)["deleted"]

    def withdraw_consent(
        self,
        tenant: str | None = None,
        *,
        session_id: str | None = None,
        user_id: str | None = None,
        trajectory_ids: list[str] | None = None,
    ) -> list[str]:
        """Withdraws consent on the selected trajectories (kept, never trained on); their ids."""
        body = {
            "tenant": tenant,
            "session_id": session_id,
            "user_id": user_id,
            "trajectory_ids": trajectory_ids,
        }
        return self._post("/rl/withdraw_consent", body)["withdrawn"]

    def session_cost(self, session_id: str) -> float:
        return self._post("/rl/session_cost", {"session_id": session_id})["cost_usd"]

    def pause(self) -> dict[str, Any]:
        return self._post("/rl/pause", {})

    def resume(self) -> dict[str, Any]:
        return self._post("/rl/continue", {})

    def update_weights(self, path: str, version: int | None = None) -> dict[str, Any]:
        """Every worker loads the checkpoint at `path` and swaps it in."""
        return self._post("/rl/update_weights", {"path": path, "version": version})

    def health(self) -> dict[str, Any]:
        return self._client.call("/health")
