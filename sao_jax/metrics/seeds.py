"""Mean and spread over seeds, and the per-run series they are taken over (pure; no file I/O).

RL results are reported as `mean +- std` over runs of different seeds, std the sample standard
deviation (n - 1 in the denominator: `statistics.stdev`, `numpy.std(ddof=1)`), which one run
alone does not define. The series read from a run's metrics records (`read_metrics`):

- `eval_curve`: greedy success on a split per policy step (periodic evaluation);
- `rl_iterations` / `windowed_differences`: the rollout success of a run against a control
  run's, in windows of RL iterations.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Records = Sequence[Mapping[str, Any]]
BATCH_SUCCESS_KEY = "batch/success_rate"
# The learner's phase per iteration: 0 trains the critic only (warm-up), 1 makes policy steps.
RL_PHASE = 1.0


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def eval_success_key(split: str) -> str:
    """The metrics key of greedy success on `split` (`eval/valid_unseen/success`)."""
    return f"eval/{split}/success"


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """(mean, sample standard deviation) of `values`; the std of one value is nan.

    Raises ValueError when `values` is empty.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_std needs at least one value")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return mean, math.nan
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def format_mean_std(
    values: Iterable[float],
    scale: float = 100.0,
    signed: bool = True,
    digits: int = 1,
    pm: str = "+-",
) -> str:
    """`mean +- std` of `values` times `scale` (default: fractions as points), e.g. `+5.5 +- 1.6`.

    One value prints as the value alone (its std is undefined). `signed` writes the mean's
    sign even when positive (gains); `pm` is the separator's symbol (`±` for tables meant for
    reading). A mean that rounds to zero prints as `+0.0`, never `-0.0`.
    """
    values = list(values)
    if digits < 0:
        raise ValueError(f"digits must be >= 0, got {digits}")
    mean, std = mean_std(values)
    sign = "+" if signed else ""
    text = f"{mean * scale:{sign}z.{digits}f}"
    if len(values) == 1:
        return text
    return f"{text} {pm} {std * scale:.{digits}f}"


def eval_curve(records: Records, split: str) -> dict[int, float]:
    """Policy step -> greedy success on `split`, from a run's metrics records in file order.

    An evaluation row's policy step is the `policy_version` of the latest row before it that
    has one (0 before any: the start evaluation). The final evaluation of a run repeats the
    last periodic one at the same policy step; a step keeps its first value.
    """
    key = eval_success_key(split)
    curve: dict[int, float] = {}
    step = 0
    for record in records:
        version = record.get("policy_version")
        if _number(version):
            step = int(version)
        value = record.get(key)
        if _number(value):
            curve.setdefault(step, float(value))
    return dict(sorted(curve.items()))


def rl_records(records: Records) -> list[Mapping[str, Any]]:
    """The records of RL iterations (learner `phase` 1: critic warm-up iterations are left
    out), in file order."""
    return [r for r in records if r.get("phase") == RL_PHASE]


def rl_iterations(records: Records, key: str = BATCH_SUCCESS_KEY) -> list[float]:
    """`key` of each RL iteration that logged it (`rl_records`), in file order."""
    return [float(r[key]) for r in rl_records(records) if _number(r.get(key))]


def windowed_differences(
    run_records: Records, control_records: Records, window: int, key: str = BATCH_SUCCESS_KEY
) -> list[float]:
    """Per window of `window` RL iterations, the run's mean `key` minus the control's.

    Iterations are paired by index within RL (`rl_iterations`); only complete windows of the
    iterations both runs have count (a run still going has fewer). Differences are in the
    metric's units (fractions for success rates).
    """
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}")
    run, control = rl_iterations(run_records, key), rl_iterations(control_records, key)
    count = min(len(run), len(control)) // window
    differences = []
    for index in range(count):
        part = slice(index * window, (index + 1) * window)
        differences.append(mean_std(run[part])[0] - mean_std(control[part])[0])
    return differences


def gains(curve: Mapping[int, float], start: float) -> dict[int, float]:
    """Policy step -> success minus `start`; step 0 is the start itself (gain 0), whatever
    `curve` holds there."""
    return {step: value - start for step, value in sorted({**curve, 0: start}.items())}
