"""Serving throughput: generated tokens/s through the HTTP gateway vs calling the worker
directly, at several concurrencies, and the latency the gateway adds.

Both paths drive the same `Worker` (same model, same compiled kernels) with the same requests:
identical chat prompts rendered with the served tokenizer and the same per-request seeds, so
both generate exactly the same tokens.

- direct: `concurrency` coroutines in this process submit `GenerationRequest`s to the worker
  (no HTTP, no recording).
- HTTP: the one-process server (gateway, router, data proxy with durable ATDP recording,
  worker) listens on loopback; `concurrency` agents in a separate client process POST
  `/v1/chat/completions` with their session keys, one request after the other.

Each concurrency runs direct, HTTP, direct (the two direct runs are averaged, so drift from
other jobs on the machine hits both sides). Latency is per request, send to full response;
"added" is the HTTP percentile minus the direct percentile.

    python benchmarks/serving_throughput.py [preset=tiny] [concurrency=[1,8,32]]
        [requests_per_run=64] [max_tokens=128] [repeats=3] [out_dir=/tmp/serving_bench]
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import shutil
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from tabulate import tabulate

from sao_jax.config_cli import parse_cli
from sao_jax.envs.alfworld import vocabulary
from serving.common.model_source import load_served_model
from serving.local import LocalServerConfig, ServerThread, create_local_server
from serving.worker.config import WorkerConfig
from serving.worker.generation import Finished, GenerationRequest
from serving.worker.service import Worker

ADMIN_KEY = "benchmark-admin-key"


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset served (tiny: random tiny MoE + byte-level BPE).
    concurrency: concurrent agents (each sends its requests one after the other).
    requests_per_run: requests per measurement, spread over the agents (at least 2 each).
    max_tokens: completion tokens per request (fewer when the model emits a stop token).
    prompt_words: words of the user message (about one token each).
    num_slots: worker KV-cache slots (requests decoded together).
    context_length: worker positions per slot.
    repeats: measurements per concurrency (direct, HTTP, direct each); medians are reported.
    out_dir: where the ATDP buffer of the HTTP runs is written (deleted first).
    """

    preset: str = "tiny"
    concurrency: list[int] = dataclasses.field(default_factory=lambda: [1, 8, 32])
    requests_per_run: int = 64
    max_tokens: int = 128
    prompt_words: int = 60
    num_slots: int = 32
    context_length: int = 512
    repeats: int = 3
    out_dir: str = "/tmp/serving_bench"


def messages_for(agent: int, request: int, words: int) -> list[dict]:
    vocab = vocabulary()
    text = " ".join(vocab[(agent * 31 + request * 7 + i * 13) % len(vocab)] for i in range(words))
    return [
        {"role": "system", "content": "You are an agent in a household. Act step by step."},
        {"role": "user", "content": text},
    ]


def seed_for(agent: int, request: int) -> int:
    return 1000 * agent + request


def per_agent(config: BenchConfig, concurrency: int) -> int:
    return max(2, -(-config.requests_per_run // concurrency))


def append_totals(parts) -> tuple[float, float]:
    """(seconds, count) of the data proxy's durable ATDP appends so far."""
    registry = parts.proxy.metrics.registry
    total = registry.get_sample_value("sao_proxy_atdp_append_seconds_sum") or 0.0
    count = registry.get_sample_value("sao_proxy_atdp_append_seconds_count") or 0.0
    return total, count


def summarize(latencies: list[float], tokens: int, seconds: float) -> dict:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"tokens": tokens, "seconds": seconds, "p50": statistics.median(ordered), "p99": p99}


# ------------------------------------------------------------------------------ direct


async def direct_load(worker: Worker, config: BenchConfig, concurrency: int) -> dict:
    latencies, tokens = [], 0

    async def agent(index: int) -> None:
        nonlocal tokens
        for r in range(per_agent(config, concurrency)):
            ids = worker.tokenizer.encode_chat(messages_for(index, r, config.prompt_words))
            request = GenerationRequest(tuple(ids), config.max_tokens, seed=seed_for(index, r))
            start = time.perf_counter()
            async for event in worker.submit(request).events():
                if isinstance(event, Finished):
                    tokens += event.completion_tokens
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(agent(i) for i in range(concurrency)))
    return summarize(latencies, tokens, time.perf_counter() - start)


# ------------------------------------------------------------------------------ HTTP client


def http_load(url: str, keys: list[str], model: str, config: BenchConfig, concurrency: int) -> dict:
    """Runs in the client process."""

    async def run() -> dict:
        latencies, tokens = [], 0
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def agent(index: int) -> None:
                nonlocal tokens
                headers = {"Authorization": f"Bearer {keys[index]}"}
                for r in range(per_agent(config, concurrency)):
                    body = {
                        "model": model,
                        "messages": messages_for(index, r, config.prompt_words),
                        "max_tokens": config.max_tokens,
                        "seed": seed_for(index, r),
                    }
                    start = time.perf_counter()
                    async with http.post(
                        f"{url}/v1/chat/completions", json=body, headers=headers
                    ) as response:
                        answer = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"HTTP {response.status}: {answer}")
                    latencies.append(time.perf_counter() - start)
                    tokens += answer["usage"]["completion_tokens"]

            start = time.perf_counter()
            await asyncio.gather(*(agent(i) for i in range(concurrency)))
            return summarize(latencies, tokens, time.perf_counter() - start)

    return asyncio.run(run())


