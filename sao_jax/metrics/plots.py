"""Learning-curve PNGs from metrics.jsonl files (matplotlib, Agg, no pyplot global state)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sao_jax.metrics.writer import read_metrics

Records = Sequence[Mapping[str, Any]]
RunSource = str | os.PathLike | Records
# Short series (periodic evaluations) are drawn raw with markers: an EMA over a handful of
# points would lag far behind the last measured value.
_MIN_POINTS_TO_SMOOTH = 10


def _records(source: RunSource) -> list[Mapping[str, Any]]:
    if isinstance(source, str | os.PathLike):
        return read_metrics(source)
    return list(source)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def series(records: Records, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric over the records that have it, in step order; [N] each.

    A step recorded twice (a resumed run that re-did steps) keeps its last value."""
    by_step = {r["step"]: float(r[key]) for r in records if _is_number(r.get(key))}
    pairs = sorted(by_step.items())
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0)
    steps, values = zip(*pairs, strict=True)
    return np.asarray(steps), np.asarray(values)


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing), [N] -> [N]."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    out = np.empty_like(values, dtype=float)
    running, correction = 0.0, 0.0
    for index, value in enumerate(values):
        running = weight * running + (1 - weight) * value
        correction = weight * correction + (1 - weight)
        out[index] = running / correction
    return out


def plot_learning_curves(
    metrics: RunSource | Mapping[str, RunSource],
    out_png: str | os.PathLike,
    keys: Sequence[str] | None = None,
    *,
    smoothing: float = 0.6,
    title: str | None = None,
    columns: int = 3,
) -> Path | None:
    """Write one panel per metric, step on the x axis, and return the PNG path.

    Only process 0 draws (like `MetricsWriter`, which writes metrics.jsonl there alone);
    elsewhere nothing is read or written and None is returned.

    Args:
      metrics: a metrics.jsonl path (or run dir, or a list of records), or a mapping
        label -> such source to overlay several runs (e.g. one per algorithm) in each panel.
      keys: metrics to draw, in order; default every numeric metric of the first run.
      smoothing: EMA weight; the raw curve is drawn faintly beneath the smoothed one (0: raw).
        Series of fewer than 10 points are drawn raw, with markers.
    Non-finite points are left out and counted in the panel title.
    """
    if jax.process_index() != 0:
        return None
    runs = (
        {label: _records(source) for label, source in metrics.items()}
        if isinstance(metrics, Mapping)
        else {"": _records(metrics)}
    )
    available = list(
        dict.fromkeys(
            key
            for records in runs.values()
            for record in records
            for key, value in record.items()
            if key != "step" and _is_number(value)
        )
    )
    if keys is None:
        keys = available
    unknown = [key for key in keys if key not in available]
    if unknown:
        raise ValueError(f"no numeric metric {unknown} in the records; available: {available}")
    if not keys:
        raise ValueError("nothing to plot: the records hold no numeric metric")

    columns = max(1, min(columns, len(keys)))
    rows = math.ceil(len(keys) / columns)
    figure = Figure(figsize=(4.6 * columns, 3.3 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    colors = [f"C{i % 10}" for i in range(len(runs))]
    for ax, key in zip(axes, keys, strict=False):
        dropped = 0
        for color, (label, records) in zip(colors, runs.items(), strict=True):
            steps, values = series(records, key)
            finite = np.isfinite(values)
            dropped += int((~finite).sum())
            steps, values = steps[finite], values[finite]
            if steps.size == 0:
                continue
            sparse = steps.size < _MIN_POINTS_TO_SMOOTH  # e.g. periodic evaluations
            if smoothing > 0 and not sparse:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                values = ema(values, smoothing)
            ax.plot(
                steps,
                values,
                color=color,
                linewidth=1.8,
                label=label or None,
                marker="o" if sparse else None,
                markersize=4,
            )
        ax.set_title(key + (f"  ({dropped} non-finite left out)" if dropped else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend(fontsize=8)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_png, dpi=110)
    return out_png
