"""The launcher's start command is the experiment's command line: parsed into the right config
(so the two cannot drift), run here on a mesh of the 8 fake CPU devices, and run as a
2-process job (each process standing in for a host of the pod)."""

import json
import shlex
import sys
from pathlib import Path

import pytest

from atdp_io import AtdpStore
from experiments import alfworld_sao, launch_tpu
from sao_jax.checkpoint import Checkpointer
from sao_jax.distributed import DcnMeshConfig
from sao_jax.distributed.local_launch import launch_local
from sao_jax.metrics import read_metrics
from sao_jax.models import get_model_config
from sao_jax.pipeline import setup as pipeline_setup
from sao_jax.sharding import MeshConfig

REPO = Path(__file__).parents[2]

LAUNCH = ["--topology", "v5p-64", "--tpu", "pod", "--bucket", "gs://b/run"]


def experiment_argv(launch_argv, capsys, out) -> list[str]:
    """The arguments after `python -m experiments.alfworld_sao` in the printed start command,
    with `--out` pointed at `out`."""
    assert launch_tpu.main([*LAUNCH, *launch_argv]) == 0
    start = shlex.split(capsys.readouterr().out.splitlines()[-1])
    words = shlex.split(start[start.index("--command") + 1])
    assert words[words.index("-m") + 1] == "experiments.alfworld_sao"
    argv = words[words.index("-m") + 2 :]
    argv[argv.index("--out") + 1] = str(out)
    return argv


def test_the_launchers_start_command_parses_into_the_experiment_config(tmp_path, capsys):
    argv = experiment_argv(["--config", "small", "rl.rows=256"], capsys, tmp_path)
    config = alfworld_sao.parse(argv)
    assert config.model.preset == "small" and config.rl.rows == 256
    assert config.atdp_path == "gs://b/run/atdp"
    assert config.checkpoint_dir == "gs://b/run/checkpoints"
    # v5p preset for the small model's experts: expert 8 in a slice, fsdp the rest, data across
    assert config.mesh.ici == MeshConfig(data=1, fsdp=-1, expert=8, tensor=1)
    assert config.mesh.dcn == DcnMeshConfig(data=-1, fsdp=1, expert=1, tensor=1)
    assert config.mesh.hybrid().resolve(32, 1) == {"data": 1, "fsdp": 4, "expert": 8, "tensor": 1}
    assert (tmp_path / "config.yaml").is_file()


def test_the_launchers_remat_reaches_the_jobs_model(tmp_path, capsys):
    argv = experiment_argv(["--config", "small", "--remat", "full"], capsys, tmp_path)
    config = alfworld_sao.parse(argv)
    assert config.model.remat == "full"
    model = get_model_config(config.model.preset, **config.model.overrides())
    assert model.remat == "full" and not model.scan_layers


def test_bad_multi_process_flags_exit_2_naming_what_is_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        alfworld_sao.main(["--out", str(tmp_path), "--num_processes", "2"])
    assert exit_info.value.code == 2
    assert "num_processes=2 also needs ['coordinator_address', 'process_id']" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_the_start_command_runs_micro_on_a_mesh_of_fake_devices(tmp_path, capsys):
    shared = tmp_path / "bucket"  # stands in for gs://: later overrides win
    overrides = [
        "progress=false",
        "tensorboard=false",
        "eval.num_games=2",
        "warm_start.demo_episodes=4",
        f"atdp_path={shared / 'atdp'}",
        f"checkpoint_dir={shared / 'checkpoints'}",
    ]
    launch = ["--config", "micro", "--ici", "data=2,fsdp=-1,expert=2", *overrides]
    argv = experiment_argv(launch, capsys, tmp_path / "out")
    summary = alfworld_sao.main(argv)
    assert summary["policy_steps"] == 2
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text())["policy_steps"] == 2
    assert (out / "learning_curve.png").is_file() and (out / "metrics.jsonl").is_file()
    assert (shared / "atdp" / "tenants" / "rollouts").is_dir() and not (out / "atdp").exists()
    assert any(p.name.isdigit() for p in (shared / "checkpoints").iterdir())
    assert not (out / "checkpoints").exists()
    # the samplers ran on the mesh the command asked for: fsdp=-1 filled the 8 devices
    meshes = {key[2] for key in pipeline_setup._SAMPLERS}
    shapes = [dict(mesh.shape) for mesh in meshes if mesh is not None]
    assert {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1} in shapes


def tenant_sizes(store_path) -> dict[str, int]:
    store = AtdpStore.open(str(store_path))
    sizes = {}
    for tenant in store.tenants():
        reader = store.reader(tenant, principal=tenant)
        reader.refresh()
        sizes[tenant] = len(list(reader.trajectory_ids()))
    return sizes


