"""How long a checkpoint blocks the training loop: asynchronous vs synchronous orbax saves.

Saves the policy and its AdamW state (the learner's heaviest items) of a model preset, side by
side in one run, and prints the time `Checkpointer.save` holds the caller in each mode, the
time until the step is on disk, and the restore time.

    python benchmarks/checkpoint_async.py [preset=small] [repeats=3] [out_dir=/tmp/ckpt_bench]
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

import jax
import optax
from flax import nnx

from sao_jax.checkpoint import Checkpointer
from sao_jax.config_cli import parse_cli
from sao_jax.models import get_model_config, init_model


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset whose policy + AdamW state is saved.
    repeats: saves per mode (the median is reported).
    out_dir: scratch directory (deleted afterwards).
    """

    preset: str = "small"
    repeats: int = 3
    out_dir: str = "/tmp/ckpt_bench"


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(directory: Path, items: dict, repeats: int, async_save: bool) -> dict[str, float]:
    blocked, finished = [], []
    with Checkpointer(directory, max_to_keep=2, async_save=async_save) as ckpt:
        for step in range(repeats):
            start = time.perf_counter()
            ckpt.save(step, items)
            blocked.append(time.perf_counter() - start)
            ckpt.wait_until_finished()
            finished.append(time.perf_counter() - start)
        start = time.perf_counter()
        restored = ckpt.restore({name: None for name in items})
        jax.block_until_ready(restored.items)
        restore = time.perf_counter() - start
    return {"blocked_s": median(blocked), "on_disk_s": median(finished), "restore_s": restore}


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    model = init_model(get_model_config(config.preset))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-4), wrt=nnx.Param)
    items = {"policy": model, "policy_opt": optimizer}
    size = sum(x.nbytes for x in jax.tree.leaves(nnx.state((model, optimizer))))
    root = Path(config.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    try:
        sync = measure(root / "sync", items, config.repeats, async_save=False)
        async_ = measure(root / "async", items, config.repeats, async_save=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"preset={config.preset} checkpoint={size / 2**20:.0f} MiB (policy + AdamW state), "
        f"median of {config.repeats}, {jax.device_count()} {jax.default_backend()} device(s)"
    )
    print(f"{'mode':6} {'save blocks (s)':>16} {'on disk (s)':>12} {'restore (s)':>12}")
    for name, row in (("sync", sync), ("async", async_)):
        print(
            f"{name:6} {row['blocked_s']:16.3f} {row['on_disk_s']:12.3f} {row['restore_s']:12.3f}"
        )
    print(f"async blocks the loop {sync['blocked_s'] / async_['blocked_s']:.1f}x less than sync")


if __name__ == "__main__":
    main(sys.argv[1:])
