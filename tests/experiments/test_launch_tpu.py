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
    ("topology", "slices", "hosts", "mesh"),
    [
        ("v4-32", 1, 4, "data=1 fsdp=4 expert=4 tensor=1"),  # 16 chips (2 cores each)
        ("v5litepod-16", 1, 4, "data=1 fsdp=4 expert=4 tensor=1"),
        ("v6e-8", 2, 2, "data=2 fsdp=2 expert=4 tensor=1"),  # one 8-chip host per slice
        ("v5p-128", 2, 32, "data=2 fsdp=8 expert=8 tensor=1"),
    ],
)
def test_mesh_preset_per_topology_fills_each_slice(topology, slices, hosts, mesh, capsys):
    argv = ["--topology", topology, "--slices", str(slices), "--tpu", "pod", "--bucket", "gs://b"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"{hosts} hosts; mesh {mesh}" in out.splitlines()[0]
    start = [shlex.split(line) for line in out.splitlines()[-slices:]]
    assert [c[5] for c in start] == (["pod"] if slices == 1 else [f"pod-{i}" for i in range(2)])
    for command in start:
        run = shlex.split(command[command.index("--command") + 1])
        # the hosts resolve the rest themselves: fsdp fills each slice, data spans the slices
        assert {"mesh.ici.fsdp=-1", "mesh.dcn.data=-1", "mesh.dcn.fsdp=1"} <= set(run)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bucket", "/local/dir"], "--bucket must be a gs:// path"),
        (["--ici", "experts=4"], "unknown mesh axis 'experts'"),
        (["--ici", "expert=x"], "mesh axis expert needs an integer size"),
        (["--ici", "expert=3"], "ici mesh over 32 devices per slice"),
        (["--topology", "v5p-63"], "not a whole number of chips"),
        (["--slices", "0"], "num_slices must be >= 1"),
        (["--dcn", "data=3", "--slices", "2"], "dcn mesh over 2 slice(s)"),
        (
            ["--dry-run", "--model", "qwen3-30b-a3b", "--rollout-chips", "4"],
            "--rollout-chips must leave training chips on each 4-chip host",
        ),
    ],
)
def test_bad_input_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*BASE, *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def per_device_gib(table: str) -> dict[str, float]:
    """{term: GiB} from the rows of a dry-run table ("  optimizer state  24.59 GiB  ...")."""
    rows = {}
    for line in table.splitlines():
        name, _, rest = line.strip().partition("  ")
        words = rest.split()
        if line.startswith("  ") and len(words) >= 2 and words[1] == "GiB":
            rows[name] = float(words[0])
    return rows


def test_dry_run_of_qwen3_30b_on_v5p_64_fits_and_a_larger_batch_is_refused(capsys):
    model = ["--model", "qwen3-30b-a3b", "--dry-run"]
    assert main([*BASE, *model, "--train-rows", "32"]) == 0
    out = capsys.readouterr().out
    assert "32 chips on 8 hosts" in out and "30.53 B parameters" in out
    assert "mesh data=1 fsdp=4 expert=8 tensor=1" in out
    for term in ("policy params", "optimizer state", "KV cache", "activations", "remat=none"):
        assert term in out
    assert out.rstrip().endswith("fits")
    gib = per_device_gib(out)
    total = 30.53e9 * 2 / 2**30  # bfloat16 parameters of the whole model
    # per device: sharded over fsdp (4) everywhere, experts over expert (8) too
    assert total / 32 <= gib["policy params"] <= total / 4
    # each host samples on its own 4 chips (one engine per process): a whole copy per host
    assert "sampling on each host's chips" in out and "whole on each host" in out
    assert abs(gib["rollout params"] - total / 4) < 0.5
    # AdamW's f32 moments + f32 master per trainable bf16 parameter: 6x the policy's bytes
    assert gib["optimizer state"] >= 6 * gib["policy params"] - 0.01
    assert abs(gib["total"] - sum(v for k, v in gib.items() if k != "total")) < 0.05
    # the default 64 rows: the per-host rollout copy leaves too little for the activations
    assert main([*BASE, *model]) == 1
    err = capsys.readouterr().err
    assert "refused: train + rollout (colocated, sampling on each host's chips): needs" in err
    assert "largest term: activations" in err
    # disaggregated: 2 of each host's 4 chips sample; training needs remat there
    assert main([*BASE, *model, "--rollout-chips", "2", "--remat", "full"]) == 0
    out = capsys.readouterr().out
    assert "train (mesh data=1 fsdp=2 expert=8 tensor=1)" in out
    assert "rollout (mesh data=8 fsdp=1 expert=1 tensor=2)" in out


