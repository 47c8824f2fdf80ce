"""Read and write Hugging Face safetensors directories with numpy (bfloat16 included).

The `safetensors` package's numpy backend cannot represent bfloat16, and its flax backend
copies every tensor onto the default device; this module memory-maps files instead, so a
loader can move each tensor straight to its final sharding. Format: 8-byte little-endian
header length, a JSON header {key: {dtype, shape, data_offsets}}, then the raw bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file or tensor is missing or malformed; the message names file and key."""


def _read_header(file: Path) -> tuple[dict, int]:
    try:
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise CheckpointError(f"{file}: not a safetensors file (shorter than 8 bytes)")
            (size,) = struct.unpack("<Q", raw)
            header = json.loads(f.read(size))
    except FileNotFoundError:
        raise CheckpointError(f"safetensors file not found: {file}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, struct.error) as e:
        raise CheckpointError(f"{file}: corrupt safetensors header ({e})") from None
    header.pop("__metadata__", None)
    return header, 8 + size


class SafetensorsReader:
    """Lazy reader over a HF checkpoint dir (single `model.safetensors` or an index + shards)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX_FILE
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: malformed index ({e!r})") from None
            self._file_of = {k: self.directory / v for k, v in weight_map.items()}
        elif (self.directory / SINGLE_FILE).exists():
            file = self.directory / SINGLE_FILE
            self._file_of = {k: file for k in _read_header(file)[0]}
        else:
            raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {self.directory}")
        self._headers: dict[Path, tuple[dict, int]] = {}

    def tensor_names(self) -> list[str]:
        return sorted(self._file_of)

    def __contains__(self, key: str) -> bool:
        return key in self._file_of

    def file_of(self, key: str) -> Path:
        if key not in self._file_of:
            raise CheckpointError(f"tensor {key!r} not found in checkpoint {self.directory}")
        return self._file_of[key]

    def get(self, key: str) -> np.ndarray:
        """The tensor `key` as a read-only memory-mapped numpy array."""
        file = self.file_of(key)
        if file not in self._headers:
            self._headers[file] = _read_header(file)
        header, data_start = self._headers[file]
        if key not in header:
            raise CheckpointError(f"{file}: tensor {key!r} listed in the index but not in the file")
        entry = header[key]
        if entry["dtype"] not in _DTYPES:
            raise CheckpointError(f"{file}: tensor {key!r} has unsupported dtype {entry['dtype']}")
        dtype = _DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != dtype.itemsize * int(np.prod(shape)):
            raise CheckpointError(f"{file}: tensor {key!r} byte size does not match its shape")
        return np.memmap(file, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)


def _write_file(file: Path, tensors: Mapping[str, np.ndarray]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, array in tensors.items():
        if array.dtype not in _NAMES:
            raise CheckpointError(f"cannot write {key!r}: unsupported dtype {array.dtype}")
        header[key] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((-len(blob)) % 8)  # the data section starts 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())


def write_safetensors_dir(
    directory: str | Path,
    tensors: Iterator[tuple[str, np.ndarray]] | Mapping[str, np.ndarray],
    *,
    max_shard_bytes: int = 5 * 2**30,
) -> list[Path]:
    """Write tensors as `model.safetensors`, or as shards + index when they exceed one shard.

    Returns the written files.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for key, array in items:
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = array
        size += array.nbytes
    if len(shards) == 1:
        _write_file(directory / SINGLE_FILE, shards[0])
        (directory / INDEX_FILE).unlink(missing_ok=True)
        return [directory / SINGLE_FILE]
    files, weight_map, total = [], {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        _write_file(directory / name, shard)
        files.append(directory / name)
        for key, array in shard.items():
            weight_map[key] = name
            total += array.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    (directory / SINGLE_FILE).unlink(missing_ok=True)
    return files
