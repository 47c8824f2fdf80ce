"""One process of `test_per_host_reshard.py`: a policy trained on a mesh whose fsdp axis spans
both processes is resharded onto a mesh of this process's own devices (what each host's
sampler receives), device to device; the result is compared with the host-memory path.
Writes OUT_DIR/process<i>.json.

    python per_host_reshard_worker.py OUT_DIR   (env: SAO_* from local_launch, 2 devices each)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from sao_jax.distributed import (
    HybridMeshConfig,
    initialize,
    make_global_mesh,
    reshard,
    rollout_shardings,
    shutdown,
    transfer_method,
)
from sao_jax.distributed.resharding import _reshard_leaf
from sao_jax.models import get_model_config, init_model
from sao_jax.sharding import MeshConfig

TRAIN = HybridMeshConfig(
    ici=MeshConfig(data=1, fsdp=1, expert=2, tensor=1),
    dcn=MeshConfig(data=1, fsdp=2, expert=1, tensor=1),  # fsdp across the processes
)
LOCAL = MeshConfig(data=1, fsdp=1, expert=1, tensor=-1)  # tensor over this process's devices


def main(out: Path) -> None:
    info = initialize()
    train = make_global_mesh(TRAIN)
    local = make_global_mesh(LOCAL, jax.local_devices())
    policy = init_model(get_model_config("test", vocab_size=64), seed=3, mesh=train)
    state = nnx.state(policy)
    targets = rollout_shardings(state, local)
    leaves = jax.tree.leaves(state)
    target_leaves = jax.tree.leaves(targets)
    methods = {transfer_method(x.sharding, t) for x, t in zip(leaves, target_leaves, strict=True)}
    spread = sum(not x.is_fully_addressable for x in leaves)  # leaves split across processes

    moved = jax.tree.leaves(reshard(state, targets))
    via_host = [_reshard_leaf(x, t) for x, t in zip(leaves, target_leaves, strict=True)]
    full = [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in leaves]
    record = {
        "process": info.process_index,
        "methods": sorted(methods),
        "leaves": len(leaves),
        "spread_over_processes": spread,
        "on_local_mesh": all(
            y.is_fully_addressable and y.sharding == t
            for y, t in zip(moved, target_leaves, strict=True)
        ),
        "equal_to_host_path": all(
            np.array_equal(np.asarray(y), np.asarray(h))
            for y, h in zip(moved, via_host, strict=True)
        ),
        "equal_to_source": all(
            np.array_equal(np.asarray(y), f) for y, f in zip(moved, full, strict=True)
        ),
        "source_still_valid": all(not x.is_deleted() for x in leaves),
        "sharded_locally": sum(
            len({str(s.index) for s in y.addressable_shards}) > 1 for y in moved
        ),
    }
    (out / f"process{info.process_index}.json").write_text(json.dumps(record))
    shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