def test_dry_run_plans_the_critic_only_for_algorithms_that_train_one(capsys):
    """`learner.algorithm=grpo` drops the value model, its optimizer state and its activations
    from the plan; ppo and sao keep them; a mistyped override exits 2 before any plan."""
    small = ["--topology", "v5p-8", "--tpu", "pod", "--bucket", "gs://b", "--dry-run"]
    small += ["--train-rows", "4", "--seq-len", "256"]
    plans = {}
    for algorithm in ("sao", "ppo", "grpo"):
        assert main([*small, f"learner.algorithm={algorithm}"]) == 0
        out = capsys.readouterr().out
        plans[algorithm] = (out, per_device_gib(out))
    for algorithm in ("sao", "ppo"):
        out, gib = plans[algorithm]
        assert f"learner.algorithm={algorithm}: policy + critic" in out
        assert "critic params" in gib and "trainable (policy + critic)" in out
        assert "policy or critic step, one at a time" in out
    out, gib = plans["grpo"]
    assert "learner.algorithm=grpo: policy only: no critic" in out
    assert "critic params" not in gib and "(policy + critic)" not in out
    assert "policy step (no critic)" in out
    sao = plans["sao"][1]
    # the critic's params and its trainable leaves' moments are all that differ (the policy's
    # step keeps more activations than the critic's at these sizes)
    assert gib["optimizer state"] < sao["optimizer state"]
    critic = sao["critic params"] + sao["optimizer state"] - gib["optimizer state"]
    assert abs(gib["total"] - (sao["total"] - critic)) < 0.03  # tables round to 0.01 GiB
    assert gib["total"] < sao["total"] and gib["policy params"] == sao["policy params"]
    # without the override the experiment preset's own algorithm (SAO) is planned
    assert main(small) == 0
    assert "learner.algorithm=sao: policy + critic" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([*small, "learner.algorthm=grpo"])
    assert exit_info.value.code == 2
    assert "Did you mean 'learner.algorithm'?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*small, "learner.algorithm=dqn"])
    assert "unknown algorithm 'dqn'" in capsys.readouterr().err


def test_the_launcher_reads_its_line_in_the_one_convention(capsys):
    """`--key VALUE`, `--key=VALUE` and `key=VALUE` set the launcher's fields alike, `--no-x`
    turns a switch off, and the other `key=value` items go to the experiment untouched."""
    spelled = ["topology=v5p-64", "--tpu=pod", "zone=z1", "--bucket", "gs://b/run"]
    assert main([*spelled, "--no-run", "rl.rows=256", "learner.dis.eps_low=0.2"]) == 0
    *_, start = commands(capsys)
    assert main([*BASE, "rl.rows=256", "learner.dis.eps_low=0.2"]) == 0
    *_, same = commands(capsys)
    assert start == same
    run = shlex.split(start[start.index("--command") + 1])
    assert run[-2:] == ["rl.rows=256", "learner.dis.eps_low=0.2"]
    with pytest.raises(SystemExit) as exit_info:
        main([*BASE, "--tpus", "pod"])  # a misspelt option is not an experiment override
    assert exit_info.value.code == 2
    assert "unknown option '--tpus'" in capsys.readouterr().err
