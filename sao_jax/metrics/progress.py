"""A tqdm progress bar that shows the latest values of chosen metrics in its postfix."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import jax
import numpy as np
from tqdm.auto import tqdm


def format_metric(value: Any) -> str:
    """Short text for one value: ints as is, floats to 4 significant digits, 'nan' / 'inf'."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real) or (hasattr(value, "shape") and np.size(value) == 1):
        number = float(np.asarray(value).reshape(()))
        return f"{number:.4g}" if math.isfinite(number) else str(number)
    return str(value)


class ProgressBar:
    """`with ProgressBar(total, keys=("loss", "success")) as bar: bar.update(metrics=m)`.

    Args:
      total: steps expected (None for unknown).
      keys: metric names shown in the postfix, in this order; None shows every metric given.
      initial: steps already done (when resuming).
      disable: hide the bar; default: shown on process 0 only.
      file: stream to draw on (default stderr).
    """

    def __init__(
        self,
        total: int | None,
        *,
        desc: str | None = None,
        keys: Sequence[str] | None = None,
        initial: int = 0,
        unit: str = "step",
        disable: bool | None = None,
        file: TextIO | None = None,
    ):
        if disable is None:
            disable = jax.process_index() != 0
        self.keys = tuple(keys) if keys is not None else None
        self._bar = tqdm(
            total=total,
            desc=desc,
            initial=initial,
            unit=unit,
            disable=disable,
            file=file,
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def update(self, n: int = 1, metrics: Mapping[str, Any] | None = None) -> None:
        """Advance by `n` steps and show the chosen entries of `metrics` (missing ones skipped)."""
        if metrics:
            self.set_metrics(metrics)
        self._bar.update(n)

    def set_metrics(self, metrics: Mapping[str, Any]) -> None:
        keys = self.keys if self.keys is not None else tuple(metrics)
        shown = {k: format_metric(jax.device_get(metrics[k])) for k in keys if k in metrics}
        self._bar.set_postfix(shown, refresh=False)

    def write(self, message: str) -> None:
        """Print a line above the bar without breaking it."""
        self._bar.write(message, file=self._bar.fp)

    @property
    def n(self) -> int:
        return self._bar.n

    @property
    def total(self) -> int | None:
        return self._bar.total

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
