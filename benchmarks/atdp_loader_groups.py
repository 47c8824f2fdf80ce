"""What `LoaderConfig.group_by` costs: the loader with and without it over the same groups.

Writes `groups` GRPO-like groups of `group_size` ALFWorld-like episodes (one append each, every
member tagged `task.group_key`, as rollouts write them), then times side by side in one run,
on the same store: an epoch shuffled, an epoch in commit order and a stream, each with
`group_by=None` (today's loader, which may split a group) and `group_by="task.group_key"`,
and counts the groups a batch held whole (identified by each row's first tokens).
Stream times include its `idle_timeout_s` (0.05 s) wait at the end.

    python benchmarks/atdp_loader_groups.py [groups=128] [group_size=4] [rows=16]
        [seq_len=2048] [repeats=3] [out_dir=/tmp/atdp_loader_groups_bench]
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import grain
import numpy as np
from atdp_append import BenchConfig as AppendConfig
from atdp_append import make_episode

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.config_cli import parse_cli

ONE_SHARD = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    groups: groups in the store (one append each).
    group_size: episodes per group.
    turns: LLM calls per episode.
    rows: rows per batch (concat layout: one row per episode).
    seq_len: tokens per row.
    repeats: measurements per side (medians are reported).
    out_dir: scratch directory (deleted afterwards).
    """

    groups: int = 128
    group_size: int = 4
    turns: int = 8
    rows: int = 16
    seq_len: int = 2048
    repeats: int = 3
    out_dir: str = "/tmp/atdp_loader_groups_bench"


PREFIX = 16  # leading tokens that tell the episodes apart


def write_groups(store: AtdpStore, config: BenchConfig) -> dict[bytes, int]:
    """Writes the groups; returns each episode's group by the first tokens of its row."""
    episodes, group_of = AppendConfig(turns=config.turns), {}
    with store.writer("bench") as writer:
        for g in range(config.groups):
            members = []
            for m in range(config.group_size):
                episode = make_episode(g * config.group_size + m, episodes)
                task = dict(episode.header.task, group_key=f"bench-w0-g{g}")
                header = dataclasses.replace(episode.header, task=task)
                members.append(dataclasses.replace(episode, header=header))
                first_input = next(e.llm.input_ids for e in episode.events if e.llm is not None)
                group_of[np.asarray(first_input[:PREFIX], np.int32).tobytes()] = g
            writer.append(members)
    if len(group_of) != config.groups * config.group_size:
        raise ValueError(f"episodes share their first {PREFIX} tokens: raise PREFIX")
    return group_of


def load(store, config: BenchConfig, group_by: str | None, mode: str, group_of: dict):
    """Seconds, batches, and the fraction of groups a batch held whole."""
    loader = AtdpLoader(
        store,
        ["bench"],
        principal="bench",
        config=LoaderConfig(
            rows=config.rows, seq_len=config.seq_len, layout="concat", group_by=group_by
        ),
    )
    if mode == "stream":
        dataset = loader.stream(shard=ONE_SHARD, poll_interval_s=0.01, idle_timeout_s=0.05)
    else:
        dataset = loader.epoch(seed=0, shard=ONE_SHARD, shuffle=mode == "shuffled")
    start = time.perf_counter()
    batches, members = 0, []
    for batch in dataset:
        batches += 1
        members.append(
            Counter(
                group_of[row[:PREFIX].tobytes()]
                for row in batch["tokens"][batch["traj_index"] >= 0]
            )
        )
    seconds = time.perf_counter() - start
    if not batches:  # every episode longer than a row: the loader skipped them all
        raise SystemExit(
            f"the loader made no batch of [{config.rows}, {config.seq_len}] from "
            f"{config.groups} groups of {config.turns}-turn episodes: raise seq_len"
        )
    whole = sum(n == config.group_size for counts in members for n in counts.values())
    return seconds, batches, whole / config.groups


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    root = Path(config.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    results = {}
    try:
        store = AtdpStore.open(root)
        group_of = write_groups(store, config)
        for mode in ("shuffled", "commit", "stream"):
            runs = {None: [], "task.group_key": []}
            for _ in range(config.repeats):  # back to back: the machine is shared
                for group_by, measured in runs.items():
                    measured.append(load(store, config, group_by, mode, group_of))
            results[mode] = {g: sorted(r)[len(r) // 2] for g, r in runs.items()}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{config.groups} groups x {config.group_size} episodes x {config.turns} turns, concat, "
        f"batches [{config.rows}, {config.seq_len}]; median of {config.repeats}"
    )
    print(f"{'mode':8} {'group_by':15} {'seconds':>8} {'batches':>8} {'groups whole':>13}")
    for mode, by_group in results.items():
        for group_by, (seconds, batches, whole) in by_group.items():
            print(f"{mode:8} {group_by!s:15} {seconds:8.3f} {batches:8d} {whole:13.0%}")
        ratio = by_group["task.group_key"][0] / by_group[None][0]
        print(f"{mode:8} group_by takes {ratio:.2f}x the time of the loader without it")


if __name__ == "__main__":
    main(sys.argv[1:])
