"""`python -m experiments.arithmetic_sao`: the second env through the same job and command line."""

import json

import pytest

from experiments import arithmetic_sao
from sao_jax.metrics import read_metrics

MICRO = ["--config", "micro", "progress=false", "tensorboard=false"]


def test_an_unknown_env_or_split_exits_2_naming_it(tmp_path, capsys):
    cases = {
        "env.name=nope": "unknown env 'nope'",
        "env.split=test": "unknown split 'test' of 'arithmetic'",
        "eval.splits=[valid_unseen,nope]": "eval.splits must name splits of the env 'arithmetic'",
    }
    for override, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            arithmetic_sao.main([*MICRO, "--out", str(tmp_path), override])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, override


@pytest.mark.slow
def test_a_micro_run_clones_trains_evaluates_and_writes_the_outputs(tmp_path):
    summary = arithmetic_sao.main([*MICRO, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["policy_steps"] == summary["policy_steps"] == 2
    assert saved["unseen_success_end"] is not None and saved["seen_success_start"] is not None
    records = read_metrics(tmp_path)
    assert any(r.get("dagger/relabelled_turns", 0) > 0 for r in records)  # DAgger replayed it
    assert any("policy/clip_frac" in r for r in records)
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "learning_curve.png").is_file()
    assert any(p.name.isdigit() for p in (tmp_path / "checkpoints").iterdir())
