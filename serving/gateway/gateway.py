"""The gateway's state and operations, independent of HTTP: sessions, routing, fan-out.

`Gateway` authenticates nothing itself (see `auth.py`); it turns an authenticated call into a
routed call on the session's data proxy, and fans admin operations out to every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.common.errors import ApiError
from serving.common.ids import opaque_id
from serving.common.metrics import LATENCY_BUCKETS_S, new_registry
from serving.common.openai_requests import ChatRequest, CompletionRequest, forces_tool_call
from serving.common.responses_requests import ResponsesRequest, with_history
from serving.control.apply import apply_chat
from serving.control.canary import CanaryBook
from serving.control.store import CompositeStore
from serving.gateway import responses_api
from serving.gateway.auth import Principal
from serving.gateway.config import GatewayConfig
from serving.gateway.data_requests import DataRequest
from serving.gateway.sessions import SessionRecord, SessionTable
from serving.gateway.tenants import TenantDirectory
from serving.proxy.client import ProxyClient
from serving.proxy.runner import CallContext
from serving.router.client import RouterClient
from serving.worker.client import WorkerClient


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else new_registry()
        self.registry = r
        self.requests = Counter(
            "sao_gateway_requests", "HTTP requests answered.", ["endpoint", "status"], registry=r
        )
        self.seconds = Histogram(
            "sao_gateway_request_seconds",
            "Time to the full response (streams: to the last byte).",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.in_flight = Gauge(
            "sao_gateway_completions_in_flight", "Completions running.", registry=r
        )
        self.sessions = Counter("sao_gateway_sessions_started", "Sessions started.", registry=r)


class Gateway:
    """Sessions, tenants and the clients of the router, data proxies and workers."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        tenants: TenantDirectory,
        sessions: SessionTable,
        router: RouterClient,
        proxies: list[str],
        proxy_client: Callable[[str], ProxyClient],
        worker_client: Callable[[str], WorkerClient],
        registry: CollectorRegistry | None = None,
        composites: CompositeStore | None = None,
        canaries: CanaryBook | None = None,
    ):
        self.config = config
        self.composites = composites  # each tenant's composite policy (serving/control)
        self.canaries = canaries  # a tenant's newest version served to a share of sessions
        self.tenants = tenants
        self.sessions = sessions
        self.router = router
        self.proxies = list(proxies)
        self.proxy_client = proxy_client
        self.worker_client = worker_client
        self.metrics = GatewayMetrics(registry)
        self._models: list[dict[str, Any]] = []
        self._in_flight = 0
        self.responses = responses_api.ResponseStore()

    # ------------------------------------------------------------------ models

    async def models(self, refresh: bool = False) -> list[dict[str, Any]]:
        if refresh or not self._models:
            infos = await self.router.models()
            unique = {info["model_id"]: info for info in infos}
            self._models = list(unique.values())
        return self._models

    async def check_model(self, model: str) -> None:
        ids = [m["model_id"] for m in await self.models()]
        if model not in ids:
            ids = [m["model_id"] for m in await self.models(refresh=True)]
        if model not in ids:
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server serves {ids}",
                param="model",
                code="model_not_found",
            )

    # ------------------------------------------------------------------ completions

    def _admit(self) -> None:
        if self._in_flight >= self.config.max_concurrent_requests:
            raise ApiError(
                429,
                f"the gateway is at its limit of {self.config.max_concurrent_requests} "
                "concurrent completions",
                code="too_many_requests",
                headers={"Retry-After": "1"},
            )
        self._in_flight += 1
        self.metrics.in_flight.set(self._in_flight)

    def _release(self) -> None:
        self._in_flight -= 1
        self.metrics.in_flight.set(self._in_flight)

    async def _call_context(self, principal: Principal) -> tuple[CallContext, bool]:
        """(the routed call, whether it is a one-call trajectory to release afterwards)."""
        if principal.kind == "session":
            record = principal.session
            if record.ended:
                raise ApiError(
                    409, f"session {record.session_id!r} has ended", code="session_ended"
                )
            route = await self.router.route(record.session_id, proxy=record.proxy)
            return CallContext(record.session_id, record.tenant, route), False
        if principal.kind == "tenant":
            session_id = opaque_id()
            route = await self.router.route(session_id)
            governance = principal.tenant.governance_at(time.time())
            call = CallContext(session_id, principal.tenant.name, route, True, governance)
            return call, True
        raise ApiError(
            403,
            "the admin key cannot call the model; start a session (/rl/start_session) and use "
            "its key, or use a tenant key",
            code="admin_cannot_complete",
        )

    async def complete(
        self, principal: Principal, request: ChatRequest | CompletionRequest
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """Run a chat / text completion on the caller's data proxy (body or SSE bytes)."""
        await self.check_model(request.model)
        call, ephemeral = await self._call_context(principal)
        try:
            request, composite = await self._with_composite(principal, request, call.session_id)
        except BaseException:
            if ephemeral:
                await self.router.release(call.session_id)
            raise
        call = dataclasses.replace(call, composite=composite)
        self._admit()
        released = False
        try:
            proxy = self.proxy_client(call.route.proxy)
            if isinstance(request, ChatRequest):
                pending = proxy.chat(request, call)
            else:
                pending = proxy.completion(request, call)
            timeout = None if request.stream else self.config.request_timeout_s
            async with asyncio.timeout(timeout):
                result = await pending
            if isinstance(result, dict):
                return result
            released = True
            return self._release_after(result, call if ephemeral else None)
        finally:
            if not released:
                self._release()
                if ephemeral:
                    await self.router.release(call.session_id)

    async def _with_composite(
        self, principal: Principal, request: ChatRequest | CompletionRequest, session_id: str
    ) -> tuple[ChatRequest | CompletionRequest, dict[str, Any] | None]:
        """(the request as the model sees it under the composite policy serving this session
        of the caller's tenant, the composite's attribution). During a canary that is the
        canary's candidate or its baseline, by a hash of the session id. Legacy completions'
        prompts are sent as given; their events still name the composite in force."""
        if self.composites is None or principal.tenant is None:
            return request, None
        tenant = principal.tenant.name
        if self.canaries is not None:
            composite = self.canaries.serving(tenant, session_id)
        else:
            composite = self.composites.current(tenant)
        attribution = composite.attribution()
        if composite.version == 0 or not isinstance(request, ChatRequest):
            return request, attribution
        applied = await asyncio.to_thread(apply_chat, composite, request.messages, request.tools)
        shown = dataclasses.replace(
            request,
            messages=applied.messages,
            tools=applied.tools,
            choice=_harness_choice(request, applied.reply_choices),
        )
        return shown, {**attribution, "memory_notes": list(applied.memory_notes)}

    async def _release_after(
        self, stream: AsyncIterator[bytes], ephemeral: CallContext | None
    ) -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(stream):  # a client that left cancels it now
                async for data in stream:
                    yield data
        finally:
            self._release()
            if ephemeral is not None:
                await self.router.release(ephemeral.session_id)

    @staticmethod
    def _owner(principal: Principal) -> str:
        """Whose stored responses a key may read and continue."""
        if principal.kind == "session":
            return f"session:{principal.session.session_id}"
        if principal.kind == "tenant":
            return f"tenant:{principal.tenant.name}"
        return "admin"

    async def respond(
        self, principal: Principal, request: ResponsesRequest
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        """A Responses API call: run as a chat completion (recorded the same way) after the
        conversation `previous_response_id` names; stored for later calls unless store=false."""
        owner = self._owner(principal)
        history: list[dict[str, Any]] = []
        chat = request.chat
        if request.previous_response_id is not None:
            history, _ = self.responses.get(
                owner, request.previous_response_id, "previous_response_id"
            )
            chat = with_history(request, history)
        conversation = [*history, *request.input_messages]

        def store(body: dict[str, Any]) -> None:
            if request.store:
                reply = responses_api.reply_message(body["output"])
                self.responses.put(owner, body, [*conversation, reply])

        result = await self.complete(principal, chat)
        if isinstance(result, dict):
            body = responses_api.from_chat_completion(request, result)
            store(body)
            return body
        return responses_api.stream_events(request, result, chat.model, store)

    def stored_response(self, principal: Principal, response_id: str) -> dict[str, Any]:
        return self.responses.get(self._owner(principal), response_id)[1]

    # ------------------------------------------------------------------ sessions

    async def start_session(self, tenant: str, task: dict[str, Any]) -> tuple[SessionRecord, str]:
        governance = self.tenants.governance(tenant)
        record, key = self.sessions.create(tenant, proxy="", task=task)
        route = await self.router.route(record.session_id)
        record.proxy = route.proxy
        try:
            await self.proxy_client(route.proxy).open_session(
                record.session_id, tenant, governance, task
            )
            await asyncio.to_thread(self.sessions.commit, record)
        except BaseException:
            await self.router.release(record.session_id)
            raise
        self.metrics.sessions.inc()
        return record, key

    async def set_reward(
        self, record: SessionRecord, value: float, interaction_id: str | None, source: str
    ) -> dict[str, Any]:
        proxy = self.proxy_client(record.proxy)
        result = await proxy.set_reward(
            record.session_id, record.tenant, value, interaction_id=interaction_id, source=source
        )
        return {"session_id": record.session_id, "interaction_id": interaction_id, **result}

    async def record_event(self, record: SessionRecord, event) -> dict[str, Any]:
        result = await self.proxy_client(record.proxy).record_event(
            record.session_id, record.tenant, event
        )
        return {"session_id": record.session_id, **result}

    async def record_unlisted_event(self, tenant: str, session_id: str, event) -> dict[str, Any]:
        """An event for a trajectory of `tenant` made of tenant-key calls (as
        `set_unlisted_reward`)."""
        return await self._on_some_proxy(
            session_id, lambda proxy: proxy.record_event(session_id, tenant, event)
        )

    async def end_unlisted(
        self, tenant: str, session_id: str, success: bool | None, info: dict[str, Any]
    ) -> dict[str, Any]:
        """Ends a trajectory of `tenant` made of tenant-key calls (as `set_unlisted_reward`)."""
        return await self._on_some_proxy(
            session_id,
            lambda proxy: proxy.end_session(session_id, tenant, success=success, info=info),
        )

    async def _on_some_proxy(self, session_id: str, call) -> dict[str, Any]:
        """`call(proxy client)` on each data proxy until one knows the session (not a 404)."""
        missing: ApiError | None = None
        for proxy in self.proxies:
            try:
                result = await call(self.proxy_client(proxy))
            except ApiError as error:
                if error.status != 404:
                    raise
                missing = error
                continue
            return {"session_id": session_id, **result}
        raise missing or ApiError(404, f"no session {session_id!r} for this tenant")

    async def set_unlisted_reward(
        self, tenant: str, session_id: str, value: float, interaction_id: str | None, source: str
    ) -> dict[str, Any]:
        """A reward for a trajectory of `tenant` that no started session names (tenant-key
        calls): asked of each data proxy until one holds it; else the proxies' 404."""
        result = await self._on_some_proxy(
            session_id,
            lambda proxy: proxy.set_reward(
                session_id, tenant, value, interaction_id=interaction_id, source=source
            ),
        )
        return {"interaction_id": interaction_id, **result}

    async def end_session(
        self, record: SessionRecord, success: bool | None, info: dict[str, Any]
    ) -> dict[str, Any]:
        if record.ended:
            raise ApiError(
                409, f"session {record.session_id!r} has already ended", code="session_ended"
            )
        proxy = self.proxy_client(record.proxy)
        result = await proxy.end_session(
            record.session_id, record.tenant, success=success, info=info
        )
        await asyncio.to_thread(self.sessions.end, record)
        await self.router.release(record.session_id)
        return {"session_id": record.session_id, **result}

    async def export(
        self, tenant: str | None, requested_by: str, **kwargs: Any
    ) -> AsyncIterator[bytes]:
        """Every data proxy's trajectories of `tenant` (None: all tenants), as JSON lines."""
        for proxy in self.proxies:
            async for data in self.proxy_client(proxy).export(
                tenant, requested_by=requested_by, **kwargs
            ):
                yield data

    async def session_cost(self, record: SessionRecord) -> dict[str, Any]:
        result = await self.proxy_client(record.proxy).session_cost(
            record.session_id, record.tenant
        )
        return {"session_id": record.session_id, "tenant": record.tenant, **result}

    # ------------------------------------------------------------------ data rights

    async def delete(self, request: DataRequest) -> list[str]:
        """Erases the selected trajectories on every data proxy; returns their ids. A deleted
        session is ended here too, so its key can no longer add to it."""
        deleted: list[str] = []
        for proxy in self.proxies:
            deleted += await self.proxy_client(proxy).delete(
                request.tenant,
                requested_by=request.requested_by,
                reason=request.reason,
                **request.selector,
            )
        for trajectory_id in deleted:  # a session's trajectory id is its session id
            record = self.sessions.get(trajectory_id)
            if record is not None and not record.ended:
                await asyncio.to_thread(self.sessions.end, record)
                await self.router.release(record.session_id)
        return deleted

    async def withdraw_consent(self, request: DataRequest) -> list[str]:
        """Withdraws consent on the selected trajectories on every data proxy."""
        withdrawn: list[str] = []
        for proxy in self.proxies:
            withdrawn += await self.proxy_client(proxy).withdraw_consent(
                request.tenant, requested_by=request.requested_by, **request.selector
            )
        return withdrawn

    # ------------------------------------------------------------------ workers

    async def for_each_worker(self, operation: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Run pause / resume / update_weights on every live worker, in parallel."""
        workers = [w["worker"] for w in await self.router.workers() if w["alive"]]

        async def run(name: str) -> dict[str, Any]:
            client = self.worker_client(name)
            result = await getattr(client, operation)(**kwargs)
            return {"worker": name, "result": result}

        return list(await asyncio.gather(*(run(name) for name in workers)))


def _harness_choice(
    request: ChatRequest, replies: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """The request's choice list under the composite: the harness's reply choices, unless the
    client constrained the output itself (its own choice list, JSON or a forced tool call)."""
    forced_call = forces_tool_call(request.tools, request.tool_choice)
    if replies is None or request.choice is not None or request.response_format or forced_call:
        return request.choice
    return replies
