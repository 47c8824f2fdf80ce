"""MFU of the SAO learner iteration: one process on 4 devices vs 2 processes on 2 devices each.

Both runs use the same mesh shape and the same global batch; the 2-process mesh puts part of
`fsdp` inside each process and part across them (ici x dcn), as a multi-host job does. Each
mode is started as fresh processes by this script, side by side in one run, so the ratio
shows what the multi-controller runtime costs (cross-process collectives over loopback gloo
instead of in-process rendezvous, per-process batch assembly). Fake CPU devices share this
machine's cores.

An iteration is the real `sao_jax.train.Learner.iteration`: critic values -> linked GAE ->
one DIS policy step -> `critic.steps` critic steps. Model FLOPs (`benchmarks/mfu.py`'s count:
6 x activated matmul parameters per token + causal attention, no routing or padding) are
summed over the policy step (with the LM head), each critic step (no LM head; its frozen
attention still back-propagates, counted in full) and the critic forward of the advantages.
MFU = model FLOPs / best iteration time / this CPU's best f32 matmul FLOP/s.

Defaults (one layer of the `small` preset, `expert=1`) are what this 2-core, 24 GB box runs:
compiling the learner's steps over 4 fake devices takes ~2 GB of host memory per layer, and
with `expert=2` next to `fsdp` XLA:CPU deadlocks (its fake devices run independent
collectives of different device groups in different orders; they abort after a timeout).

    python benchmarks/scaling_mfu.py [preset=small] [num_layers=1] [rows=8] [seq_len=256]
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mfu import matmul_flops_per_s, model_flops_per_token

from sao_jax.config_cli import parse_cli
from sao_jax.xla_flags import with_cpu_device_count, with_default

DEVICES = 4
MODES = {"1 process x 4 devices": 1, "2 processes x 2 devices": 2}


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: model preset. vocab: vocabulary size (presets are sized for a tokenizer that
    overrides it). dispatch: MoE dispatch. rows: global rows per batch. seq_len: tokens per
    row. steps: timed iterations after the compiling one (the best is reported).
    expert: expert-axis size within each process (fsdp takes the rest, across processes
    too). num_layers: override of the preset's depth (0: the preset's).
    matmul_size: side of the square matmuls that measure peak FLOP/s.
    """

    preset: str = "small"
    vocab: int = 4096
    dispatch: str = "expert_parallel"
    rows: int = 8
    seq_len: int = 256
    steps: int = 3
    expert: int = 1
    num_layers: int = 1
    matmul_size: int = 2048


def model_config(cfg: BenchConfig):
    from sao_jax.models import get_model_config

    depth = {"num_layers": cfg.num_layers} if cfg.num_layers else {}
    return get_model_config(
        cfg.preset, vocab_size=cfg.vocab, moe_dispatch=cfg.dispatch, capacity_factor=0.0, **depth
    )


