"""Clients of a worker: in-process (`LocalWorkerClient`) and HTTP (`HttpWorkerClient`).

Both expose the same coroutines, so the data proxy and the router never know where the worker
runs. Generation yields `TokenChunk`s then one `Finished`; a 4xx / 429 from the worker is
re-raised as the same `ApiError`; a worker that cannot be reached (or dies mid-stream) raises
`WorkerUnavailable`, on which the router re-pins the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from serving.common.client import ServiceClient
from serving.worker.generation import GenerationEvent, GenerationRequest, event_from_json
from serving.worker.service import Worker


class WorkerUnavailable(ConnectionError):
    """The worker did not answer (down, unreachable, or it dropped the stream)."""


class WorkerClient(Protocol):
    name: str

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]: ...

    async def status(self) -> dict[str, Any]: ...

    async def info(self) -> dict[str, Any]: ...

    async def pause(self) -> dict[str, Any]: ...

    async def resume(self) -> dict[str, Any]: ...

    async def update_weights(
        self, version: int | None, *, path: str | None = None, params: Any = None
    ) -> int: ...

    async def close(self) -> None: ...


class LocalWorkerClient:
    """A worker in this process: no serialisation, no HTTP."""

    def __init__(self, worker: Worker, name: str = "local"):
        self.worker = worker
        self.name = name

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        handle = self.worker.submit(request)
        async for event in handle.events():
            yield event

    async def status(self) -> dict[str, Any]:
        return self.worker.engine.status()

    async def info(self) -> dict[str, Any]:
        return self.worker.info()

    async def pause(self) -> dict[str, Any]:
        self.worker.engine.pause()
        return self.worker.engine.status()

    async def resume(self) -> dict[str, Any]:
        self.worker.engine.resume()
        return self.worker.engine.status()

    async def update_weights(
        self, version: int | None, *, path: str | None = None, params: Any = None
    ) -> int:
        """New weights as `params` (an nnx State, in process) or a checkpoint `path`."""
        if params is not None:
            if version is None:
                raise ValueError("update_weights with params needs a version")
            return await self.worker.update_weights(params, version)
        if path is None:
            raise ValueError("update_weights needs params or a checkpoint path")
        return await self.worker.update_weights_from_path(path, version)

    async def close(self) -> None:
        return None


class HttpWorkerClient(ServiceClient):
    """A worker behind its HTTP API at `url` (e.g. http://127.0.0.1:8101)."""

    def __init__(self, url: str, *, service_key: str | None = None, timeout_s: float = 10.0):
        # No total timeout on generation: the worker ends it itself at its request timeout.
        super().__init__(url, api_key=service_key, timeout_s=timeout_s)

    def unavailable(self, error: BaseException) -> Exception:
        return WorkerUnavailable(f"worker {self.url}: {type(error).__name__}: {error}")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        async for line in self.stream_json_lines("/generate", request.to_json()):
            yield event_from_json(line)

    async def status(self) -> dict[str, Any]:
        return await self.call("GET", "/status")

    async def info(self) -> dict[str, Any]:
        return await self.call("GET", "/info")

    async def tokenizer(self) -> dict[str, Any]:
        return await self.call("GET", "/tokenizer")

    async def pause(self) -> dict[str, Any]:
        return await self.call("POST", "/admin/pause")

    async def resume(self) -> dict[str, Any]:
        return await self.call("POST", "/admin/continue")

    async def update_weights(
        self, version: int | None, *, path: str | None = None, params: Any = None
    ) -> int:
        if params is not None:
            raise ValueError("an HTTP worker takes weights as a checkpoint path, not params")
        if path is None:
            raise ValueError("update_weights needs a checkpoint path")
        body = {"path": path, "version": version}
        # Loading a large checkpoint takes a while; the swap itself is between two dispatches.
        answer = await self.call("POST", "/admin/update_weights", body, timeout_s=3600)
        return int(answer["policy_version"])