# ------------------------------------------------------------------------------ server


def start_sessions(url: str, count: int) -> list[str]:
    async def run() -> list[str]:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            keys = []
            for _ in range(count):
                async with http.post(f"{url}/rl/start_session", json={"tenant": "bench"}) as r:
                    keys.append((await r.json())["api_key"])
            return keys

    return asyncio.run(run())


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    out = Path(config.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    served = load_served_model(config_name=config.preset)
    worker_config = WorkerConfig(
        num_slots=config.num_slots, context_length=config.context_length, warmup=True
    )
    worker = Worker(worker_config, served)
    server_config = LocalServerConfig(buffer=str(out / "buffer"), admin_key=ADMIN_KEY)
    start = time.perf_counter()  # the server starts the worker: every shape compiles first
    server_parts = create_local_server(server_config, worker=worker)
    server = ServerThread(server_parts.app)
    print(f"server up (warm) in {time.perf_counter() - start:.0f} s", flush=True)
    keys = start_sessions(server.url, max(config.concurrency))
    client = multiprocessing.get_context("spawn").Pool(1)  # the load generator's own CPU time
    try:
        warm = dataclasses.replace(config, requests_per_run=1)  # first-use costs of both paths
        for concurrency in config.concurrency:
            asyncio.run(direct_load(worker, warm, concurrency))
            client.apply(http_load, (server.url, keys, served.model_id, warm, concurrency))
        rows = []
        for concurrency in config.concurrency:
            append_before = append_totals(server_parts)
            direct_rates, http_rates, ratios = [], [], []
            direct_p50, direct_p99, http_p50, http_p99 = [], [], [], []
            for _ in range(config.repeats):
                first = asyncio.run(direct_load(worker, config, concurrency))
                args = (server.url, keys, served.model_id, config, concurrency)
                http = client.apply(http_load, args)
                second = asyncio.run(direct_load(worker, config, concurrency))
                if not first["tokens"] == http["tokens"] == second["tokens"]:
                    raise AssertionError("direct and HTTP runs generated different tokens")
                direct_rate = 2 * first["tokens"] / (first["seconds"] + second["seconds"])
                http_rate = http["tokens"] / http["seconds"]
                direct_rates.append(direct_rate)
                http_rates.append(http_rate)
                ratios.append(http_rate / direct_rate)
                direct_p50.append((first["p50"] + second["p50"]) / 2)
                direct_p99.append((first["p99"] + second["p99"]) / 2)
                http_p50.append(http["p50"])
                http_p99.append(http["p99"])
                print(
                    f"c={concurrency}: direct {direct_rate:.0f} tok/s, HTTP {http_rate:.0f} tok/s "
                    f"({http_rate / direct_rate:.1%}), p50 {1e3 * direct_p50[-1]:.0f} vs "
                    f"{1e3 * http['p50']:.0f} ms",
                    flush=True,
                )
            med = statistics.median
            append_after = append_totals(server_parts)
            commits = append_after[1] - append_before[1]
            append_ms = 1e3 * (append_after[0] - append_before[0]) / max(commits, 1)
            added50 = med(h - d for h, d in zip(http_p50, direct_p50, strict=True))
            added99 = med(h - d for h, d in zip(http_p99, direct_p99, strict=True))
            rows.append(
                {
                    "concurrency": concurrency,
                    "tokens/run": http["tokens"],
                    "direct tok/s": round(med(direct_rates)),
                    "HTTP tok/s": round(med(http_rates)),
                    "HTTP / direct": f"{med(ratios):.1%}",
                    "direct p50/p99 (ms)": f"{1e3 * med(direct_p50):.0f} / {1e3 * med(direct_p99):.0f}",
                    "HTTP p50/p99 (ms)": f"{1e3 * med(http_p50):.0f} / {1e3 * med(http_p99):.0f}",
                    "added p50/p99 (ms)": f"{1e3 * added50:.1f} / {1e3 * added99:.1f}",
                    "ATDP append (ms)": f"{append_ms:.1f}",
                }
            )
    finally:
        client.close()
        client.join()
        server.stop()
    print(
        f"\n{config.preset}: {config.max_tokens} max tokens/request, prompt ~{config.prompt_words} words,"
    )
    print(
        f"{config.requests_per_run} requests per run, {config.num_slots} slots, "
        f"median of {config.repeats}\n"
    )
    print(tabulate(rows, headers="keys", tablefmt="github"))


if __name__ == "__main__":
    main(sys.argv[1:])
