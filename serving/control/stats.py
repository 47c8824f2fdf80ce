"""Confidence intervals the control plane decides with (pure functions, numpy only).

- `wilson`: a success rate (k of n) and its Wilson score interval; sound for small n and for
  rates near 0 or 1, where the normal approximation is not.
- `rate_difference`: the difference of two independent success rates (a - b) with Newcombe's
  hybrid score interval (built from the two Wilson intervals), for live traffic of two
  composite versions.
- `bootstrap_mean`: a mean and its percentile-bootstrap interval, for paired differences
  (replayed episodes, re-scored trajectories); seeded, so a decision is reproducible.

Every interval is two-sided at `confidence` (default 0.95).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A value, its confidence interval [low, high] and the sample size it came from."""

    value: float
    low: float
    high: float
    n: int

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}


def _z(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson(successes: int, n: int, confidence: float = 0.95) -> Estimate:
    """Success rate k/n with its Wilson score interval; n = 0 gives [0, 1] around 0."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    z = _z(confidence)
    if n == 0:
        return Estimate(0.0, 0.0, 1.0, 0)
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # exact at the ends: rounding must not lift 0 successes off 0 (nor n below 1)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Estimate(p, low, high, n)


def rate_difference(a: Estimate, b: Estimate) -> Estimate:
    """(rate a - rate b) with Newcombe's hybrid score interval from the two Wilson estimates
    (both at the same confidence); n is the smaller sample. Either sample empty: [-1, 1]."""
    value = a.value - b.value
    if a.n == 0 or b.n == 0:
        return Estimate(value, -1.0, 1.0, min(a.n, b.n))
    low = value - math.sqrt((a.value - a.low) ** 2 + (b.high - b.value) ** 2)
    high = value + math.sqrt((a.high - a.value) ** 2 + (b.value - b.low) ** 2)
    return Estimate(value, max(-1.0, low), min(1.0, high), min(a.n, b.n))


def bootstrap_mean(
    values: Sequence[float],
    confidence: float = 0.95,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Mean of `values` [n] with a percentile-bootstrap interval (`resamples` draws, seeded).
    No values: an Estimate of 0 with an unbounded interval (nothing is known)."""
    _z(confidence)
    x = np.asarray(values, np.float64)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {x.shape}")
    if x.size == 0:
        return Estimate(0.0, -math.inf, math.inf, 0)
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, x.size, size=(resamples, x.size))
    means = x[draws].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Estimate(float(x.mean()), float(low), float(high), int(x.size))
