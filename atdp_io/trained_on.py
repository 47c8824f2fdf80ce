"""Which trajectories each checkpoint trained on: a JSONL sidecar next to every saved step.

The learner counts the trajectories of every batch it trains on (`TrainedOn.add_batch`, from
the batch's `trajectory_refs`, which the ATDP loader fills) and, with each checkpoint step,
writes what it consumed since the previous one:

    <checkpoint dir>/lineage/<step>/process-<i>.jsonl

Line 1 is `{"format": "atdp-trained-on", "version": 1, "step": N, "parent": P,
"policy_version": V}`; each further line is `{"tenant": ..., "trajectory_id": ..., "batches": k}`.
`parent` is the checkpoint step the weights came from (the previous save, the restored step, or
a warm start in another directory) as a path, or null for weights trained from scratch, so the
full set a checkpoint trained on is its own sidecar plus its parent chain's (`trained_on`).
The sidecars live outside the step directories, so they outlive the checkpoints the
checkpointer prunes: a question about a deleted checkpoint still has an answer. One file per
process, since each process of a multi-host job reads its own batches.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from etils import epath

from atdp_io.schema import SchemaError, SourceRef

FORMAT = "atdp-trained-on"
VERSION = 1
LINEAGE_DIR = "lineage"
# [R, L] uint8 in a loader batch: row k is the UTF-8 "tenant/trajectory_id" of the trajectory in
# slot k of `traj_index`, NUL-padded (an id is printable, so it holds no NUL). Bytes rather than
# strings, so that a batch stays an all-numeric dict any array library accepts.
BATCH_KEY = "trajectory_refs"
_STEP = re.compile(r"^\d+$")


def as_path(location: str | os.PathLike) -> epath.Path:
    """A local path made absolute, a URL (`gs://...`) kept as it is."""
    text = os.fspath(location)
    return epath.Path(text if "://" in text else os.path.abspath(text))


def encode_refs(refs: Sequence[str], rows: int) -> np.ndarray:
    """The `trajectory_refs` entry of a batch of `rows` rows whose slot k holds `refs[k]`."""
    if len(refs) > rows:
        raise ValueError(f"{len(refs)} trajectories do not fit a batch of {rows} rows")
    encoded = [ref.encode() for ref in refs]
    out = np.zeros((rows, max([1, *map(len, encoded)])), np.uint8)
    for k, raw in enumerate(encoded):
        out[k, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def decode_ref(row: np.ndarray) -> SourceRef:
    """The trajectory of one `trajectory_refs` row."""
    return SourceRef.parse(np.asarray(row, np.uint8).tobytes().rstrip(b"\0").decode())


@dataclasses.dataclass(frozen=True)
class StepLineage:
    """What one checkpoint step recorded: its own trajectories (all processes) and parent."""

    directory: str
    step: int
    parent: str | None
    policy_version: int | None
    trajectories: Mapping[SourceRef, int]  # trajectory -> batches it was in

    @property
    def path(self) -> str:
        return os.fspath(as_path(self.directory) / str(self.step))


class TrainedOn:
    """The trajectories a learner consumed since its last checkpoint, and where it came from.

    `parent`: the checkpoint step the current weights descend from (a path), None at first.
    """

    def __init__(self, parent: str | None = None):
        self.parent = parent
        self.pending: collections.Counter[SourceRef] = collections.Counter()
        self.policy_version: int | None = None  # after the latest batch

    def add_batch(self, batch: Mapping[str, np.ndarray], policy_version: int | None = None) -> None:
        """Counts the trajectories of a loader batch (a batch without `trajectory_refs`, e.g.
        the padding batch of an idle process, adds nothing)."""
        if policy_version is not None:
            self.policy_version = int(policy_version)
        refs = batch.get(BATCH_KEY)
        if refs is None:
            return
        used = np.unique(np.asarray(batch["traj_index"]))
        for k in used[used >= 0].tolist():
            self.pending[decode_ref(refs[k])] += 1

    def saved(self, path: str) -> None:
        """After the sidecar of checkpoint `path` was written: start counting afresh."""
        self.parent = path
        self.pending.clear()


def write_step(
    directory: str | os.PathLike,
    step: int,
    trained_on: TrainedOn,
    *,
    process: int = 0,
) -> epath.Path:
    """Writes the sidecar of checkpoint `step` in `directory` (atomically: a reader never sees
    half a file); returns its path. Call before the checkpoint itself is committed, so a
    checkpoint never exists without its lineage."""
    root = as_path(directory) / LINEAGE_DIR / str(int(step))
    root.mkdir(parents=True, exist_ok=True)
    head = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "parent": trained_on.parent,
        "policy_version": trained_on.policy_version,
    }
    lines = [json.dumps(head)]
    for ref, count in sorted(trained_on.pending.items(), key=lambda item: str(item[0])):
        lines.append(
            json.dumps({"tenant": ref.tenant, "trajectory_id": ref.trajectory_id, "batches": count})
        )
    path = root / f"process-{int(process)}.jsonl"
    tmp = root / f".process-{int(process)}.jsonl.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)
    return path


def split_step_path(path: str | os.PathLike) -> tuple[epath.Path, int | None]:
    """`(checkpoint dir, step)` of a step directory `DIR/<step>`; `(DIR, None)` for a
    checkpoint directory."""
    path = as_path(path)
    if _STEP.match(path.name):
        return path.parent, int(path.name)
    return path, None


def steps(directory: str | os.PathLike) -> list[int]:
    """Steps of `directory` that have a lineage sidecar, ascending."""
    root = as_path(directory) / LINEAGE_DIR
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if _STEP.match(p.name) and p.is_dir())


def read_step(directory: str | os.PathLike, step: int) -> StepLineage:
    """The sidecar of one step (every process's file merged). Raises FileNotFoundError when
    the step has none, SchemaError when a file is not a sidecar."""
    root = as_path(directory) / LINEAGE_DIR / str(int(step))
    files = sorted(root.glob("process-*.jsonl")) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no trained-on sidecar for step {step} in {directory}")
    counts: collections.Counter[SourceRef] = collections.Counter()
    parent = version = None
    for file in files:
        lines = [line for line in file.read_text().splitlines() if line.strip()]
        try:
            head = json.loads(lines[0]) if lines else {}
            if head.get("format") != FORMAT or head.get("version") != VERSION:
                raise SchemaError(f"{file}: not an {FORMAT} v{VERSION} sidecar")
            parent, version = head.get("parent"), head.get("policy_version")
            for line in lines[1:]:
                item = json.loads(line)
                counts[SourceRef(item["tenant"], item["trajectory_id"])] += int(item["batches"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            if isinstance(err, SchemaError):
                raise
            raise SchemaError(f"{file}: damaged sidecar ({err})") from err
    return StepLineage(os.fspath(as_path(directory)), int(step), parent, version, dict(counts))


def chain(path: str | os.PathLike) -> list[StepLineage]:
    """The sidecars of checkpoint step `path` and of its parents, newest first (a step whose
    sidecar is missing ends the chain: those weights' earlier history is unknown)."""
    out, seen = [], set()
    current: str | None = os.fspath(path)
    while current is not None and current not in seen:
        seen.add(current)
        directory, step = split_step_path(current)
        if step is None:
            raise ValueError(f"{current}: expected a checkpoint step directory DIR/<step>")
        try:
            lineage = read_step(directory, step)
        except FileNotFoundError:
            break
        out.append(lineage)
        current = lineage.parent
    return out


def trained_on(path: str | os.PathLike) -> dict[SourceRef, int]:
    """Every trajectory the checkpoint step `path` was trained on (its chain included), with
    the number of batches it was in."""
    total: collections.Counter[SourceRef] = collections.Counter()
    for lineage in chain(path):
        total.update(lineage.trajectories)
    return dict(total)


def checkpoints_trained_on(
    directories: Iterable[str | os.PathLike], refs: Iterable[SourceRef]
) -> dict[str, set[SourceRef]]:
    """`{checkpoint step path: the refs it trained on}` for each step of `directories` whose
    weights saw any of `refs` (directly or through a parent)."""
    wanted = set(refs)
    out = {}
    for directory in directories:
        for step in steps(directory):
            path = os.fspath(as_path(directory) / str(step))
            hit = wanted & set(trained_on(path))
            if hit:
                out[path] = hit
    return out
