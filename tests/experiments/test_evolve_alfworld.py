"""The evolution experiment end to end: a micro clone served by the real one-process server on
loopback, two tenants' agents playing ALFWorld through the gateway with the `openai` client,
the control plane's rounds, the planted candidates, the injected regression, the governance
and attribution checks, and the outputs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import evolve_alfworld
from sao_jax.pipeline.evolve_live import tenant_games

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def micro_run(tmp_path_factory):
    from sao_jax.pipeline.evolve import run

    out = tmp_path_factory.mktemp("evolve")
    config = dataclasses.replace(
        evolve_alfworld.micro(), out_dir=str(out), progress=False, tensorboard=False
    )
    return out, config, run(config)


def test_the_summary_has_a_record_per_round_and_tenant(micro_run):
    out, config, summary = micro_run
    spec, tenants = config.evolve, config.evolve.tenants
    for key in ("rounds", "actions", "success_by_round", "rollbacks", "refused_candidates"):
        assert key in summary
    # every round's window, and one more that measures the last round's decision
    assert [(e["round"], e["tenant"]) for e in summary["rounds"]] == [
        (r, t) for r in range(1, spec.rounds + 2) for t in tenants
    ]
    for tenant in tenants:
        assert len(summary["actions"][tenant]) == spec.rounds
        assert len(summary["success_by_round"][tenant]) == spec.rounds + 1
        assert all(0.0 <= s <= 1.0 for s in summary["success_by_round"][tenant])
    for entry in summary["rounds"]:
        assert entry["episodes"] == spec.games_per_round  # every game of the window finished
        if entry["round"] <= spec.rounds and entry["action"] != "rollback":
            assert entry["candidates"][0]["surface"] == "noop"  # the baseline is always there
    for name in ("summary.json", "evolution.png", "metrics.jsonl"):
        assert (out / name).exists(), name
    assert json.loads((out / "summary.json").read_text())["tenants"] == list(tenants)
    assert (out / "live" / "gateway_state" / "composites" / "decisions.jsonl").exists()


def test_planted_candidates_are_gated_and_never_shipped(micro_run):
    _, config, summary = micro_run
    planted = summary["planted_candidates"]
    assert sorted(c["surface"] for c in planted) == ["harness", "policy"]
    assert {(c["round"], c["tenant"]) for c in planted} == {
        (config.evolve.plant_round, config.evolve.tenants[0])
    }
    # a micro clone wins no game, so replay cannot tell them apart: never "pass"
    assert all(c["verdict"] in ("refuse", "inconclusive") for c in planted)
    planted_ids = {c["id"] for c in planted}
    assert not planted_ids & {e["chosen"] for e in summary["rounds"]}
    refused = {c["id"] for c in summary["refused_candidates"]}
    assert summary["planted_refused"] == (planted_ids <= refused)


def test_the_injected_regression_is_served_and_watched_within_its_round(micro_run):
    out, config, summary = micro_run
    spec, first = config.evolve, config.evolve.tenants[0]
    (injected,) = summary["injected_regressions"]
    assert injected["round"] == spec.regression_round and injected["tenant"] == first
    assert injected["surface"] == "policy"  # the planted corrupted policy, past the gate
    entry = next(
        e for e in summary["rounds"] if e["round"] == spec.regression_round and e["tenant"] == first
    )
    assert entry["served_version"] == injected["version"]
    assert entry["watch"] in ("ok", "insufficient", "regressed")
    if entry["watch"] == "regressed":  # rolled back in the same round, before any analysis
        assert entry["rolled_back_to"] is not None and entry["action"] == "rollback"
    # the worker really served the injected weights to that tenant's window, and only there
    played = [
        json.loads(line)
        for line in (out / "agents" / f"{first}-round{spec.regression_round}.jsonl").open()
    ]
    versions = {c["policy_version"] for game in played for c in game["calls"]}
    assert versions and 0 not in versions
    other = spec.tenants[1]
    for path in (out / "agents").glob(f"{other}-round*.jsonl"):
        for line in path.open():
            assert {c["policy_version"] for c in json.loads(line)["calls"]} == {0}


def test_an_update_learned_on_one_tenant_never_reaches_another(micro_run):
    _, config, summary = micro_run
    first, other = config.evolve.tenants[:2]
    cross = summary["cross_tenant"]
    assert cross["checked"] and cross["source_tenant"] == first
    assert cross["target_tenant"] == other
    assert cross["refused"] and "allow_cross_tenant" in cross["error"]
    assert cross["target_unchanged"]
    assert cross["target_version_before"] == cross["target_version_after"]


def test_recorded_games_replay_with_the_prompts_the_agent_played(micro_run):
    out, config, _ = micro_run
    from atdp_io import AtdpStore
    from serving.control.window import WindowSpec, read_window

    tenant = config.evolve.tenants[0]
    (trajectory, *_) = read_window(AtdpStore.open(str(out / "live")), WindowSpec(tenant))
    task = trajectory.header.task
    assert task["prompt_style"] == config.rollout.prompt_style != "paper"  # not the default
    assert task["think"] is config.rollout.think and task["layout"] == "windowed"


def test_every_recorded_call_names_its_composite_and_the_weights_it_names(micro_run):
    _, config, summary = micro_run
    for tenant in config.evolve.tenants:
        checks = summary["attribution"][tenant]
        assert checks["calls"] > 0
        assert checks["unattributed_calls"] == 0
        assert checks["calls_not_by_their_policy"] == 0  # a PolicyRef switches the weights
        assert checks["calls_by_other_tenants_policy"] == 0


def test_tenants_get_disjoint_game_lists():
    games = tenant_games(3, 5, 40, seed=1)
    assert [len(g) for g in games] == [5, 5, 5]
    assert len({g for pool in games for g in pool}) == 15
    assert games == tenant_games(3, 5, 40, seed=1)
    with pytest.raises(ValueError, match="do not fit"):
        tenant_games(3, 20, 40, seed=1)


def test_a_from_run_without_a_clone_is_refused_by_name(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    with pytest.raises(SystemExit) as stopped:
        evolve_alfworld.parse(["--out", str(tmp_path / "run"), f"warm_start.from_run={missing}"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "warm_start.from_run" in error and "warm_start/" in error


def test_a_from_run_url_is_left_to_the_restore(tmp_path):
    """A remote run (`gs://...`) cannot be listed at parse time: it is not refused as missing."""
    config = evolve_alfworld.parse(
        ["--out", str(tmp_path / "run"), "warm_start.from_run=gs://bucket/runs/clone"]
    )
    assert config.warm_start.from_run == "gs://bucket/runs/clone"


def test_a_single_tenant_and_a_negative_warm_up_are_refused():
    with pytest.raises(ValueError, match="two or more tenants"):
        dataclasses.replace(evolve_alfworld.micro().evolve, tenants=("acme",))
    with pytest.raises(ValueError, match="policy_critic_warmup must be >= 0"):
        dataclasses.replace(evolve_alfworld.micro().evolve, policy_critic_warmup=-1)


@pytest.mark.slow
def test_the_command_line_runs_the_micro_preset(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "experiments.evolve_alfworld", "--config", "micro",
               "--out", str(out), "progress=false", "tensorboard=false"]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "live success" in done.stdout and "surfaces_chosen" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cross_tenant"]["refused"]
    assert (out / "evolution.png").stat().st_size > 0 and (out / "config.yaml").exists()
