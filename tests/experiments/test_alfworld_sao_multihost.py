"""The launcher's start command is the experiment's command line: parsed into the right config
(so the two cannot drift), and run here on a mesh of the 8 fake CPU devices."""

import json
import shlex

import pytest

from experiments import alfworld_run, alfworld_sao, launch_tpu
from sao_jax.distributed import DcnMeshConfig, Job, ProcessInfo
from sao_jax.sharding import MeshConfig

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
    meshes = {key[2] for key in alfworld_run._SAMPLERS}
    shapes = [dict(mesh.shape) for mesh in meshes if mesh is not None]
    assert {"data": 2, "fsdp": 2, "expert": 2, "tensor": 1} in shapes


def test_a_multi_process_job_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    info = ProcessInfo(1, 2, 4, 8, "cpu", "explicit")
    monkeypatch.setattr(alfworld_run, "setup_job", lambda spec, distributed=None: Job(info, None))
    config = alfworld_sao.parse(["--config", "micro", "--out", str(tmp_path / "out")])
    with pytest.raises(NotImplementedError, match=r"joined 2 processes.*docs/scaling\.md"):
        alfworld_run.run(config)
    assert not (tmp_path / "out" / "atdp").exists()
