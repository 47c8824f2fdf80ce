"""`python -m experiments.alfworld_seed` end to end on the micro preset: both SEED stages."""

import json

import pytest

from atdp_io import AtdpStore
from experiments import alfworld_seed
from sao_jax.metrics import read_metrics
from sao_jax.pipeline.seed import SeedExperimentConfig
from sao_jax.seed import load_skills

MICRO = [
    "--config",
    "micro",
    "progress=false",
    "tensorboard=false",
    "eval.num_games=2",
    "warm_start.demo_episodes=4",
    "warm_start.dagger_rounds=0",
    "rl.policy_steps=1",
]


@pytest.mark.slow
def test_a_seed_run_does_stage_one_and_opd_and_writes_the_summary(tmp_path):
    summary = alfworld_seed.main([*MICRO, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert (
        saved["algorithm"] == "sao_seed" and saved["policy_steps"] == summary["policy_steps"] == 1
    )
    for key in ("unseen_success_start", "unseen_success_end", "seen_success_end", "wall_seconds"):
        assert saved[key] is not None, key
    assert saved["seed_sft_skills"] == 2 and saved["seed_sft_acting_episodes"] >= 1
    assert (
        saved["seed_analysis_seconds_per_iter"] > 0 and saved["seed_rescore_seconds_per_iter"] > 0
    )
    assert 0 < saved["seed_opd_gate_mean"] < 1
    records = read_metrics(tmp_path)
    assert any("sft/nll" in r for r in records)
    rl = [r for r in records if r.get("phase") == 1.0]
    assert rl and all("policy/opd_loss" in r and "seed/skills" in r for r in rl)
    store = AtdpStore.open(str(tmp_path / "atdp"), create=False)
    stage1 = load_skills(store, tenant="seed_sft")
    assert len(stage1) == 2 and {s.skill.analyzer for s in stage1} == {"rule_alfworld"}
    stage2 = load_skills(store, tenant="skills")
    assert stage2 and {s.skill.analyzer for s in stage2} == {"self_policy"}


def test_bad_seed_overrides_are_named(capsys):
    with pytest.raises(SystemExit):
        alfworld_seed.parse(["--config", "micro", "hindsight.opd_analyzer=oracle"])
    assert "oracle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_seed.parse(["--config", "micro", "learner.algorithm=seed"])
    assert "unknown algorithm 'seed'" in capsys.readouterr().err


def test_compare_algos_gives_seed_algorithms_a_seed_config(tmp_path):
    from experiments import compare_algos

    config = compare_algos.CompareConfig(out_dir=str(tmp_path), preset="micro")
    assert {"sao_seed", "grpo_seed"} <= set(config.algorithms)
    run = compare_algos.run_config(config, "grpo_seed", 1, str(tmp_path / "sao-seed1"))
    assert isinstance(run, SeedExperimentConfig)
    assert (run.learner.algorithm, run.seed) == ("grpo_seed", 1)
    assert run.warm_start.from_run == str(tmp_path / "sao-seed1")
    assert run.hindsight == alfworld_seed.PRESETS["micro"].hindsight
    plain = compare_algos.run_config(config, "sao", 1, None)
    assert not hasattr(plain, "hindsight") and plain.learner.algorithm == "sao"
