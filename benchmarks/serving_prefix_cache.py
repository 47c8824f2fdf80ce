"""Prefix caching: time to first token of a ~28K-token agent turn whose prefix the worker has
cached vs the same turn encoded from scratch, through the HTTP gateway.

An agent (Hermes Agent: a 28K-token system prompt with its tool schemas) re-sends its whole
conversation every turn. The one-process server (gateway, router, data proxy recording ATDP,
worker; `tiny_64k`) listens on loopback. Each repeat plays one conversation with its own
system prompt (so nothing is shared with earlier repeats):

- turn 1 (cold): [system ~28K tokens, user] -- nothing cached;
- turn 2 (cached): turn 1's messages + the reply + a new user message; the slot that served
  turn 1 holds all but the newest tokens;
- turn 2 again with the worker's prefix cache switched off (uncached): every token encoded.

Time to first token is measured at the client (request sent -> first streamed content); a
warm-up conversation first compiles every kernel shape, so no row pays compilation. Printed:
per-turn TTFT and the tokens the worker encoded, the medians and the ratio uncached / cached.

    python benchmarks/serving_prefix_cache.py [prompt_tokens=28000] [repeats=2]
        [max_tokens=8] [num_slots=2] [prefill_chunk=2048] [out_dir=/tmp/prefix_cache_bench]
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import httpx
from tabulate import tabulate

from sao_jax.config_cli import parse_cli
from serving.common.model_source import load_served_model
from serving.local import LocalServerConfig, ServerThread, create_local_server
from serving.worker.config import WorkerConfig
from serving.worker.service import Worker

ADMIN_KEY = "benchmark-admin-key"
SENTENCE = "open the fridge then go to the cabinet and take the apple to the table. "


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset served (tiny_64k: the tiny MoE with a 64K-token context).
    prompt_tokens: tokens of the first turn's prompt (system prompt + user message).
    repeats: conversations measured (each: cold turn, cached turn, uncached turn).
    max_tokens: completion tokens per turn (the worker's max_completion_tokens).
    num_slots: worker KV-cache slots.
    prefill_chunk: prompt tokens per prefill dispatch.
    out_dir: the ATDP buffer the server records into (deleted first).
    """

    preset: str = "tiny_64k"
    prompt_tokens: int = 28_000
    repeats: int = 2
    max_tokens: int = 8
    num_slots: int = 2
    prefill_chunk: int = 2048
    out_dir: str = "/tmp/prefix_cache_bench"


def system_prompt(tokenizer, tag: str, tokens: int) -> list[dict]:
    """[system, user] messages whose rendered prompt has about `tokens` tokens; `tag` opens
    the system prompt, so conversations with different tags share no cached prefix."""
    per_sentence = len(tokenizer.encode(SENTENCE * 100)) / 100
    text = f"conversation {tag}. " + SENTENCE * int(tokens / per_sentence)
    messages = [{"role": "system", "content": text}, {"role": "user", "content": "look around"}]
    while len(tokenizer.encode_chat(messages)) > tokens:
        text = text[: -len(SENTENCE)]
        messages[0]["content"] = text
    return messages


def turn(url: str, key: str, model: str, messages: list[dict], max_tokens: int):
    """(seconds to the first streamed content, the reply text, prompt tokens)."""
    body = {
        "model": model,
        "messages": messages,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream_options": {"include_usage": True},
    }
    start, first, text, usage = time.perf_counter(), None, "", None
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=1800
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                delta = choice["delta"]
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                if first is None and (piece or choice.get("finish_reason")):
                    first = time.perf_counter() - start
                text += delta.get("content") or ""
    return first, text, usage["prompt_tokens"]


def conversation(url, key, model, worker, messages, config, rows, label):
    """Play the cold, cached and uncached turns; append their rows."""
    engine = worker.engine

    def timed(name: str, messages: list[dict]) -> str:
        before = engine.prefill_tokens
        ttft, text, prompt = turn(url, key, model, messages, config.max_tokens)
        rows.append((label, name, prompt, engine.prefill_tokens - before, ttft))
        print(f"{label} {name}: {prompt} prompt tokens, TTFT {ttft:.3f} s", flush=True)
        return text

    reply = timed("cold", messages)
    answer = {"role": "assistant", "content": reply}
    second = [*messages, answer, {"role": "user", "content": "now take the apple"}]
    timed("cached", second)
    engine.slot_contents.enabled = False
    try:
        timed("uncached", second)
    finally:
        engine.slot_contents.enabled = True


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    out = Path(config.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    served = load_served_model(config_name=config.preset)
    worker_config = WorkerConfig(
        preset=config.preset,
        num_slots=config.num_slots,
        max_completion_tokens=config.max_tokens,
        prefill_chunk=config.prefill_chunk,
    )
    worker = Worker(worker_config, served)
    server_config = LocalServerConfig(buffer=str(out), admin_key=ADMIN_KEY, worker=worker_config)
    parts = create_local_server(server_config, worker=worker)
    server = ServerThread(parts.app)
    try:
        session = httpx.post(
            server.url + "/rl/start_session",
            json={"tenant": "bench"},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=60,
        ).json()
        key, model = session["api_key"], session["model"]
        rows: list[tuple] = []
        warm = system_prompt(served.tokenizer, "warm-up", config.prompt_tokens)
        conversation(server.url, key, model, worker, warm, config, [], "warm-up")
        for repeat in range(config.repeats):
            messages = system_prompt(served.tokenizer, f"r{repeat}", config.prompt_tokens)
            conversation(server.url, key, model, worker, messages, config, rows, f"r{repeat}")
    finally:
        server.stop()
        worker.stop()
    print(
        tabulate(
            rows,
            headers=["conversation", "turn", "prompt tokens", "tokens encoded", "TTFT (s)"],
            floatfmt=".3f",
        )
    )
    median = {
        name: statistics.median(r[4] for r in rows if r[1] == name)
        for name in ("cold", "cached", "uncached")
    }
    print(
        f"median TTFT: cold {median['cold']:.3f} s, cached {median['cached']:.3f} s, "
        f"uncached {median['uncached']:.3f} s; uncached / cached = "
        f"{median['uncached'] / median['cached']:.1f}x"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
