"""`python -m experiments.compare_runs`: mean +- std over seeds from run directories."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import compare_runs
from sao_jax.metrics import MetricsWriter

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(
    path: Path,
    seed: int,
    *,
    curve: dict[int, float],
    batch: float,
    start: float = 0.5,
    iterations: int = 20,
    summary: bool = True,
    start_row: bool = False,
    seed_in_summary: bool = True,
) -> Path:
    """A run directory as `experiments.alfworld_sao` writes it: 2 critic warm-up iterations,
    `iterations` RL iterations (one policy step each) at rollout success `batch`, greedy
    evaluations of valid_unseen after the policy steps in `curve`, and the end evaluation
    (which repeats the last periodic one; here with another value, which must be ignored)."""
    step = 0
    with MetricsWriter(path, tensorboard=False) as writer:
        writer.write(step, {"warmup": {"success": 0.9}})
        for _ in range(2):  # critic warm-up: a success the RL windows must leave out
            step += 1
            writer.write(step, {"phase": 0.0, "policy_version": 0.0, "batch/success_rate": 1.0})
        if start_row:
            writer.write(step, {"eval": {"valid_unseen": {"success": start}}})
        for version in range(1, iterations + 1):
            step += 1
            writer.write(
                step, {"phase": 1.0, "policy_version": float(version), "batch/success_rate": batch}
            )
            if version in curve:
                writer.write(step, {"eval": {"valid_unseen": {"success": curve[version]}}})
        writer.write(step, {"eval": {"valid_seen": {"success": 0.8}}})
        writer.write(step, {"eval": {"valid_unseen": {"success": 0.01}}})
    (path / "config.yaml").write_text(f"# preset: tiny\nseed: {seed}\nwarm_start:\n  x: 1\n")
    if summary:
        last = curve[max(curve)]
        fields = {
            "unseen_success_start": start,
            "unseen_success_end": last,
            "seen_success_start": 0.7,
            "seen_success_end": 0.7 + (last - start) / 2,
            "policy_steps": iterations,
            **({"seed": seed} if seed_in_summary else {}),
        }
        (path / "summary.json").write_text(json.dumps(fields))
    return path


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Three seeds of a method (`runs/m_s*`) and of a control (`runs/ctl_s*`), in tmp_path."""
    monkeypatch.chdir(tmp_path)
    gains = {0: (5, 0), 1: (10, 2), 2: (15, 4)}  # points at policy steps 10 and 20
    for seed, (at10, at20) in gains.items():
        curve = {10: 0.5 + at10 / 100, 20: 0.5 + at20 / 100}
        make_run(Path(f"runs/m_s{seed}"), seed, curve=curve, batch=0.62 + 0.02 * seed)
    for seed in (2, 0, 1):  # the seed comes from config.yaml: no summary.json yet
        make_run(Path(f"runs/ctl_s{seed}"), seed, curve={20: 0.5}, batch=0.6, summary=False)
    return tmp_path


def test_curve_start_end_and_control_tables(runs, capsys):
    result = compare_runs.main(
        ["groups=[method=runs/m_s*]", "control=runs/ctl_s*", "window=10", "out=out"]
    )
    printed = capsys.readouterr().out
    assert "+10.0 +- 5.0" in printed  # gain at policy step 10
    assert "+2.0 +- 2.0" in printed  # at 20 (the end evaluation's repeat is ignored)
    assert "+4.0 +- 2.0" in printed  # rollout success over the control, each window
    assert "sample standard deviation" in printed

    method = json.loads((runs / "out" / "compare.json").read_text())["groups"]["method"]
    steps = {row["policy_step"]: row for row in method["curve"]["steps"]}
    assert sorted(steps) == [0, 10, 20]
    assert steps[10]["gain"]["mean"] == pytest.approx(10.0)
    assert steps[10]["gain"]["std"] == pytest.approx(5.0)
    assert steps[20]["success"] == pytest.approx({"m_s0": 0.5, "m_s1": 0.52, "m_s2": 0.54})
    assert steps[0]["gain"]["mean"] == 0.0

    unseen = method["start_end"]["splits"]["valid_unseen"]
    assert unseen["gain"]["mean"] == pytest.approx(2.0) and unseen["gain"]["n"] == 3
    assert method["start_end"]["splits"]["valid_seen"]["gain"]["std"] == pytest.approx(1.0)

    control = method["control"]
    assert [w["iterations"] for w in control["windows"]] == [[0, 10], [10, 20]]
    for window in control["windows"]:
        assert window["mean"] == pytest.approx(4.0) and window["std"] == pytest.approx(2.0)
    assert control["runs"]["m_s2"]["control"] == str(Path("runs/ctl_s2"))  # paired by seed
    assert control["runs"]["m_s1"]["differences"] == pytest.approx([4.0, 4.0])
    assert result["groups"]["method"]["control"]["windows"] == control["windows"]

    assert (runs / "out" / "compare.png").read_bytes()[:8] == PNG_MAGIC
    markdown = (runs / "out" / "compare.md").read_text()
    assert "| 10 " in markdown and "+10.0 +- 5.0" in markdown


