"""The TPU launcher: commands per slice, --run through an injected runner (gcloud is never
executed here), bad input, and the memory dry-run of qwen3-30b-a3b on a v5p-64 slice."""

import shlex

import pytest

from experiments.launch_tpu import main

BASE = ["--topology", "v5p-64", "--tpu", "pod", "--zone", "z1", "--bucket", "gs://b/run"]


def commands(capsys) -> list[list[str]]:
    out = capsys.readouterr().out
    return [shlex.split(line) for line in out.splitlines() if line.startswith("gcloud")]


def test_one_slice_every_host_runs_the_experiment(capsys):
    assert main([*BASE, "--config", "small", "rl.rows=256"]) == 0
    create, install, start = commands(capsys)
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "pod"]
    assert create[create.index("--accelerator-type") + 1] == "v5p-64"
    assert install[3:6] == ["tpu-vm", "ssh", "pod"] and "--worker=all" in install
    assert start[3:6] == ["tpu-vm", "ssh", "pod"] and "--worker=all" in start
    run = shlex.split(start[start.index("--command") + 1])
    assert run[run.index("-m") + 1] == "experiments.alfworld_sao"
    assert {"atdp_path=gs://b/run/atdp", "checkpoint_dir=gs://b/run/checkpoints"} <= set(run)
    # the v5p preset for 16 experts: expert 8 within the slice, fsdp the rest, data over slices
    assert {"mesh.ici.fsdp=-1", "mesh.ici.expert=8", "mesh.dcn.data=-1"} <= set(run)
    assert run[-1] == "rl.rows=256"


def test_multi_slice_starts_every_slice_together(capsys):
    calls = []
    code = main(
        [*BASE, "--slices", "2", "--ici", "expert=4", "--run"],
        runner=lambda group: calls.append(group) or 0,
    )
    assert code == 0
    create, *rest = commands(capsys)
    assert create[3:6] == ["queued-resources", "create", "pod"]
    assert create[create.index("--node-count") + 1] == "2"
    assert [c[5] for c in rest] == ["pod-0", "pod-1", "pod-0", "pod-1"]  # install, start
    assert len(calls) == 2 and all(len(group) == 2 for group in calls)  # no create without --create
    assert "mesh.ici.expert=4" in shlex.split(calls[1][0][-1])
    calls.clear()
    assert main([*BASE, "--run", "--create"], runner=lambda g: calls.append(g) or 3) == 3
    assert len(calls) == 1  # stops at the first failing step
    assert "create the slice(s) (once) exited with status 3" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bucket", "/local/dir"], "--bucket must be a gs:// path"),
        (["--ici", "experts=4"], "unknown mesh axis 'experts'"),
        (["--ici", "expert=x"], "mesh axis expert needs an integer size"),
        (["--ici", "expert=3"], "ici mesh over 32 devices per slice"),
        (["--topology", "v5p-63"], "not a whole number of chips"),
    ],
)
def test_bad_input_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*BASE, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_dry_run_of_qwen3_30b_on_v5p_64_fits_and_a_larger_batch_is_refused(capsys):
    model = ["--model", "qwen3-30b-a3b", "--dry-run"]
    assert main([*BASE, *model]) == 0
    out = capsys.readouterr().out
    assert "32 chips on 8 hosts" in out and "30.53 B parameters" in out
    assert "mesh data=1 fsdp=4 expert=8 tensor=1" in out
    for term in ("policy params", "optimizer state", "KV cache", "activations", "remat=none"):
        assert term in out
    assert out.rstrip().endswith("fits")
    assert main([*BASE, *model, "--train-rows", "256", "--seq-len", "4096"]) == 1
    err = capsys.readouterr().err
    assert "refused: train + rollout (colocated): needs" in err
    assert "largest term: activations" in err
    # disaggregated: 2 of each host's 4 chips sample; training needs remat there
    assert main([*BASE, *model, "--rollout-chips", "2", "--remat", "full"]) == 0
    out = capsys.readouterr().out
    assert "train (mesh data=1 fsdp=2 expert=8 tensor=1)" in out
    assert "rollout (mesh data=8 fsdp=1 expert=1 tensor=2)" in out
