"""Small host values shared by every process of a job: flags, counters, JSON records.

Multi-controller JAX runs the same program on every host; whenever a host-side decision must
be the same everywhere (does anyone have a batch? is the environment-step budget spent? the
evaluation over every host's games), the processes exchange a few numbers first. These helpers
do it with `multihost_utils.process_allgather`, so they are collectives: every process must
call them in the same order. With one process they return at once, without touching a device.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import numpy as np


def allgather_numbers(values: np.ndarray | list[float]) -> np.ndarray:
    """[P, *shape] float64: every process's `values` (same shape on each), in process order."""
    local = np.asarray(values, np.float64)
    if jax.process_count() == 1:
        return local[None]
    from jax.experimental import multihost_utils

    # float32 on the wire (x64 is usually off): exact for counts below 2**24 only, so large
    # integers travel as (high, low) halves
    high, low = np.divmod(local, 2.0**20)
    both = np.stack([high, low]).astype(np.float32)
    gathered = np.asarray(multihost_utils.process_allgather(both), np.float64)
    return gathered[:, 0] * 2.0**20 + gathered[:, 1]


def any_process(flag: bool) -> bool:
    """Whether `flag` is true on at least one process."""
    return bool(allgather_numbers([float(flag)]).max() > 0)


def allgather_json(value: Any) -> list[Any]:
    """Every process's JSON-serialisable `value`, in process order."""
    encoded = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
    if jax.process_count() == 1:
        return [value]
    lengths = allgather_numbers([encoded.size])[:, 0].astype(np.int64)
    padded = np.zeros(int(lengths.max()), np.float64)
    padded[: encoded.size] = encoded
    gathered = allgather_numbers(padded).astype(np.uint8)
    return [json.loads(row[:n].tobytes()) for row, n in zip(gathered, lengths, strict=True)]
