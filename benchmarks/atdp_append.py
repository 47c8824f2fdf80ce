"""ATDP append throughput: the full writer vs raw batched TensorStore writes of the same bytes.

Two workloads, each measured side by side in one run on the same disk:

- batch (the rollout loop): `PartitionWriter.append` of `batch` ALFWorld-like episodes per call
  (redaction, validation, encoding, one transaction, head compare-and-swap) vs one TensorStore
  transaction per batch writing the identical records, payloads and token streams into identically
  configured zarr3 arrays.
- sessions (the serving proxy): `sessions` threads appending events one durable call at a time vs
  one raw transaction per event, sequentially (what per-event durability costs without group
  commit).

    python benchmarks/atdp_append.py [trajectories=1024] [batch=32] [turns=8] [sessions=8]
        [repeats=5] [out_dir=/tmp/atdp_append_bench]
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tensorstore as ts

from atdp_io import (
    Action,
    ActionKind,
    AtdpStore,
    DecodingParams,
    Event,
    EventKind,
    EventMetadata,
    Governance,
    LLMCall,
    Outcome,
    Redactor,
    ReplayClass,
    Reward,
    Trajectory,
    TrajectoryHeader,
    layout,
)
from atdp_io.encoding import encode_close, encode_event, encode_open, prepare_event
from sao_jax.config_cli import parse_cli

ROOMS = ["cabinet", "countertop", "drawer", "fridge", "microwave", "sinkbasin", "shelf", "desk"]
OBJECTS = ["mug", "apple", "knife", "plate", "bowl", "spatula", "kettle", "potato"]


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    trajectories: episodes per measurement.
    batch: episodes per append call (batch workload).
    turns: LLM calls (and environment steps) per episode.
    prompt_tokens: first prompt length; later prompts extend it by observation + action.
    obs_tokens: tokens an observation adds to the context.
    output_tokens: sampled tokens per LLM call.
    sessions: concurrent sessions (session workload).
    session_trajectories: episodes written event by event (session workload).
    repeats: measurements per side (medians are reported).
    out_dir: scratch directory (deleted afterwards).
    """

    trajectories: int = 1024
    batch: int = 32
    turns: int = 8
    prompt_tokens: int = 512
    obs_tokens: int = 64
    output_tokens: int = 48
    sessions: int = 8
    session_trajectories: int = 32
    repeats: int = 5
    out_dir: str = "/tmp/atdp_append_bench"


def make_episode(index: int, config: BenchConfig, tenant: str = "bench") -> Trajectory:
    """An ALFWorld-like episode: per turn an LLM call on the growing context, then an env step."""
    rng = np.random.default_rng(index)
    context = rng.integers(0, 151_000, config.prompt_tokens).astype(np.int32)
    events = []
    for turn in range(config.turns):
        output = rng.integers(0, 151_000, config.output_tokens).astype(np.int32)
        where, what = rng.choice(ROOMS), rng.choice(OBJECTS)
        command = f"go to {where} {turn + 1}"
        llm = LLMCall(
            model_id="qwen3-30b-a3b",
            policy_version=index // 64,
            input_ids=context,
            output_ids=output,
            output_logprobs=-rng.exponential(0.5, config.output_tokens).astype(np.float32),
            decoding=DecodingParams(temperature=1.0, top_p=1.0, max_tokens=512),
            prompt_template_fingerprint="chatml-alfworld-v1",
            system_prompt_version="alfworld-react-v2",
        )
        events.append(
            Event(
                EventKind.LLM_CALL,
                ReplayClass.DETERMINISTIC,
                hidden={"thought": f"The {what} is probably in a {where}; check there first."},
                action=Action(ActionKind.COMMAND, text=command),
                llm=llm,
                metadata=EventMetadata(timestamp=1.8e9 + turn, latency_s=0.4, model_id="qwen3"),
            )
        )
        observation = (
            f"You arrive at {where} {turn + 1}. On the {where} {turn + 1}, you see a {what} "
            f"{turn + 2}, a {rng.choice(OBJECTS)} 1, and a {rng.choice(OBJECTS)} 3."
        )
        reward = 1.0 if turn == config.turns - 1 else 0.0
        events.append(
            Event(
                EventKind.ENV_STEP,
                ReplayClass.APPROXIMATE,
                observation=observation,
                action=Action(ActionKind.COMMAND, text=command),
                rewards=(Reward(reward, "env"),) if reward else (),
            )
        )
        obs_ids = rng.integers(0, 151_000, config.obs_tokens).astype(np.int32)
        context = np.concatenate([context, output, obs_ids])
    header = TrajectoryHeader(
        trajectory_id=f"ep-{index:06d}",
        governance=Governance.synthetic(tenant, expires_at=None),
        created_at=1.8e9,
        task={"env": "alfworld", "split": "train", "index": index},
    )
    return Trajectory(header, tuple(events), Outcome(success=True))


