"""On-storage layout of an ATDP store: key paths, zarr3 array specs, the record table, the head.

```
<root>/atdp.json                 store marker (format version, array chunking)
<root>/partitions/<tenant>       one empty marker key per tenant partition
<root>/tenants/<tenant>/
    head.json                    the commit point: committed lengths of every array
    records/                     zarr3 int64 [2**40, N_COLUMNS]: the append-only record log
    tokens/ logprobs/ loss_mask/ versions/   zarr3 flat token streams
    meta/                        zarr3 uint8: JSON bytes of every record
    grants/<grant_id>.json       access grants to other principals (see access.py)
    audit/<time_ns>-<id>.json    one key per audited access
    writer.lock                  advisory lock file (local-file kvstores only)
```

Every array is created with an effectively unbounded first dimension (2**40): appending never
resizes, rewrites metadata or moves data; unwritten chunks cost nothing. A writer fills data past
the committed lengths, commits those writes in one transaction, then replaces `head.json`
(a single-key write, atomic on every kvstore). Readers never look past the head, so a writer
killed between the two steps leaves nothing visible, and a new writer overwrites that tail.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from enum import IntEnum
from typing import Any, NamedTuple

import numpy as np
import tensorstore as ts

from atdp_io.schema import RedactionStatus

FORMAT_VERSION = 1
CAPACITY = 2**40
MISSING_GENERATION = b"\x02"  # TensorStore's generation of an absent key (create-if-absent)


class RecordKind(IntEnum):
    OPEN = 1  # a trajectory header; the record's row is the trajectory's row id
    EVENT = 2
    CLOSE = 3  # the outcome; a closed trajectory is complete and loadable
    ANNOTATION = 4  # a late reward / verdict / critique / governance update
    PURGE = 5  # tombstone: the trajectory's bytes were erased (retention or deletion request)


class AnnotationKind(IntEnum):
    LATE_REWARD = 1
    VERDICT_UPDATE = 2
    CRITIQUE = 3
    GOVERNANCE_UPDATE = 4


class Col(IntEnum):
    """Columns of the record table (int64)."""

    KIND = 0
    TRAJ = 1  # row of the trajectory's OPEN record
    EVENT = 2  # event index within the trajectory (-1 when not about one event)
    TOKEN_START = 3  # first element in the token streams
    PREFIX_LEN = 4  # tokens shared with the previous LLM call's input + output (not stored again)
    INPUT_LEN = 5  # stored input suffix length
    OUTPUT_LEN = 6
    META_START = 7
    META_LEN = 8
    MIN_VERSION = 9  # smallest output-token policy version (-1 when none)
    MAX_VERSION = 10
    VALUE = 11  # float64 bits: reward sum (EVENT, LATE_REWARD) or expires_at (OPEN, NaN = never)
    SUBKIND = 12  # EventKind code (EVENT) or AnnotationKind (ANNOTATION)
    REDACTION = (
        13  # RedactionStatus code of the record (OPEN, EVENT), so governance needs no payload
    )


REDACTION_CODES = {status: i for i, status in enumerate(RedactionStatus)}


N_COLUMNS = len(Col)
TOKEN_STREAMS = ("tokens", "logprobs", "loss_mask", "versions")
_DTYPES = {
    "tokens": "int32",
    "logprobs": "float32",
    "loss_mask": "int8",
    "versions": "int32",
    "meta": "uint8",
}


@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """Chunking and codecs of new partitions, in elements per chunk.

    Small chunks keep incremental (per-event) commits cheap, since each commit rewrites the tail
    chunk of every array; large chunks favour bulk appends and reads.
    """

    token_chunk: int = 1 << 14
    meta_chunk: int = 1 << 18
    record_chunk: int = 1024
    compression: str | None = None  # None or "zstd"
    zstd_level: int = 3
    checksum: bool = True  # crc32c per chunk: torn or corrupted chunks fail loudly on read

    def __post_init__(self):
        for field in ("token_chunk", "meta_chunk", "record_chunk"):
            if getattr(self, field) < 64:
                raise ValueError(f"StoreConfig.{field} must be >= 64, got {getattr(self, field)}")
        if self.compression not in (None, "zstd"):
            raise ValueError(
                f"StoreConfig.compression must be None or 'zstd', got {self.compression!r}"
            )

    def codecs(self) -> list[dict]:
        codecs: list[dict] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        if self.compression == "zstd":
            codecs.append({"name": "zstd", "configuration": {"level": self.zstd_level}})
        if self.checksum:
            codecs.append({"name": "crc32c"})
        return codecs


def kvstore_spec(location: str | os.PathLike | Mapping[str, Any]) -> dict:
    """A TensorStore kvstore spec for a store root: a local path, a URL or a spec dict.

    `"/data/atdp"`, `"gs://bucket/atdp"`, `{"driver": "s3", "bucket": ..., "path": ...}` all work;
    the spec passes straight to TensorStore, so any kvstore driver it supports works here.
    """
    if isinstance(location, Mapping):
        spec = dict(location)
        if "driver" not in spec:
            raise ValueError(f"kvstore spec {spec!r} has no 'driver'")
    elif isinstance(location, str) and "://" in location:
        spec = ts.KvStore.Spec(location).to_json()
    else:
        spec = {"driver": "file", "path": os.path.abspath(os.fspath(location))}
    path = spec.get("path", "")
    spec["path"] = path if not path or path.endswith("/") else path + "/"
    return spec


def child_spec(spec: Mapping[str, Any], *parts: str) -> dict:
    """`spec` with `parts` appended to its path (a directory: trailing slash)."""
    return {**spec, "path": spec.get("path", "") + "".join(p.strip("/") + "/" for p in parts)}


def local_path(spec: Mapping[str, Any]) -> str | None:
    """The filesystem path of a local-file kvstore spec, else None."""
    return spec["path"] if spec.get("driver") == "file" else None


def array_spec(partition: Mapping[str, Any], name: str, config: StoreConfig) -> dict:
    """zarr3 spec of one partition array (`records` or a name in TOKEN_STREAMS / `meta`)."""
    if name == "records":
        shape, chunk, dtype = [CAPACITY, N_COLUMNS], [config.record_chunk, N_COLUMNS], "int64"
    else:
        size = config.meta_chunk if name == "meta" else config.token_chunk
        shape, chunk, dtype = [CAPACITY], [size], _DTYPES[name]
    return {
        "driver": "zarr3",
        "kvstore": child_spec(partition, name),
        "metadata": {
            "shape": shape,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
            "data_type": dtype,
            "codecs": config.codecs(),
        },
    }


class PartitionArrays(NamedTuple):
    records: ts.TensorStore
    tokens: ts.TensorStore
    logprobs: ts.TensorStore
    loss_mask: ts.TensorStore
    versions: ts.TensorStore
    meta: ts.TensorStore


def open_arrays(
    partition: Mapping[str, Any],
    config: StoreConfig,
    *,
    create: bool,
    context: ts.Context | None = None,
) -> PartitionArrays:
    """Opens (and with `create`, creates) every array of a partition."""
    names = PartitionArrays._fields
    futures = []
    for name in names:
        spec = array_spec(partition, name, config)
        if not create:
            spec = {"driver": "zarr3", "kvstore": spec["kvstore"]}
        futures.append(ts.open(spec, create=create, open=True, context=context))
    return PartitionArrays(*(f.result() for f in futures))


def write_tail(
    arrays: PartitionArrays,
    head: Head,
    records: np.ndarray,
    meta: np.ndarray,
    streams: Mapping[str, np.ndarray],
) -> None:
    """Writes data just past `head` in every array as one transaction, durable on return.

    `records [k, N_COLUMNS] int64`, `meta [m] uint8`, `streams`: TOKEN_STREAMS name -> `[n]`
    (all present or all absent). Nothing written here is visible until the head moves.
    """
    txn = ts.Transaction()
    writes = [
        _write(arrays.records, txn, head.records, records),
        _write(arrays.meta, txn, head.meta_bytes, meta),
    ]
    writes += [_write(getattr(arrays, n), txn, head.tokens, data) for n, data in streams.items()]
    for future in writes:
        future.result()
    txn.commit_sync()


def erase_records(arrays: PartitionArrays, records: np.ndarray) -> None:
    """Overwrites the payload bytes and token streams of `records [k, N_COLUMNS]` with zeros."""
    txn = ts.Transaction()
    writes = []
    for rec in records:
        start, length = int(rec[Col.META_START]), int(rec[Col.META_LEN])
        if length:
            writes.append(_write(arrays.meta, txn, start, np.zeros(length, np.uint8)))
        n_tokens = int(rec[Col.INPUT_LEN] + rec[Col.OUTPUT_LEN])
        for name in TOKEN_STREAMS if n_tokens else ():
            array = getattr(arrays, name)
            zeros = np.zeros(n_tokens, array.dtype.numpy_dtype)
            writes.append(_write(array, txn, int(rec[Col.TOKEN_START]), zeros))
    for future in writes:
        future.result()
    txn.commit_sync()


def _write(array: ts.TensorStore, txn: ts.Transaction, start: int, data: np.ndarray):
    return array.with_transaction(txn)[start : start + data.shape[0]].write(data)


@dataclasses.dataclass(frozen=True)
class Head:
    """The commit point of a partition: how much of each array is committed."""

    tenant: str
    records: int = 0
    tokens: int = 0
    meta_bytes: int = 0
    commits: int = 0
    writer_epoch: int = 0

    def to_bytes(self) -> bytes:
        payload = {"format": "atdp-partition", "format_version": FORMAT_VERSION}
        payload.update(dataclasses.asdict(self))
        return json.dumps(payload, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Head:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: head.json is not JSON ({err})") from err
        if data.get("format") != "atdp-partition":
            raise ValueError(f"{where}: head.json is not an ATDP partition head")
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{where}: partition format {data.get('format_version')} is not supported "
                f"(this code reads format {FORMAT_VERSION})"
            )
        fields = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        return cls(**fields)


def read_key(kvstore: ts.KvStore, key: str) -> tuple[bytes | None, bytes]:
    """(value or None when absent, storage generation) of one key."""
    result = kvstore.read(key).result()
    value = result.value if result.state == "value" else None
    return value, result.stamp.generation
