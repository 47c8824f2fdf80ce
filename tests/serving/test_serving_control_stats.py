"""The intervals the control plane decides with, against published values, and the verdicts
read from them."""

from __future__ import annotations

import math

import pytest

from serving.control.evidence import judge
from serving.control.stats import Estimate, bootstrap_mean, rate_difference, wilson


def test_wilson_matches_published_intervals():
    # Newcombe (1998), table I: 81/263 -> [0.2553, 0.3662]; 0/10 -> [0, 0.2775]
    e = wilson(81, 263)
    assert (round(e.low, 4), round(e.high, 4)) == (0.2553, 0.3662)
    zero = wilson(0, 10)
    assert zero.low == 0.0 and round(zero.high, 4) == 0.2775
    assert wilson(10, 10).high == 1.0 and wilson(0, 0) == Estimate(0.0, 0.0, 1.0, 0)
    narrower = wilson(810, 2630)
    assert narrower.high - narrower.low < e.high - e.low
    with pytest.raises(ValueError, match="successes <= n"):
        wilson(3, 2)
    with pytest.raises(ValueError, match="confidence"):
        wilson(1, 2, confidence=1.0)


def test_rate_difference_is_newcombes_hybrid_score_interval():
    # Newcombe (1998), table II, example (a): 56/70 - 48/80 = 0.2, [0.0524, 0.3339]
    d = rate_difference(wilson(56, 70), wilson(48, 80))
    assert math.isclose(d.value, 0.2)
    assert (round(d.low, 4), round(d.high, 4)) == (0.0524, 0.3339)
    assert rate_difference(wilson(1, 2), wilson(0, 0)) == Estimate(0.5, -1.0, 1.0, 0)


def test_bootstrap_is_reproducible_and_covers_the_mean():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    a, b = bootstrap_mean(values, seed=3), bootstrap_mean(values, seed=3)
    assert a == b and a.low <= a.value == 0.625 <= a.high and a.n == 8
    assert bootstrap_mean([1.0] * 5) == Estimate(1.0, 1.0, 1.0, 5)
    assert bootstrap_mean([]).n == 0 and bootstrap_mean([]).high == math.inf
    with pytest.raises(ValueError, match="finite"):
        bootstrap_mean([1.0, math.nan])


def test_verdicts_read_the_interval_not_the_point():
    assert judge(Estimate(0.3, 0.1, 0.5, 8), better_above=0.0, worse_below=0.0) == "better"
    assert judge(Estimate(0.3, -0.1, 0.5, 8), better_above=0.0, worse_below=0.0) == (
        "no_difference"
    )
    assert judge(Estimate(-0.3, -0.5, -0.1, 8), better_above=0.0, worse_below=0.0) == "worse"
    # a veto-only method: a tolerance below 0, never "better"
    assert judge(Estimate(-0.03, -0.04, -0.02, 8), better_above=math.inf, worse_below=-0.05) == (
        "no_difference"
    )
    assert judge(Estimate(0.0, 0.0, 0.0, 0), better_above=0.0, worse_below=0.0) == ("no_difference")