class RawPartition:
    """Identically configured zarr3 arrays written with plain transactions (the reference)."""

    def __init__(self, root: Path, config: layout.StoreConfig):
        spec = layout.kvstore_spec(root)
        self.arrays = layout.open_arrays(spec, config, create=True)
        self.next = {"records": 0, "tokens": 0, "meta": 0}

    def write(self, encoded: list) -> None:
        rows, metas, streams = [], [], {n: [] for n in layout.TOKEN_STREAMS}
        tokens, meta = self.next["tokens"], self.next["meta"]
        for record in encoded:
            rows.append(record.row(tokens, meta))
            metas.append(record.meta)
            meta += len(record.meta)
            if record.streams is not None:
                for name in layout.TOKEN_STREAMS:
                    streams[name].extend(record.streams[name])
                tokens += record.n_tokens
        txn = ts.Transaction()
        futures = [
            self._put(self.arrays.records, txn, "records", np.array(rows, np.int64)),
            self._put(self.arrays.meta, txn, "meta", np.frombuffer(b"".join(metas), np.uint8)),
        ]
        if streams["tokens"]:
            for name in layout.TOKEN_STREAMS:
                data = np.concatenate(streams[name])
                futures.append(self._put(getattr(self.arrays, name), txn, name, data))
        for future in futures:
            future.result()
        txn.commit_sync()
        self.next.update(records=self.next["records"] + len(rows), tokens=tokens, meta=meta)

    def _put(self, array, txn, name, data):
        key = "tokens" if name in layout.TOKEN_STREAMS else name
        start = self.next[key]
        return array.with_transaction(txn)[start : start + data.shape[0]].write(data)


def encode_trajectory(traj: Trajectory, redactor: Redactor, row: int) -> list:
    """The writer's exact records for a trajectory (redacted, encoded), for the raw side."""
    header = redactor.redact_header(traj.header)
    records, context = [encode_open(header, row)], None
    for index, event in enumerate(traj.events):
        record, context = encode_event(prepare_event(event, redactor)[0], row, index, context)
        records.append(record)
    records.append(encode_close(traj.outcome, row))
    return records


def bench_batch(config: BenchConfig, episodes: list, root: Path) -> dict:
    redactor = Redactor()
    batches = [episodes[i : i + config.batch] for i in range(0, len(episodes), config.batch)]
    encoded, row = [], 0
    for batch in batches:
        records = []
        for traj in batch:
            records += encode_trajectory(traj, redactor, row)
            row += len(traj.events) + 2
        encoded.append(records)
    stored_tokens = sum(r.n_tokens for records in encoded for r in records)
    logical = sum(e.llm.context_ids.shape[0] for t in episodes for e in t.events if e.llm)
    ours, pipelined, raw = [], [], []
    for rep in range(config.repeats):
        store = AtdpStore.open(root / f"ours{rep}")
        with store.writer("bench") as writer:
            start = time.perf_counter()
            for batch in batches:
                writer.append(batch)
            ours.append(time.perf_counter() - start)
            assert writer.stats["tokens"] == stored_tokens
        with AtdpStore.open(root / f"async{rep}").writer("bench") as writer:
            start = time.perf_counter()
            for batch in batches:
                writer.append_async(batch)
            writer.flush()
            pipelined.append(time.perf_counter() - start)
            assert writer.stats["tokens"] == stored_tokens
            async_commits = writer.stats["commits"]
        partition = RawPartition(root / f"raw{rep}", store.config)
        start = time.perf_counter()
        for records in encoded:
            partition.write(records)
        raw.append(time.perf_counter() - start)
    return {
        "ours_s": statistics.median(ours),
        "async_s": statistics.median(pipelined),
        "raw_s": statistics.median(raw),
        # The machine is shared: each repeat runs the sides back to back, and the ratio is the
        # median of the per-repeat ratios.
        "ratio": statistics.median(r / o for r, o in zip(raw, ours, strict=True)),
        "async_ratio": statistics.median(r / o for r, o in zip(raw, pipelined, strict=True)),
        "stored_tokens": stored_tokens,
        "logical_tokens": logical,
        "commits": len(batches),
        "async_commits": async_commits,
    }


