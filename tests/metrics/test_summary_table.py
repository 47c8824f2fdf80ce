"""summary_table: key/value and multi-row tables, formatting and errors."""

import math

import pytest

from sao_jax.metrics import summary_table


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
