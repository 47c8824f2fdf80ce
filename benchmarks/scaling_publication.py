"""Weight publication in a multi-host job: device to device ("per_host") vs through host memory.

Each host of the ALFWorld experiment samples on its own devices, so after every policy step
the learner's weights (sharded over every process) are resharded to each process's rollout
mesh. `sao_jax.distributed.reshard` does it in one `jax.device_put` onto a (host x local)
layout; the reference is the host-memory path it replaced (`process_allgather` of each leaf,
then placing this process's shards). Both run side by side in the same 2-process job
(`local_launch`, 2 fake CPU devices per process), on the same policy, `repeats` times each;
process 0 prints the best time of each and the ratio.

    python benchmarks/scaling_publication.py [preset=tiny] [repeats=5]
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sao_jax.config_cli import parse_cli


@dataclasses.dataclass
class BenchConfig:
    """
    Attributes:
      preset: model preset of the published policy.
      repeats: timed publications of each kind (the best counts).
    """

    preset: str = "tiny"
    repeats: int = 5


def worker(out: Path, bench: BenchConfig) -> None:
    import jax
    from flax import nnx

    from sao_jax.distributed import (
        HybridMeshConfig,
        initialize,
        make_global_mesh,
        reshard,
        rollout_shardings,
        shutdown,
    )
    from sao_jax.distributed.resharding import _reshard_leaf
    from sao_jax.models import get_model_config, init_model
    from sao_jax.sharding import MeshConfig

    info = initialize()
    train = make_global_mesh(
        HybridMeshConfig(
            ici=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
            dcn=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
        )
    )
    local = make_global_mesh(MeshConfig(), jax.local_devices())
    policy = init_model(get_model_config(bench.preset, vocab_size=4096), mesh=train)
    state = nnx.state(policy)
    targets = rollout_shardings(state, local)
    leaves, target_leaves = jax.tree.leaves(state), jax.tree.leaves(targets)
    nbytes = sum(x.size * x.dtype.itemsize for x in leaves)

    def per_host():
        jax.block_until_ready(reshard(state, targets))

    def via_host():
        jax.block_until_ready(
            [_reshard_leaf(x, t) for x, t in zip(leaves, target_leaves, strict=True)]
        )

    best = {}
    for name, fn in (("per_host", per_host), ("host", via_host)):
        fn()  # compile / warm up
        times = []
        for _ in range(bench.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        best[name] = min(times)
    if info.process_index == 0:
        (out / "result.json").write_text(json.dumps({"bytes": nbytes, **best}))
    shutdown()


def main(argv: list[str]) -> None:
    from sao_jax.distributed.local_launch import launch_local

    bench = parse_cli(argv, BenchConfig, prog="scaling_publication.py", description=__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        result = launch_local(
            [sys.executable, __file__, *argv],
            2,
            devices_per_process=2,
            logs=out / "logs",
            env=dict(os.environ, PUBLICATION_OUT=str(out)),
        )
        if not result.ok:
            raise SystemExit(result.describe())
        figures = json.loads((out / "result.json").read_text())
    gib = figures["bytes"] / 2**30
    print(f"policy ({bench.preset}): {gib:.3f} GiB over 2 processes x 2 fake CPU devices")
    for name in ("per_host", "host"):
        rate = gib / figures[name]
        print(
            f"  {name:9s} best of {bench.repeats}: {figures[name] * 1e3:8.1f} ms  ({rate:.2f} GiB/s)"
        )
    print(f"  host / per_host: {figures['host'] / figures['per_host']:.2f}x")
    assert np.isfinite(figures["per_host"])


if __name__ == "__main__":
    if "SAO_PROCESS_ID" in os.environ:  # one process of the job main() launched
        worker(Path(os.environ["PUBLICATION_OUT"]), parse_cli(sys.argv[1:], BenchConfig))
    else:
        main(sys.argv[1:])
