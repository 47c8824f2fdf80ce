"""`python -m atdp_io lineage`: derivations of a trajectory and the data of a checkpoint."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import AtdpStore, trained_on
from atdp_io.cli import main
from atdp_io.schema import SourceRef


def derived(trajectory_id, source, tenant):
    trajectory = agent_trajectory(trajectory_id, tenant=tenant)
    header = dataclasses.replace(trajectory.header, derived_from=(source,))
    return dataclasses.replace(trajectory, header=header)


def batch_of(*refs):
    return {
        trained_on.BATCH_KEY: trained_on.encode_refs(refs, len(refs) + 1),
        "traj_index": np.arange(len(refs), dtype=np.int32),
    }


@pytest.fixture
def world(tmp_path):
    """acme a1 -> skills s1; acme a2. Checkpoint 10 trained on a2, 20 (from 10) on s1."""
    store = AtdpStore.open(tmp_path / "store")
    with store.writer("acme") as writer:
        writer.append([agent_trajectory("a1", expires_at=NOW - 1), agent_trajectory("a2")])
    with store.writer("skills") as writer:
        writer.append([derived("s1", SourceRef("acme", "a1"), "skills")])
    ckpt = tmp_path / "ckpt"
    counts = trained_on.TrainedOn()
    counts.add_batch(batch_of("acme/a2"), policy_version=4)
    trained_on.write_step(ckpt, 10, counts)
    counts.saved(str(ckpt / "10"))
    counts.add_batch(batch_of("skills/s1", "acme/a2"), policy_version=8)
    trained_on.write_step(ckpt, 20, counts)
    return store, str(tmp_path / "store"), str(ckpt)


def run_json(capsys, *argv):
    assert main(["lineage", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_a_trajectory_s_derivations_and_the_checkpoints_that_learned_from_it(world, capsys):
    store, root, ckpt = world
    report = run_json(
        capsys, "--store", root, "--tenant", "acme", "--trajectory", "a1", "--checkpoint", ckpt
    )
    assert report == {
        "trajectory": "acme/a1",
        "stored": True,
        "derived_from": [],
        "derived": ["skills/s1"],
        # checkpoint 20 never saw a1, but it trained on a skill written from it
        "checkpoints": {f"{ckpt}/20": ["skills/s1"]},
    }
    report = run_json(
        capsys, "--store", root, "--tenant", "acme", "--trajectory", "a2", "--checkpoint", ckpt
    )
    assert report["checkpoints"] == {f"{ckpt}/10": ["acme/a2"], f"{ckpt}/20": ["acme/a2"]}
    report = run_json(capsys, "--store", root, "--tenant", "skills", "--trajectory", "s1")
    assert report["derived_from"] == ["acme/a1"] and report["checkpoints"] == {}
    assert store.audit_log("acme")[-1]["principal"] == "operator:cli"  # operator reads audited


def test_what_a_checkpoint_trained_on_and_whether_it_is_still_stored(world, capsys):
    store, root, ckpt = world
    report = run_json(capsys, "--checkpoint", ckpt, "--store", root)  # a directory: latest step
    (only,) = report["checkpoints"]
    assert only["checkpoint"] == f"{ckpt}/20"
    assert only["chain"] == [f"{ckpt}/20", f"{ckpt}/10"]
    assert only["trajectories"] == [
        {"trajectory": "acme/a2", "batches": 2, "stored": True},
        {"trajectory": "skills/s1", "batches": 1, "stored": True},
    ]
    assert store.purge_expired("acme", principal="acme", now=NOW) == ["a1"]  # and s1 with it
    report = run_json(capsys, "--checkpoint", f"{ckpt}/20", "--store", root)
    stored = {row["trajectory"]: row["stored"] for row in report["checkpoints"][0]["trajectories"]}
    assert stored == {"acme/a2": True, "skills/s1": False}
    report = run_json(capsys, "--checkpoint", f"{ckpt}/10")  # no store: no "stored" column
    assert report["checkpoints"][0]["trajectories"] == [{"trajectory": "acme/a2", "batches": 1}]


def test_bad_questions_get_clear_errors(world, capsys, tmp_path):
    _, root, ckpt = world
    cases = [
        ([], 2, "needs --trajectory"),
        (["--trajectory", "a1"], 2, "--trajectory needs --store and --tenant"),
        (["--store", str(tmp_path / "none"), "--tenant", "acme", "--trajectory", "a1"], 2, "no ATDP store"),
        (["--store", root, "--tenant", "acme", "--trajectory", "nope"], 1, "no trajectory 'nope'"),
        (["--store", root, "--tenant", "acme", "--trajectory", "a1", "--principal", "globex"], 1, "globex"),
        (["--checkpoint", str(tmp_path)], 1, "no checkpoint step with a trained-on sidecar"),
        (["--checkpoint", f"{ckpt}/30"], 1, "saved without lineage"),
    ]  # fmt: skip
    for argv, code, message in cases:
        assert main(["lineage", *argv]) == code, argv
        assert message in capsys.readouterr().err, argv


def test_the_command_line_as_a_user_runs_it(world):
    _, root, ckpt = world
    command = [sys.executable, "-m", "atdp_io", "lineage", "--store", root, "--tenant", "acme"]
    done = subprocess.run(
        [*command, "--trajectory", "a1", "--checkpoint", ckpt],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "acme/a1: stored" in done.stdout
    assert "  skills/s1" in done.stdout
    assert f"  {ckpt}/20 (through skills/s1)" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "atdp_io", "lineage", "--checkpoint", f"{ckpt}/20"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"{ckpt}/20: 2 trajectories" in done.stdout
    assert f"chain: {ckpt}/20 <- {ckpt}/10" in done.stdout
    assert "skills/s1" in done.stdout
