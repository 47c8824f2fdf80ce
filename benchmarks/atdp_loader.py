"""ATDP loader throughput: the grain loader vs raw TensorStore reads of the same bytes.

Writes `trajectories` ALFWorld-like episodes once, then measures side by side in one run:
- ours: `AtdpLoader.epoch` (governance check, batched fetch, decoding, layout, padding into
  fixed `[rows, seq_len]` batches, shuffled, through grain with `read_threads` threads);
- raw: for the same trajectories, one TensorStore batch reading their payload bytes and token
  streams, and the token ids copied into a zero-padded `[rows, seq_len]` array: the I/O + copy
  floor with no decoding.

    python benchmarks/atdp_loader.py [trajectories=512] [rows=16] [seq_len=2048]
        [layout=concat] [read_threads=2] [repeats=3] [out_dir=/tmp/atdp_loader_bench]
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
import time
from pathlib import Path

import grain
import numpy as np
import tensorstore as ts
from atdp_append import BenchConfig as AppendConfig
from atdp_append import make_episode

from atdp_io import AtdpStore, layout
from atdp_io.layout import Col
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.config_cli import parse_cli


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    trajectories: episodes in the store.
    turns: LLM calls per episode.
    rows: rows per batch.
    seq_len: tokens per row.
    layout: concat (one row per episode) or windowed (one row per LLM call).
    read_threads: grain read threads.
    repeats: measurements per side (medians are reported).
    out_dir: scratch directory (deleted afterwards).
    """

    trajectories: int = 512
    turns: int = 8
    rows: int = 16
    seq_len: int = 2048
    layout: str = "concat"
    read_threads: int = 2
    repeats: int = 3
    out_dir: str = "/tmp/atdp_loader_bench"


def load_ours(store: AtdpStore, config: BenchConfig, shuffle: bool) -> tuple[float, int, int]:
    loader = AtdpLoader(
        store,
        ["bench"],
        principal="bench",
        config=LoaderConfig(rows=config.rows, seq_len=config.seq_len, layout=config.layout),
    )
    shard = grain.sharding.ShardOptions(shard_index=0, shard_count=1)
    start = time.perf_counter()
    batches = tokens = 0
    epoch = loader.epoch(seed=0, shard=shard, shuffle=shuffle, read_threads=config.read_threads)
    for batch in epoch:
        batches += 1
        tokens += int(batch["segment_ids"].sum())
    if not batches:  # every episode longer than a row: the loader skipped them all
        raise SystemExit(
            f"the loader made no batch of [{config.rows}, {config.seq_len}] from "
            f"{config.trajectories} episodes of {config.turns} turns: raise seq_len"
        )
    return time.perf_counter() - start, batches, tokens


def load_raw(store: AtdpStore, config: BenchConfig, shuffle: bool) -> tuple[float, int]:
    reader = store.reader("bench", principal="bench")
    reader.refresh()
    arrays = layout.open_arrays(store.partition_spec("bench"), store.config, create=False)
    records = reader.index.records
    entries = reader.entries()
    if shuffle:  # the loader's order: the same grain shuffle of the same snapshot
        entries = list(grain.MapDataset.source(entries).shuffle(0))
    start = time.perf_counter()
    batches = 0
    for first in range(0, len(entries), config.rows):
        chunk = entries[first : first + config.rows]
        batch = ts.Batch()
        pending = []
        for entry in chunk:
            rows = records[[entry.row, *entry.event_rows, entry.close_row]]
            meta = (rows[0, Col.META_START], rows[-1, Col.META_START] + rows[-1, Col.META_LEN])
            token_rows = rows[rows[:, Col.OUTPUT_LEN] > 0]
            lo = token_rows[0, Col.TOKEN_START]
            hi = token_rows[-1, Col.TOKEN_START] + token_rows[-1, Col.INPUT_LEN]
            hi += token_rows[-1, Col.OUTPUT_LEN]
            reads = [arrays.meta[meta[0] : meta[1]].read(batch=batch)]
            reads += [getattr(arrays, n)[lo:hi].read(batch=batch) for n in layout.TOKEN_STREAMS]
            pending.append(reads)
        batch.submit()
        tokens = np.zeros((config.rows, config.seq_len), np.int32)
        for r, reads in enumerate(pending):
            data = [f.result() for f in reads][1]
            n = min(data.shape[0], config.seq_len)
            tokens[r, :n] = data[:n]
        batches += 1
    return time.perf_counter() - start, batches


def median_run(runs: list[tuple]) -> tuple:
    """The run with the median time."""
    return sorted(runs)[len(runs) // 2]


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    root = Path(config.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    episodes = AppendConfig(turns=config.turns)
    try:
        store = AtdpStore.open(root)
        with store.writer("bench") as writer:
            for first in range(0, config.trajectories, 64):
                last = min(first + 64, config.trajectories)
                writer.append([make_episode(i, episodes) for i in range(first, last)])
        results = {}
        for shuffle in (True, False):
            ours, raw = [], []
            for _ in range(config.repeats):  # back to back: the machine is shared
                ours.append(load_ours(store, config, shuffle))
                raw.append(load_raw(store, config, shuffle))
            ratio = statistics.median(r[0] / o[0] for r, o in zip(raw, ours, strict=True))
            results[shuffle] = (median_run(ours), median_run(raw), ratio)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = config.trajectories
    print(
        f"{n} episodes x {config.turns} turns, layout={config.layout}, batches "
        f"[{config.rows}, {config.seq_len}], {config.read_threads} read threads; median of "
        f"{config.repeats}"
    )
    print(f"{'order':8} {'side':5} {'seconds':>8} {'batches/s':>10} {'traj/s':>9} {'tokens/s':>11}")
    for shuffle, ((ours_s, batches, tokens), (raw_s, raw_batches), ratio) in results.items():
        order = "shuffled" if shuffle else "commit"
        print(f"{order:8} {'raw':5} {raw_s:8.3f} {raw_batches / raw_s:10.1f} {n / raw_s:9.1f}")
        print(
            f"{order:8} {'ours':5} {ours_s:8.3f} {batches / ours_s:10.1f} {n / ours_s:9.1f} "
            f"{tokens / ours_s:11,.0f}"
        )
        print(f"{order:8} loader at {ratio:.0%} of raw reads of the same bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
