"""sao_jax.metrics.seeds: mean +- sample std, its text, and the per-run series behind it."""

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sao_jax.metrics.seeds import (
    eval_curve,
    format_mean_std,
    gains,
    mean_std,
    rl_iterations,
    windowed_differences,
)

FRACTIONS = st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=12)


@given(FRACTIONS)
def test_mean_std_is_the_mean_and_sample_std(values):
    mean, std = mean_std(values)
    assert mean == pytest.approx(statistics.mean(values), rel=1e-9, abs=1e-9)
    assert std == pytest.approx(statistics.stdev(values), rel=1e-9, abs=1e-9)


@given(FRACTIONS)
def test_format_mean_std_prints_mean_and_sample_std_in_points(values):
    mean, std = statistics.mean(values), statistics.stdev(values)
    text = format_mean_std(values)
    shown_mean, separator, shown_std = text.split(" ")
    assert separator == "+-"
    assert shown_mean[0] in "+-"
    assert float(shown_mean) == pytest.approx(100 * mean, abs=0.05 + 1e-9 * abs(100 * mean))
    assert float(shown_std) == pytest.approx(100 * std, abs=0.05 + 1e-9 * 100 * std)


def test_format_mean_std_examples():
    assert format_mean_std([0.05, 0.06, 0.04]) == "+5.0 +- 1.0"
    assert format_mean_std([-0.01, -0.03]) == "-2.0 +- 1.4"
    assert format_mean_std([0.055]) == "+5.5"  # one run: its value, no std
    assert format_mean_std([-0.0001, 0.0]) == "+0.0 +- 0.0"  # never "-0.0"
    # compare_algos' cells: fractions, 3 decimals, ±
    assert format_mean_std([0.1, 0.2], scale=1.0, signed=False, digits=3, pm="±") == (
        "0.150 ± 0.071"
    )
    assert format_mean_std([0.1, 0.2], scale=1.0, digits=3, pm="±") == "+0.150 ± 0.071"


def test_one_value_has_no_std_and_no_value_is_an_error():
    mean, std = mean_std([0.25])
    assert mean == 0.25 and math.isnan(std)
    with pytest.raises(ValueError, match="at least one value"):
        mean_std([])
    with pytest.raises(ValueError, match="at least one value"):
        format_mean_std(iter(()))
    with pytest.raises(ValueError, match="digits"):
        format_mean_std([0.1], digits=-1)


def rl_row(step, version, success, phase=1.0):
    return {
        "step": step,
        "phase": phase,
        "policy_version": float(version),
        "batch/success_rate": success,
    }


def test_eval_curve_steps_from_the_latest_policy_version_first_value_kept():
    records = [
        {"step": 0, "warmup/success": 0.7},
        rl_row(1, 0, 0.9, phase=0.0),  # critic warm-up: still policy step 0
        {"step": 1, "eval/valid_unseen/success": 0.40},  # the start evaluation
        rl_row(2, 1, 0.5),
        rl_row(3, 2, 0.5),
        {"step": 3, "eval/valid_unseen/success": 0.45},
        rl_row(4, 3, 0.5),
        rl_row(5, 4, 0.5),
        {"step": 5, "eval/valid_unseen/success": 0.50},
        # the end of the run: both splits again at the last policy step
        {"step": 5, "eval/valid_seen/success": 0.70},
        {"step": 5, "eval/valid_unseen/success": 0.99},
    ]
    assert eval_curve(records, "valid_unseen") == {0: 0.40, 2: 0.45, 4: 0.50}
    assert eval_curve(records, "valid_seen") == {4: 0.70}
    assert eval_curve(records, "test") == {}
    assert eval_curve(records[3:], "valid_unseen") == {2: 0.45, 4: 0.50}  # no start row


def test_gains_start_at_step_zero_whatever_the_curve_holds():
    assert gains({0: 0.9, 10: 0.6, 20: 0.4}, 0.5) == pytest.approx({0: 0.0, 10: 0.1, 20: -0.1})


def test_windowed_differences_pair_rl_iterations_in_complete_windows():
    warmup = [rl_row(i, 0, 1.0, phase=0.0) for i in range(3)]  # left out
    run = warmup + [rl_row(3 + i, i + 1, 0.5 if i < 4 else 0.8) for i in range(10)]
    control = [rl_row(i, i + 1, 0.4) for i in range(9)]
    assert rl_iterations(run) == [0.5] * 4 + [0.8] * 6
    # 9 iterations both have: two complete windows of 4, the 9th is left out
    assert windowed_differences(run, control, 4) == pytest.approx([0.1, 0.4])
    assert windowed_differences(run, control, 9) == pytest.approx([(2.0 + 4.0) / 9 - 0.4])
    assert windowed_differences(run, control, 10) == []
    assert windowed_differences(run, [], 1) == []


@pytest.mark.parametrize("window", [0, -5, 2.5, True])
def test_windowed_differences_refuse_a_bad_window(window):
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        windowed_differences([], [], window)
