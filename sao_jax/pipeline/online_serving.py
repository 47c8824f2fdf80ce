"""The acting side of `experiments.online_sao`: a live server and an agent process.

- `OnlineServer`: gateway + router + data proxy + worker (`serving.local`) serving the
  learner's policy on a loopback port from its own event-loop thread. The data proxy records
  into the run's ATDP store; the worker follows the learner's `WeightPublisher`.
- `AgentFleet`: `python -m sao_jax.pipeline.online_agent` as a child process, and the rollout
  source `sao_jax.train.loop.OnlineTrainer` drives (`start` / `stop` / `guard` /
  `raise_if_failed`): the learner's blocking stream read gives up with `AgentError` when the
  agent died, instead of waiting forever for data that will not come.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiohttp import web
from flax import nnx

from sao_jax.pipeline.online_agent import ADMIN_KEY_ENV, AgentConfig
from sao_jax.rollout.guard import guarded
from sao_jax.rollout.weights import WeightPublisher
from sao_jax.tokenizers import HFTokenizer
from serving.common.model_source import ServedModel
from serving.local import LocalServer, LocalServerConfig, create_local_server
from serving.worker.config import WorkerConfig
from serving.worker.service import Worker


class AgentError(RuntimeError):
    """The agent process exited with an error (its stderr tail is in the message)."""


class AgentFinished(RuntimeError):
    """The agent played its whole episode budget and exited; no more data will come."""


def counter_total(counter: Any) -> float:
    """Sum of a Prometheus counter over its labels."""
    return sum(
        sample.value
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


class OnlineServer:
    """The one-process server for `policy`, listening on 127.0.0.1 (`port` 0: a free one).

    Args:
      policy: the served `Transformer` (the worker keeps its own copy of the weights).
      tokenizer: its tokenizer (`HFTokenizer`, e.g. the run's `WordTokenizer`).
      buffer: the ATDP store directory the data proxy writes.
      worker: `WorkerConfig` of the batch, context and admission.
      model_id: the name clients pass as `model`.
      policy_version: the version of `policy`.
    """

    def __init__(
        self,
        policy: nnx.Module,
        tokenizer: HFTokenizer,
        *,
        buffer: str,
        worker: WorkerConfig,
        model_id: str,
        policy_version: int,
        port: int = 0,
        writer_threads: int = 4,
    ):
        self.admin_key = secrets.token_urlsafe(32)
        served = ServedModel(policy, tokenizer, model_id, policy_version)
        config = LocalServerConfig(
            buffer=buffer,
            admin_key=self.admin_key,
            port=port,
            request_timeout_s=worker.request_timeout_s,
            writer_threads=writer_threads,
        )
        self.parts: LocalServer = create_local_server(config, worker=Worker(worker, served))
        self.worker = self.parts.worker
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, timeout_s: float = 300.0) -> OnlineServer:
        self._thread = threading.Thread(target=self._serve, name="online-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the server did not start within {timeout_s} s")
        if self._error is not None:
            raise RuntimeError(f"the server failed to start: {self._error!r}") from self._error
        return self

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        runner = web.AppRunner(self.parts.app, access_log=None, shutdown_timeout=5)
        try:
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", self._port)
            self._loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        except BaseException as error:  # handed to start()
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        # cleanup stops the worker engine and closes the proxy's open writers
        self._loop.run_until_complete(runner.cleanup())
        self._loop.close()

    def follow(self, publisher: WeightPublisher):
        """Swap in every version the learner publishes; returns an unsubscribe function."""
        return self.worker.follow(publisher)

    def figures(self) -> dict[str, float]:
        """Serving counters: completions answered, events recorded, rewards, weight swaps."""
        proxy, worker = self.parts.proxy.metrics, self.worker.metrics
        return {
            "completions": counter_total(proxy.completions),
            "events_recorded": counter_total(proxy.events),
            "rewards_recorded": counter_total(proxy.rewards),
            "generated_tokens": counter_total(worker.generated_tokens),
            "weight_swaps": counter_total(worker.weight_updates),
            "rejected_429": counter_total(worker.rejected),
            "served_policy_version": self.worker.sampler.policy_version,
        }

    def stop(self) -> None:
        """Stop serving (idempotent); running requests end, writers close."""
        if self._thread is None:
            return
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)
        self._thread = None


class AgentFleet:
    """The agent as a child process, seen by `OnlineTrainer` as its rollout source.

    `start()` launches it (admin key in its environment, never on the command line); `stop()`
    sends SIGTERM, waits `stop_timeout_s` for the calls in flight, then kills.
    """

    def __init__(self, config: AgentConfig, admin_key: str, out_dir: Path, *, stop_timeout_s=30.0):
        self.config, self.admin_key = config, admin_key
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.out_dir / "episodes.jsonl"
        self.stats_path = self.out_dir / "stats.json"
        self.stderr_path = self.out_dir / "stderr.log"
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen | None = None
        self._log_offset = 0
        self._episodes: dict[str, int] = {"episodes": 0, "won": 0, "env_steps": 0}

    def command(self) -> list[str]:
        flags = []
        for name, value in vars(self.config).items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                flags.append(flag if value else "--no-" + flag[2:])
            else:
                flags += [flag, str(value)]
        return [sys.executable, "-m", "sao_jax.pipeline.online_agent", *flags,
                "--log", str(self.log_path), "--stats", str(self.stats_path)]  # fmt: skip

    def start(self) -> None:
        if self.process is not None:
            return
        env = {**os.environ, ADMIN_KEY_ENV: self.admin_key}
        env.pop("XLA_FLAGS", None)  # the agent never imports JAX
        repo = str(Path(__file__).resolve().parents[2])  # the folder holding `sao_jax`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                self.command(), env=env, stdout=subprocess.DEVNULL, stderr=stderr
            )

    def stop(self) -> int | None:
        """End the agent (idempotent); its exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def raise_if_failed(self) -> None:
        """`AgentError` if the agent exited with an error; `AgentFinished` if it is done."""
        if self.process is None or self.process.poll() is None:
            return
        code = self.process.returncode
        if code == 0:
            raise AgentFinished(
                "the agent stopped (exit status 0): its episode budget, or a signal"
            )
        tail = self.stderr_path.read_text(errors="replace")[-2000:]
        raise AgentError(f"the agent process exited with status {code}:\n{tail}")

    def guard(self, iterator: Iterator, poll_s: float = 0.2) -> Iterator:
        return guarded(iterator, self.raise_if_failed, poll_s=poll_s)

    def generate(self, num_episodes: int) -> dict:
        raise NotImplementedError("a live agent is asynchronous: use asynchronous=True")

    def episodes(self) -> dict[str, int]:
        """Finished games so far (episodes, won, env_steps), read from the agent's log."""
        if self.log_path.exists():
            with open(self.log_path, encoding="utf-8") as log:
                log.seek(self._log_offset)
                for line in log:
                    if not line.endswith("\n"):
                        break  # being written: read it next time
                    self._log_offset += len(line.encode())
                    record = json.loads(line)
                    self._episodes["episodes"] += 1
                    self._episodes["won"] += int(record["won"])
                    self._episodes["env_steps"] += record["steps"]
        return dict(self._episodes)

    def final_stats(self) -> dict[str, Any]:
        """The agent's own counters, written when it exits ({} before that)."""
        if not self.stats_path.exists():
            return {}
        return json.loads(self.stats_path.read_text())