def write_sessions(writer, episodes: list, threads: int) -> None:
    """`threads` workers, each writing whole episodes one durable event at a time."""
    queue, lock = list(episodes), threading.Lock()

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                traj = queue.pop()
            with writer.open_trajectory(traj.header) as session:
                for event in traj.events:
                    session.append_event(event)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()


def bench_sessions(config: BenchConfig, episodes: list, root: Path) -> dict:
    redactor = Redactor()
    encoded, row = [], 0
    for traj in episodes:
        records = encode_trajectory(traj, redactor, row)
        row += len(records)
        encoded += records
    ours, raw = [], []
    for rep in range(config.repeats):
        store = AtdpStore.open(root / f"sessions{rep}")
        with store.writer("bench") as writer:
            start = time.perf_counter()
            write_sessions(writer, episodes, config.sessions)
            ours.append(time.perf_counter() - start)
            commits = writer.stats["commits"]
        partition = RawPartition(root / f"raw_sessions{rep}", store.config)
        start = time.perf_counter()
        for record in encoded:
            partition.write([record])
        raw.append(time.perf_counter() - start)
    return {
        "ours_s": statistics.median(ours),
        "raw_s": statistics.median(raw),
        "ratio": statistics.median(r / o for r, o in zip(raw, ours, strict=True)),
        "events": len(encoded),
        "commits": commits,
    }


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    root = Path(config.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    episodes = [make_episode(i, config) for i in range(config.trajectories)]
    live = [make_episode(10**6 + i, config) for i in range(config.session_trajectories)]
    try:
        batch = bench_batch(config, episodes, root)
        sessions = bench_sessions(config, live, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = config.trajectories
    print(
        f"{n} episodes x {config.turns} turns, prompt {config.prompt_tokens} + "
        f"{config.obs_tokens + config.output_tokens}/turn tokens; median of {config.repeats}"
    )
    print(
        f"batch ({config.batch}/append, {batch['commits']} commits): "
        f"stored {batch['stored_tokens']:,} tokens of {batch['logical_tokens']:,} logical"
    )
    print(f"{'side':13} {'seconds':>8} {'traj/s':>9} {'stored tok/s':>13} {'logical tok/s':>14}")
    for side, label in (("raw", "raw"), ("ours", "append"), ("async", "append_async")):
        seconds = batch[f"{side}_s"]
        print(
            f"{label:13} {seconds:8.3f} {n / seconds:9.1f}"
            f" {batch['stored_tokens'] / seconds:13,.0f} {batch['logical_tokens'] / seconds:14,.0f}"
        )
    print(
        f"append throughput: {batch['ratio']:.0%} of raw batched writes (durable per call); "
        f"append_async {batch['async_ratio']:.0%} ({batch['async_commits']} group commits)"
    )
    print(
        f"sessions ({config.sessions} threads, {sessions['events']} durable calls, "
        f"{sessions['commits']} group commits): ours {sessions['events'] / sessions['ours_s']:,.0f}"
        f" calls/s vs raw per-call transactions {sessions['events'] / sessions['raw_s']:,.0f}/s "
        f"({sessions['ratio']:.0%})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
