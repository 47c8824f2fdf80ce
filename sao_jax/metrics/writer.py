"""Run metrics to `metrics.jsonl` (one JSON object per line) and TensorBoard event files.

Each line is `{"step": <int>, "<name>": <value>, ...}`. Nested dicts are flattened with "/"
(`{"eval": {"seen": 0.4}}` -> `"eval/seen"`), which TensorBoard also uses for grouping.

Non-finite numbers: JSON has no NaN or infinity, so they are written as the strings "nan",
"inf" and "-inf" (never `null`, which would hide whether a loss diverged or was absent).
`read_metrics` turns them back into floats. TensorBoard receives the float itself.

Only process 0 (`jax.process_index() == 0`) writes; on other processes every call is a no-op.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts flattened to "a/b" names; raises ValueError on a non-string name."""
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"metric names must be non-empty strings, got {key!r}")
        name = prefix + key
        if isinstance(value, Mapping):
            flat.update(flatten_metrics(value, name + "/"))
        else:
            flat[name] = value
    return flat


def to_scalar(name: str, value: Any) -> int | float | str | None:
    """One metric value as a JSON-able Python scalar (0-d and size-1 arrays are accepted)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    array = np.asarray(value)
    numeric = np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_
    if array.size != 1 or not numeric:
        raise ValueError(
            f"metric {name!r} must be a number, string or one-element array; got "
            f"{type(value).__name__} with shape {array.shape} and dtype {array.dtype}"
        )
    return int(array.reshape(())) if array.dtype == np.bool_ else array.reshape(()).item()


def encode_value(value: int | float | str | None) -> int | float | str | None:
    """The JSON form of one value: non-finite floats become "nan" / "inf" / "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def decode_value(value: Any) -> Any:
    """Inverse of `encode_value`."""
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (a file or the run directory holding it).

    A truncated last line (the run was killed mid-write) is skipped with a warning; a broken
    line elsewhere raises ValueError naming the line.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("not an object with a 'step'")
        except ValueError as error:
            if number == len(lines):
                logger.warning("%s: skipping truncated last line %d", path, number)
                break
            raise ValueError(f"{path} line {number} is not a metrics record: {error}") from error
        records.append({key: decode_value(value) for key, value in record.items()})
    return records


class MetricsWriter:
    """Append metrics to `out_dir/metrics.jsonl` and `out_dir/tensorboard/`.

    Args:
      out_dir: the run directory (created).
      tensorboard: also write TensorBoard event files.
      resume_from_step: when resuming from a checkpoint at this step, drop records with a
        larger step (written after that checkpoint by the interrupted run) from the JSONL and
        tell TensorBoard to purge them, so curves have no duplicate steps.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        resume_from_step: int | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / METRICS_FILE
        self.enabled = jax.process_index() == 0
        self._file = None
        self._tensorboard = None
        if not self.enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume_from_step is not None and self.path.exists():
            self._truncate_after(resume_from_step)
        self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            from tensorboardX import SummaryWriter  # heavy import, only where it is used

            purge = None if resume_from_step is None else resume_from_step + 1
            self._tensorboard = SummaryWriter(
                str(self.out_dir / TENSORBOARD_DIR), purge_step=purge, flush_secs=30
            )

    def _truncate_after(self, step: int) -> None:
        kept = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and _line_step(line) is not None and _line_step(line) <= step
        ]
        temporary = self.path.with_suffix(".jsonl.tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, self.path)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record `metrics` (numbers, strings, 0-d numpy / jax arrays, nested dicts) at `step`.

        Device arrays are fetched in one transfer. Raises ValueError naming a bad metric. A NaN
        (a value with nothing to measure this step, e.g. the gap of a skill kind no row had)
        goes to metrics.jsonl as "nan" and is left out of TensorBoard, where it plots nothing
        and tensorboardX would warn on every write.
        """
        if not isinstance(step, numbers.Integral) or isinstance(step, bool):
            raise TypeError(f"step must be an int, got {type(step).__name__}")
        flat = flatten_metrics(metrics)
        if "step" in flat:
            raise ValueError("'step' is reserved; pass it as the step argument")
        # one device-to-host transfer; a list keeps the caller's column order (dicts get sorted)
        fetched = jax.device_get(list(flat.values()))
        values = {name: to_scalar(name, v) for name, v in zip(flat, fetched, strict=True)}
        if not self.enabled:
            return
        if self._file is None:
            raise RuntimeError(f"MetricsWriter for {self.out_dir} is closed")
        record = {"step": int(step), **{k: encode_value(v) for k, v in values.items()}}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()  # a crashed run keeps every completed line
        if self._tensorboard is not None:
            for name, value in values.items():
                if isinstance(value, int | float) and not math.isnan(value):
                    self._tensorboard.add_scalar(name, value, int(step))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._tensorboard is not None:
            self._tensorboard.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _line_step(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None  # a truncated line from a killed run
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) else None
