"""One process of the 2-process SAO test (`test_multiprocess_sao.py` starts two of these).

    python multiprocess_sao_worker.py STORE_DIR OUT_DIR
    (env: SAO_COORDINATOR_ADDRESS, SAO_NUM_PROCESSES, SAO_PROCESS_ID, XLA_FLAGS)
    python multiprocess_sao_worker.py STORE_DIR OUT_DIR --reference   (one process, 4 devices)

Joins the job through `sao_jax.distributed.initialize`, builds a hybrid mesh (expert within a
process, fsdp across processes), reads this process's shard of the ATDP buffer through the
loader (the grain shard of its index, disjoint from the other process's), runs one SAO learner
iteration (DIS policy step + critic steps), logs on process 0, saves and restores an orbax
checkpoint collectively, reshards the policy to a rollout layout (same devices, and another
device subset through host memory), and has process 0 write every trained parameter to
OUT_DIR/params.npz plus its checks to OUT_DIR/worker.json.

`--reference` runs the same iteration in one process on 4 devices with a mesh of the same
shape, on the batch both shards make together, and writes OUT_DIR/reference.npz.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from atdp_io import AtdpStore
from sao_jax.checkpoint import Checkpointer
from sao_jax.distributed import (
    HybridMeshConfig,
    barrier,
    describe_mesh,
    initialize,
    make_global_mesh,
    reshard,
    rollout_shardings,
    shutdown,
)
from sao_jax.metrics import MetricsWriter
from sao_jax.models import init_model
from sao_jax.rollout import WeightPublisher
from sao_jax.sharding import MeshConfig, make_mesh
from sao_jax.train.learner import Learner

sys.path.insert(0, str(Path(__file__).parent))
from multiprocess_sao_setup import (
    MODEL,
    ROWS,
    SEQ_LEN,
    learner_config,
    make_loader,
    shard_batch,
)

# fsdp spans the two processes (DCN-like), expert stays inside each (ICI-like).
HYBRID = HybridMeshConfig(
    ici=MeshConfig(data=1, fsdp=1, expert=2, tensor=1),
    dcn=MeshConfig(data=1, fsdp=2, expert=1, tensor=1),
)


def gathered(state) -> dict[str, np.ndarray]:
    """Every leaf of a (sharded, multi-process) state as full numpy arrays, on every process."""
    flat = {
        "/".join(map(str, path)): variable.get_value()
        for path, variable in nnx.to_flat_state(state)
    }
    return {
        k: np.asarray(v) for k, v in multihost_utils.process_allgather(flat, tiled=True).items()
    }


def main(store_dir: str, out_dir: str) -> None:
    info = initialize()
    assert (info.process_count, info.device_count, info.mode) == (2, 4, "explicit"), info
    out = Path(out_dir)
    mesh = make_global_mesh(HYBRID)
    checks: dict = {"mesh": describe_mesh(mesh)}

    store = AtdpStore.open(store_dir)
    batch = next(iter(make_loader(store).epoch(shuffle=False)))
    assert batch["tokens"].shape == (ROWS, SEQ_LEN)  # this process's rows only
    # The loader's default shard is this process's: the grain shard of that index, and the
    # processes' trajectories are disjoint.
    own = shard_batch(store, info.process_index, info.process_count)
    checks["loader_own_shard"] = all(np.array_equal(batch[k], own[k]) for k in own)
    every = multihost_utils.process_allgather(batch["tokens"] * (batch["loss_mask"] > 0))
    rows = [{r.tobytes() for r in tokens if r.any()} for tokens in every]
    checks["loader_disjoint"] = all(rows) and not rows[0] & rows[1]
    learner = Learner(learner_config(), init_model(MODEL, mesh=mesh), mesh=mesh)
    with MetricsWriter(out, tensorboard=False) as log:
        metrics = learner.iteration(batch)
        log.write(1, metrics)
    checks["policy_version"] = learner.policy_version

    trained = {
        "policy": gathered(learner.policy_params),
        "critic": gathered(learner.critic_params),
    }
    with Checkpointer(out / "checkpoints", async_save=True) as checkpointer:
        learner.save(checkpointer, 1)
        checkpointer.wait_until_finished()
        fresh = Learner(learner_config(), init_model(MODEL, mesh=mesh, seed=7), mesh=mesh)
        fresh.restore(checkpointer)
    restored = gathered(fresh.policy_params)
    checks["restored_equal"] = all(
        np.array_equal(restored[k], v) for k, v in trained["policy"].items()
    )
    checks["restored_on_mesh"] = all(
        x.sharding.mesh.devices.shape == mesh.devices.shape
        for x in jax.tree.leaves(fresh.policy_params)
    )

    # Rollout layouts: tensor x data on the same 4 devices (direct device_put), and data over
    # the second device of each process (a different device set: through host memory).
    policy = learner.policy_module()
    same_devices = make_mesh(MeshConfig(data=2, fsdp=1, expert=1, tensor=2))
    second_of_each = [d for d in jax.devices() if d.id % 2]
    subset = make_mesh(MeshConfig(data=2, fsdp=1, expert=1, tensor=1), second_of_each)
    publisher = WeightPublisher(shardings=rollout_shardings(policy, subset))
    for name, target in (("same_devices", same_devices), ("other_devices", subset)):
        if name == "same_devices":
            moved = reshard(policy, rollout_shardings(policy, target))
        else:  # publication to the rollout mesh (what a learner does after its step)
            moved = publisher.publish(policy, learner.policy_version).params
        values = gathered(moved)
        checks[f"reshard_{name}"] = all(
            np.array_equal(values[k], trained["policy"][k]) for k in values
        ) and all(leaf.sharding.mesh == target for leaf in jax.tree.leaves(moved))

    if info.is_coordinator:
        np.savez(
            out / "params.npz",
            **{f"{m}:{k}": v for m, tree in trained.items() for k, v in tree.items()},
        )
        (out / "worker.json").write_text(json.dumps(checks))
    barrier("multiprocess_sao_worker_done")
    shutdown()


def reference(store_dir: str, out_dir: str) -> None:
    """One process, 4 devices, mesh data=1 fsdp=2 expert=2 tensor=1; process 1's trajectory
    slots offset by ROWS, as the learner does with several processes."""
    store = AtdpStore.open(store_dir)
    parts = [shard_batch(store, i, 2) for i in range(2)]
    slots = parts[1]["traj_index"]
    parts[1]["traj_index"] = np.where(slots >= 0, slots + ROWS, -1)
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    mesh = make_mesh(MeshConfig(data=1, fsdp=2, expert=2, tensor=1))
    learner = Learner(learner_config(), init_model(MODEL, mesh=mesh), mesh=mesh)
    learner.iteration(batch)
    trained = {"policy": gathered(learner.policy_params), "critic": gathered(learner.critic_params)}
    np.savez(
        Path(out_dir) / "reference.npz",
        **{f"{m}:{k}": v for m, tree in trained.items() for k, v in tree.items()},
    )


if __name__ == "__main__":
    (reference if "--reference" in sys.argv else main)(*sys.argv[1:3])
