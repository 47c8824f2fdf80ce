"""summary_table: key/value and multi-row tables, formatting and errors."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.metrics import save_summary, summary_table


def test_single_mapping_is_metric_value_table():
    text = summary_table({"unseen_success_end": 0.71234, "policy_steps": 300, "algo": "sao"})
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "value"]
    assert any(line.split() == ["unseen_success_end", "0.7123"] for line in lines)
    assert any(line.split() == ["policy_steps", "300"] for line in lines)


def test_rows_with_union_of_columns():
    rows = [
        {"algo": "sao", "success": 0.8, "clip_frac": 0.01},
        {"algo": "grpo", "success": math.nan},
        {"algo": "ppo", "success": 0.5, "entropy": 1.25},
    ]
    lines = summary_table(rows).splitlines()
    assert lines[0].split() == ["algo", "success", "clip_frac", "entropy"]
    assert lines[2].split() == ["sao", "0.8", "0.01"]
    assert lines[3].split() == ["grpo", "nan"]
    assert lines[4].split() == ["ppo", "0.5", "1.25"]


def test_errors():
    with pytest.raises(ValueError, match="at least one row"):
        summary_table([])
    with pytest.raises(ValueError, match="at least one metric"):
        summary_table({})
    with pytest.raises(TypeError, match="row 1 is list"):
        summary_table([{"a": 1}, [1, 2]])


def test_save_summary_json(tmp_path):
    path = save_summary(
        tmp_path / "run",
        {
            "unseen_success_start": jnp.float32(0.125),
            "unseen_success_end": 0.5,
            "policy_steps": np.int64(300),
            "final_kl": math.inf,
            "per_task": {"pick": 0.75, "heat": math.nan},
            "seeds": [0, 1],
        },
    )
    assert path == tmp_path / "run" / "summary.json"
    assert json.loads(path.read_text()) == {
        "unseen_success_start": 0.125,
        "unseen_success_end": 0.5,
        "policy_steps": 300,
        "final_kl": "inf",
        "per_task": {"pick": 0.75, "heat": "nan"},
        "seeds": [0, 1],
    }
    with pytest.raises(ValueError, match="metric 'curve' must be"):
        save_summary(tmp_path, {"curve": np.ones(3)})


def test_save_summary_on_process_zero_only(tmp_path, monkeypatch):
    monkeypatch.setattr("jax.process_index", lambda: 2)
    assert save_summary(tmp_path / "run", {"success": 0.5}) is None
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="metric 'curve' must be"):  # validated everywhere
        save_summary(tmp_path / "run", {"curve": np.ones(3)})
    monkeypatch.setattr("jax.process_index", lambda: 0)
    path = save_summary(tmp_path / "run", {"success": 0.5})
    assert json.loads(path.read_text()) == {"success": 0.5}


def test_numparse_off_keeps_signed_and_padded_strings_as_written():
    rows = [{"algo": "sao", "gain": "+0.017", "end": "0.150", "steps": 3.0}]
    parsed = summary_table(rows, floatfmt=".3g").splitlines()[2].split()
    assert parsed[1:3] == ["0.017", "0.15"]  # tabulate reads the strings as numbers
    kept = summary_table(rows, floatfmt=".3g", numparse=False).splitlines()[2].split()
    assert kept == ["sao", "+0.017", "0.150", "3"]
    single = summary_table({"gain": "+1.5"}, numparse=False).splitlines()[2].split()
    assert single == ["gain", "+1.5"]