def synthetic_batch(rows: int, seq_len: int, vocab: int, seed: int) -> dict:
    """A loader-shaped batch: one trajectory per row, prompt then reply (the second half is
    trainable), the win reward on every other row's last reply token."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mask = np.zeros((rows, seq_len), np.int32)
    mask[:, seq_len // 2 :] = 1
    rewards = np.zeros((rows, seq_len), np.float32)
    rewards[::2, -1] = 1.0
    return {
        "tokens": rng.integers(3, vocab, (rows, seq_len)).astype(np.int32),
        "loss_mask": mask,
        # near a fresh policy's -log V, so DIS keeps (and trains on) most tokens
        "rollout_logp": np.where(
            mask > 0, -np.log(vocab) + rng.uniform(-0.2, 0.2, mask.shape), 0.0
        ).astype(np.float32),
        "rewards": rewards,
        "versions": np.where(mask > 0, 0, -1).astype(np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), mask.shape).copy(),
        "segment_ids": np.ones((rows, seq_len), np.int32),
        "traj_index": np.arange(rows, dtype=np.int32),
        "turn_index": np.zeros((rows,), np.int32),
    }


def child(cfg: BenchConfig) -> None:
    """One process of a mode: time Learner.iteration; process 0 prints the result as JSON."""

    from sao_jax.distributed import HybridMeshConfig, initialize, make_global_mesh
    from sao_jax.models import init_model
    from sao_jax.sharding import MeshConfig
    from sao_jax.train import CriticConfig, LearnerConfig
    from sao_jax.train.learner import Learner

    info = initialize()
    mesh = make_global_mesh(
        HybridMeshConfig(
            ici=MeshConfig(data=1, fsdp=-1, expert=cfg.expert, tensor=1),
            dcn=MeshConfig(data=1, fsdp=-1, expert=1, tensor=1),
        )
    )
    rows = cfg.rows // info.process_count
    batch = synthetic_batch(rows, cfg.seq_len, cfg.vocab, seed=info.process_index)
    learner = Learner(
        LearnerConfig(critic=CriticConfig(warmup_steps=0)),
        init_model(model_config(cfg), mesh=mesh),
        mesh=mesh,
    )
    times = []
    for _ in range(cfg.steps + 1):
        start = time.perf_counter()
        learner.iteration(batch)
        times.append(time.perf_counter() - start)
    if info.is_coordinator:
        print(
            json.dumps({"compile_s": times[0], "best_s": min(times[1:]), "mesh": dict(mesh.shape)})
        )


def run_mode(processes: int, argv: list[str]) -> dict:
    """Start `processes` children over loopback with DEVICES / processes fake devices each."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        # fake devices are threads: on a loaded machine one may reach a collective long after
        # its peers (XLA:CPU aborts after 40 s by default; a true deadlock still aborts)
        XLA_FLAGS=with_default(
            with_cpu_device_count(os.environ.get("XLA_FLAGS", ""), DEVICES // processes),
            "--xla_cpu_collective_call_terminate_timeout_seconds=300",
        ),
    )
    if processes > 1:
        env.update(SAO_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", SAO_NUM_PROCESSES=str(processes))
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", *argv],
            env=dict(env, SAO_PROCESS_ID=str(i)) if processes > 1 else env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    outputs, errors = zip(*(c.communicate() for c in children), strict=True)
    failed = [i for i, c in enumerate(children) if c.returncode]
    if failed:
        tail = "\n".join(errors[failed[0]].strip().splitlines()[-12:])
        raise SystemExit(
            f"child process(es) {failed} of the {processes}-process mode exited with "
            f"{[children[i].returncode for i in failed]}; child {failed[0]}'s stderr ends:\n{tail}"
        )
    return json.loads(outputs[0].strip().splitlines()[-1])


def iteration_flops(cfg: BenchConfig, critic_steps: int) -> float:
    config = model_config(cfg)
    policy = model_flops_per_token(config, cfg.seq_len)
    critic = policy - 6 * config.d_model * config.vocab_size  # no LM head
    return cfg.rows * cfg.seq_len * (policy + critic_steps * critic + critic / 3)


def main(argv: list[str]) -> None:
    is_child = "--child" in argv
    argv = [a for a in argv if a != "--child"]
    cfg = parse_cli(argv, {"default": BenchConfig()}, save=False)
    if is_child:
        child(cfg)
        return
    from sao_jax.train import LearnerConfig

    results = {name: run_mode(processes, argv) for name, processes in MODES.items()}
    peak = matmul_flops_per_s(cfg.matmul_size)
    flops = iteration_flops(cfg, LearnerConfig().critic.steps)
    print(
        f"SAO iteration, {cfg.preset} preset, {model_config(cfg).num_layers} layer(s) (vocab "
        f"{cfg.vocab}, {cfg.dispatch}): {cfg.rows} rows "
        f"x {cfg.seq_len} tokens, {flops / 1e9:.0f} model GFLOP; best f32 matmul "
        f"{peak / 1e9:.1f} GFLOP/s; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'mode':26} {'mesh':28} {'compile (s)':>11} {'step (s)':>9} {'MFU':>6}")
    base = None
    for name, result in results.items():
        mfu = flops / result["best_s"] / peak
        base = base or mfu
        mesh = " ".join(f"{k}={v}" for k, v in result["mesh"].items())
        print(
            f"{name:26} {mesh:28} {result['compile_s']:11.1f} {result['best_s']:9.2f} "
            f"{mfu:6.1%}  ({mfu / base:.2f}x)"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
