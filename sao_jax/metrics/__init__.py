"""Run reporting: JSONL + TensorBoard metrics, a progress bar, summary tables, learning curves.

`plot_learning_curves` is imported lazily (matplotlib is slow to import and only needed at
the end of a run).
"""

from __future__ import annotations

from typing import Any

from sao_jax.metrics.progress import ProgressBar, format_metric
from sao_jax.metrics.summary import SUMMARY_FILE, save_summary, summary_table
from sao_jax.metrics.writer import (
    METRICS_FILE,
    MetricsWriter,
    decode_value,
    encode_value,
    read_metrics,
)


def __getattr__(name: str) -> Any:
    if name == "plot_learning_curves":
        from sao_jax.metrics.plots import plot_learning_curves

        return plot_learning_curves
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "METRICS_FILE",
    "SUMMARY_FILE",
    "MetricsWriter",
    "ProgressBar",
    "decode_value",
    "encode_value",
    "format_metric",
    "plot_learning_curves",
    "read_metrics",
    "save_summary",
    "summary_table",
]