def stream_progress(meta: dict) -> list[tuple[int, int]]:
    """Per process, how far its RL stream got: (the cursor of the read its position is in,
    items of that read consumed) -- a checkpoint stores a position as the stream's state
    before the current read plus a skip count, so the cursor alone can stay 0."""
    return [
        (next(iter(p["parent"]["cursors"].values())), p["skip"]) for p in meta["data"]["by_process"]
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)  # two launches, each with its own 420 s limit
def test_the_start_command_runs_in_two_processes_and_resumes(tmp_path, capsys):
    """The launcher's command on 2 local processes x 2 fake devices (each process a host):
    every phase runs, each process plays into its own ATDP partitions, the learner's batches
    hold both processes' rows, evaluation covers every game once, and the run resumes."""
    shared = tmp_path / "bucket"  # stands in for gs://
    overrides = [
        "progress=false",
        "tensorboard=false",
        "eval.num_games=3",  # not a multiple of 2: one process plays 2 games, the other 1
        f"atdp_path={shared / 'atdp'}",
        f"checkpoint_dir={shared / 'checkpoints'}",
    ]
    argv = experiment_argv(
        ["--config", "micro", "--ici", "fsdp=-1,expert=2", *overrides], capsys, tmp_path / "out"
    )
    command = [sys.executable, "-m", "experiments.alfworld_sao", *argv]
    job = dict(devices_per_process=2, timeout_s=420, cwd=REPO)
    result = launch_local(command, 2, logs=tmp_path / "logs", **job)
    assert result.ok, result.describe()

    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_steps"] == 2 and summary["skipped_policy_steps"] == 0
    sizes = tenant_sizes(shared / "atdp")
    for name in ("demos", "dagger", "warmup", "rollouts"):
        assert sizes[f"{name}-p0"] > 0 and sizes[f"{name}-p1"] > 0, sizes
    # expert demos split over the processes (micro: 8), plus one relabelled DAgger episode each
    assert sizes["demos-p0"] + sizes["demos-p1"] - sizes["dagger-p0"] - sizes["dagger-p1"] == 8
    records = read_metrics(out)
    assert len({r["step"] for r in records if "policy/loss" in r}) == len(
        [r for r in records if "policy/loss" in r]
    )  # process 0 alone wrote metrics
    rl = [r for r in records if r.get("phase") == 1.0]
    # asynchronous: a process whose stream went idle brings an empty batch
    assert len(rl) == 2 and all(r["batch/processes_with_rows"] in (1, 2) for r in rl)
    # the loaders' counts, summed over the processes: at least what the batches held
    assert rl[-1]["loader/trajectories_read"] >= sum(r["batch/trajectories"] for r in rl)
    with Checkpointer(shared / "checkpoints", create=False) as saved:
        meta = saved.metadata()
    for tag in ("start", "end"):
        for split in ("valid_seen", "valid_unseen"):
            assert meta["evals"][tag][split]["episodes"] == 3  # every game once, over both
    assert meta["rollout_stats"]["episodes"] >= 4  # both engines counted (2 per version)
    positions = [p["parent"]["cursors"] for p in meta["data"]["by_process"]]
    assert [sorted(p) for p in positions] == [["rollouts-p0"], ["rollouts-p1"]]
    # asynchronous: on a loaded machine one process's stream can stay idle for both steps
    # (its batches empty), so only one is sure to have moved; the synchronous part reads both
    assert any(progress > (0, 0) for progress in stream_progress(meta))
    assert (out / "learning_curve.png").is_file()
    logs = [path.read_text() for path in result.logs]  # the summary table: process 0 only
    assert "unseen_success_start" in logs[0] and "unseen_success_start" not in logs[1]

    # resumed with the synchronous schedule: each process plays its 1 episode of the round
    # before anyone reads, so the iteration holds rows of both (plus leftovers of the first part)
    more = ["--resume", "rl.policy_steps=3", "rl.asynchronous=false"]
    resumed = launch_local([*command, *more], 2, logs=tmp_path / "logs2", **job)
    assert resumed.ok, resumed.describe()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy_steps"] == 3 and not summary["asynchronous"]
    last = [r for r in read_metrics(out) if r.get("phase") == 1.0][-1]
    assert last["batch/processes_with_rows"] == 2 and last["batch/trajectories"] >= 2
    with Checkpointer(shared / "checkpoints", create=False) as saved:
        later_meta = saved.metadata()
    later = [p["parent"]["cursors"] for p in later_meta["data"]["by_process"]]
    assert [p.keys() for p in later] == [p.keys() for p in positions]  # each kept its stream
    for before, after in zip(stream_progress(meta), stream_progress(later_meta), strict=True):
        assert after >= before and after > (0, 0)  # ... continued it, and the sync round read
