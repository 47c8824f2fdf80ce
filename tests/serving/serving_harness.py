"""Test helpers: servers on loopback ports in background threads, a small model trained to
call a tool, raw HTTP calls and ATDP reads."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import optax
import pytest
from flax import nnx

from atdp_io import AtdpStore
from sao_jax.models import get_model_config, init_model
from sao_jax.models.steps import make_lm_train_step
from serving.common.model_source import ServedModel
from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.local import LocalServerConfig, ServerThread, create_local_server
from serving.worker.config import WorkerConfig
from serving.worker.service import Worker

# --------------------------------------------------------------------------- shared model

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "admin-test-key-0123456789"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@functools.cache
def tool_model() -> ServedModel:
    """A small MoE transformer (tiny tokenizer) trained until greedy decoding answers
    TOOL_MESSAGES (with WEATHER_TOOL) by calling get_weather: a real model whose output is a
    tool call, so the whole tool path runs end to end."""
    tokenizer = build_tiny_tokenizer()
    config = get_model_config(
        "tiny",
        vocab_size=tokenizer.vocab_size,
        d_model=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_token=2,
        moe_intermediate_size=64,
        dense_intermediate_size=128,
        max_seq_len=1024,
        capacity_factor=0.0,  # dropless, as the sampler runs it
    )
    model = init_model(config, seed=0)
    prompt = tokenizer.encode_chat(TOOL_MESSAGES, tools=[WEATHER_TOOL])
    sequence = prompt + tokenizer.encode(TOOL_REPLY) + [tokenizer.eos_id]
    tokens = np.zeros((1, 256), np.int32)
    tokens[0, : len(sequence)] = sequence
    mask = np.zeros_like(tokens)
    mask[0, len(prompt) - 1 : len(sequence) - 1] = 1
    (params, opt_state), step = make_lm_train_step(model, optax.adam(1e-2))
    for _ in range(400):
        params, opt_state, metrics = step(params, opt_state, tokens, mask)
        if float(metrics["nll"]) < 0.005:
            break
    nnx.update(model, params)
    return ServedModel(model, tokenizer, "sao-test", 0)


@functools.cache
def shared_worker() -> Worker:
    """One worker (and its compiled kernels) shared by every in-process server test."""
    config = WorkerConfig(num_slots=16, context_length=512, decode_steps=8)
    return Worker(config, tool_model())


@contextlib.contextmanager
def local_server(buffer: Path, worker: Worker | None = None, *, worker_config=None, **overrides):
    """The one-process server (gateway, router, proxy, worker) on a loopback port;
    `worker_config` is the config's nested `WorkerConfig` (what /v1/models advertises)."""
    if worker_config is not None:
        overrides["worker"] = worker_config
    config = LocalServerConfig(buffer=str(buffer), admin_key=ADMIN_KEY, **overrides)
    server = create_local_server(config, worker=worker or shared_worker())
    thread = ServerThread(server.app)
    try:
        yield thread, server
    finally:
        thread.stop()


def module_server():
    """A module-scoped `server` fixture: the one-process server on a fresh buffer, as
    (thread, parts, buffer). In a test module: `server = module_server()`."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        buffer = tmp_path_factory.mktemp("buffer")
        with local_server(buffer) as (thread, parts):
            yield thread, parts, buffer

    return server


def session_client(url: str, tenant: str = "acme") -> tuple[str, openai.OpenAI]:
    """(session id, an `openai` client with the session's key) for a new session."""
    status, session = api(url, "/rl/start_session", {"tenant": tenant})
    assert status == 200, session
    client = openai.OpenAI(
        base_url=url + "/v1", api_key=session["api_key"], max_retries=0, timeout=600
    )
    return session["session_id"], client


def api(url: str, path: str, body: dict | None = None, key: str | None = ADMIN_KEY, method="POST"):
    """(status, JSON body) of one raw HTTP call (for the non-OpenAI endpoints)."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=120) as client:
        response = client.request(method, url + path, json=body, headers=headers)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def read_trajectories(buffer: Path, tenant: str) -> dict:
    """Every trajectory (open ones too) of `tenant` in the store at `buffer`, by id."""
    store = AtdpStore.open(str(buffer), create=False)
    # "inspect": the tenant's own view, training-ineligible ones included (a training reader
    # would leave them out)
    reader = store.reader(tenant, principal=tenant, purpose="inspect")
    reader.refresh()
    return {t: reader.read(t) for t in reader.trajectory_ids(closed_only=False)}


# --------------------------------------------------------------------------- subprocesses


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def subprocess_env(cache_dir: Path) -> dict[str, str]:
    """Environment of a server subprocess: one CPU device, a persistent compilation cache
    (a restarted server reuses the kernels its predecessor compiled)."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    return env


def start_process(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 (owned by the process' lifetime)
    return subprocess.Popen(
        [sys.executable, "-m", *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
    )


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    """Poll GET /health until it answers 200 (bounded); fail with the log if the process dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    process.kill()
    raise TimeoutError(f"{url} not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


# A tool with an object schema (an enum, a boolean, no extra keys) for constrained calls, one
# the tiny served model never saw, so a grammar mask removes much of its mass; and a tool
# without parameters (its arguments are exactly {}).
LAMP = {
    "type": "function",
    "function": {
        "name": "set_lamp",
        "parameters": {
            "type": "object",
            "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "den"]}},
            "required": ["on", "room"],
            "additionalProperties": False,
        },
    },
}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {}}}