def test_a_running_run_and_a_group_of_one(runs, capsys):
    # still running: no summary.json; its start evaluation is in metrics.jsonl
    make_run(
        Path("live/l_s0"),
        0,
        curve={10: 0.45},
        batch=0.6,
        start=0.4,
        iterations=10,
        summary=False,
        start_row=True,
    )
    result = compare_runs.main(["groups=[m=runs/m_s*,live=live/l_s*]", "split=valid_unseen"])
    printed = capsys.readouterr().out
    live = result["groups"]["live"]
    assert {row["policy_step"]: row["gain"]["text"] for row in live["curve"]["steps"]} == {
        0: "+0.0",
        10: "+5.0",
    }
    assert live["start_end"]["splits"] == {}
    assert "l_s0: no summary.json yet" in printed
    assert "control" not in live
    assert (runs / "runs" / "compare_runs" / "compare.json").is_file()  # the default out


def test_a_greedy_curve_of_valid_seen_starts_at_seen_success_start(runs):
    result = compare_runs.main(["groups=[m=runs/m_s*]", "split=valid_seen", "out=seen"])
    steps = {row["policy_step"]: row for row in result["groups"]["m"]["curve"]["steps"]}
    assert sorted(steps) == [0, 20]  # the end evaluation alone
    assert steps[20]["gain"]["mean"] == pytest.approx(10.0)  # 0.8 - seen_success_start 0.7


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["groups=[m=runs/none_s*]"], "group m: 'runs/none_s*' matches no directory"),
        (["groups=[m=empty]"], "empty holds no metrics.jsonl"),
        (["groups=[runs/m_s*]"], "groups entry 'runs/m_s*' is not NAME=GLOB"),
        (["groups=[m=runs/m_s*,m=runs/ctl_s*]"], "groups names ['m'] more than one group"),
        (["groups=[m=runs/m_s*]", "window=0"], "window must be >= 1"),
        (["groups=[m=runs/m_s*]", "control=runs/ctl_s[01]"], "has no control run of its seed"),
        (["groups=[m=runs/m_s*]", "control=runs/*_s0"], "share seed 0"),
        (["groups=[m=broken]"], "broken/config.yaml is not a readable config"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(runs, capsys, argv, message):
    (runs / "empty").mkdir()
    (runs / "broken").mkdir()
    (runs / "broken" / "metrics.jsonl").write_text('{"step": 0}\n')
    (runs / "broken" / "config.yaml").write_text("seed: [0\n")
    with pytest.raises(SystemExit) as exit_info:
        compare_runs.main([*argv, "out=out"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ")
    assert not (runs / "out").exists()


def test_the_module_runs_from_the_command_line(runs):
    command = [sys.executable, "-m", "experiments.compare_runs"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run(
        [*command, "groups=[m=runs/m_s*]", "--out", "cli"], env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "+10.0 +- 5.0" in ok.stdout
    assert (runs / "cli" / "compare.png").is_file()
    bad = subprocess.run(
        [*command, "groups=[m=nowhere*]", "--out", "bad"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: group m: 'nowhere*' matches no directory"
    assert not (runs / "bad").exists()


def test_runs_with_the_same_directory_name_keep_their_own_columns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for place, gain in (("a", 5), ("b", 15)):
        make_run(Path(f"{place}/seed0"), 0, curve={10: 0.5 + gain / 100}, batch=0.6)
    result = compare_runs.main(["groups=[m=*/seed0]", "out=out"])
    curve = result["groups"]["m"]["curve"]
    assert set(curve["runs"]) == {"a/seed0", "b/seed0"}  # by path, not the shared name
    step10 = next(row for row in curve["steps"] if row["policy_step"] == 10)
    assert step10["gain"]["n"] == 2 and step10["gain"]["text"] == "+10.0 +- 7.1"
