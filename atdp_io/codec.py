"""JSON codec for ATDP records: dataclass <-> plain JSON values, strict in both directions.

Token streams of an `LLMCall` (ids, log-probs, versions, loss mask) are not JSON: the store keeps
them in flat arrays, so `event_to_json` leaves them out and `event_from_json` takes them back as
an `LLMArrays`. Decoding rejects unknown fields and wrong types with a `SchemaError` that names
the field path (`events[3].llm.decoding.top_p: ...`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, NamedTuple

import numpy as np

from atdp_io import schema
from atdp_io.schema import SchemaError

_LLM_ARRAY_FIELDS = ("input_ids", "output_ids", "output_logprobs", "output_versions", "loss_mask")
_ANNOTATION_TAGS = {
    schema.LateReward: "late_reward",
    schema.VerdictUpdate: "verdict_update",
    schema.Critique: "critique",
    schema.GovernanceUpdate: "governance_update",
}
_TAG_TO_ANNOTATION = {tag: cls for cls, tag in _ANNOTATION_TAGS.items()}


class LLMArrays(NamedTuple):
    """The token streams of one LLM call, shapes as in `schema.LLMCall`."""

    input_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    output_versions: np.ndarray
    loss_mask: np.ndarray


def check_json_value(value: Any, path: str) -> Any:
    """Returns `value` as plain JSON (dicts, lists, str, finite numbers, bool, None) or raises."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise SchemaError(f"{path}: JSON numbers must be finite, got {value}")
        return float(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(f"{path}: JSON object keys must be str, got {key!r}")
            out[key] = check_json_value(item, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [check_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise SchemaError(f"{path}: {type(value).__name__} is not a JSON value")


def to_json(record: Any, path: str = "") -> Any:
    """Encodes a schema dataclass (recursively) as JSON values; LLM token arrays are skipped."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for field in dataclasses.fields(record):
            if isinstance(record, schema.LLMCall) and field.name in _LLM_ARRAY_FIELDS:
                continue
            out[field.name] = to_json(getattr(record, field.name), _join(path, field.name))
        return out
    if isinstance(record, Enum):
        return record.value
    if isinstance(record, tuple) and record and dataclasses.is_dataclass(record[0]):
        return [to_json(item, f"{path}[{i}]") for i, item in enumerate(record)]
    return check_json_value(record, path or "value")


def to_json_unchecked(record: Any, strings: list[str] | None = None) -> dict:
    """`to_json` without the JSON-value checks of free-form fields (the writer's hot path).

    Free-form values (`observation`, tool arguments, ...) are passed through by reference; a
    non-JSON value surfaces when the result is serialized, and `dumps_record` then re-encodes
    with `to_json` to name the field. With `strings`, every text the record carries (string
    fields and every key and string inside free-form values; not enum values or field names) is
    appended to it, for redaction.
    """
    return _encoder(type(record))(record, [] if strings is None else strings)


def dumps_record(data: Any, record: Any) -> bytes:
    """Serializes `data` (an unchecked encoding of `record`), naming the bad field on failure."""
    try:
        return dumps(data)
    except (TypeError, ValueError):
        to_json(record)  # raises a SchemaError with the field's path
        raise


def from_json(cls: type, data: Any, path: str = "") -> Any:
    """Decodes JSON values into `cls` (a schema dataclass), checking every field's type."""
    return _decode(cls, data, path or cls.__name__)


def event_to_json(event: schema.Event) -> dict:
    return to_json(event)


def event_from_json(data: Any, arrays: LLMArrays | None, path: str = "event") -> schema.Event:
    """Rebuilds an event; `arrays` must be given exactly when the event is an LLM call."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{path}: expected a JSON object")
    fields = dict(data)
    llm = fields.pop("llm", None)
    if (llm is None) != (arrays is None):
        raise SchemaError(f"{path}.llm: token streams and call metadata must come together")
    event = _decode(schema.Event, {**fields, "llm": None}, path, finalize=False)
    if llm is not None:
        llm_fields = _decode_fields(schema.LLMCall, llm, f"{path}.llm", skip=_LLM_ARRAY_FIELDS)
        event["llm"] = _construct(schema.LLMCall, {**llm_fields, **arrays._asdict()}, f"{path}.llm")
    return _construct(schema.Event, event, path)


def annotation_to_json(note: schema.Annotation) -> dict:
    tag = _ANNOTATION_TAGS.get(type(note))
    if tag is None:
        raise SchemaError(f"annotation: {type(note).__name__} is not an annotation record")
    return {"type": tag, **to_json(note)}


def annotation_from_json(data: Any, path: str = "annotation") -> schema.Annotation:
    if not isinstance(data, Mapping) or data.get("type") not in _TAG_TO_ANNOTATION:
        raise SchemaError(f"{path}.type: expected one of {sorted(_TAG_TO_ANNOTATION)}")
    fields = {k: v for k, v in data.items() if k != "type"}
    return _decode(_TAG_TO_ANNOTATION[data["type"]], fields, path)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON; the value must already be checked (`to_json`)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def loads(raw: bytes, path: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SchemaError(f"{path}: stored record is not valid JSON ({err})") from err


_Step = Callable[[Any, list], dict]


@functools.cache
def _encoder(cls: type) -> _Step:
    """A generated encoder for one dataclass (fields resolved once from its type hints).

    Generated source rather than a loop over fields: the writer encodes every event, and a
    straight-line function is several times faster. Fields equal to their default are left out
    (decoding fills them back in), which also keeps the stored payloads small.
    """
    hints = _hints(cls)
    env: dict[str, Any] = {"collect": collect_strings}
    body = ["def encode(r, s):", "    d = {}"]
    for i, field in enumerate(dataclasses.fields(cls)):
        if cls is schema.LLMCall and field.name in _LLM_ARRAY_FIELDS:
            continue
        var = f"v{i}"
        convert = _value_code(hints[field.name], var, env)
        body.append(f"    {var} = r.{field.name}")
        if field.default is not dataclasses.MISSING:
            env[f"default{i}"] = field.default
            body.append(f"    if {var} is not default{i} and {var} != default{i}:")
            body += [f"        {line}" for line in convert]
            body.append(f"        d[{field.name!r}] = {var}")
        elif field.default_factory is not dataclasses.MISSING:
            body += [f"    {line}" for line in convert]
            body.append(f"    if {var}:")
            body.append(f"        d[{field.name!r}] = {var}")
        else:
            body += [f"    {line}" for line in convert]
            body.append(f"    d[{field.name!r}] = {var}")
    body.append("    return d")
    exec("\n".join(body), env)
    return env["encode"]


def _value_code(tp: Any, var: str, env: dict[str, Any]) -> list[str]:
    """Statements turning `var` into its JSON value, appending its text to `s`."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return [f"if {var} is not None:", *(f"    {line}" for line in _value_code(inner, var, env))]
    if dataclasses.is_dataclass(tp):
        env[f"encode_{tp.__name__}"] = _encoder(tp)
        return [f"{var} = encode_{tp.__name__}({var}, s)"]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return [f"{var} = {var}.value"]
    if origin is tuple:
        (inner, _) = typing.get_args(tp)
        if dataclasses.is_dataclass(inner):
            env[f"encode_{inner.__name__}"] = _encoder(inner)
            return [f"{var} = [encode_{inner.__name__}(x, s) for x in {var}]"]
        return [f"collect({var}, s)", f"{var} = list({var})"]
    if tp in (int, float):  # numpy scalars pass validation but not json.dumps
        return [f"{var} = {tp.__name__}({var})"]
    if tp is str:
        return [f"s.append({var})"]
    if tp is bool:
        return []
    return [f"collect({var}, s)"]


def collect_strings(value: Any, out: list[str]) -> None:
    """Appends every string inside a JSON value (object keys included) to `out`."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                out.append(key)
            collect_strings(item, out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            collect_strings(item, out)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # resolved in the module that defines `cls`


def _decode_fields(cls: type, data: Any, path: str, skip: tuple[str, ...] = ()) -> dict:
    if not isinstance(data, Mapping):
        raise SchemaError(f"{path}: expected a JSON object, got {type(data).__name__}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    unknown = set(data) - names
    if unknown:
        raise SchemaError(f"{path}: unknown field(s) {sorted(unknown)} for {cls.__name__}")
    out = {}
    for field in dataclasses.fields(cls):
        if field.name not in names:
            continue
        if field.name in data:
            out[field.name] = _decode(hints[field.name], data[field.name], f"{path}.{field.name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{path}.{field.name}: required field is missing")
    return out


def _construct(cls: type, fields: dict, path: str) -> Any:
    try:
        return cls(**fields)
    except SchemaError as err:
        raise SchemaError(f"{path}: {err}") from err


def _decode(tp: Any, data: Any, path: str, finalize: bool = True) -> Any:
    if dataclasses.is_dataclass(tp):
        fields = _decode_fields(tp, data, path)
        return _construct(tp, fields, path) if finalize else fields
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(tp)
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, data, path)
    if origin is tuple:
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a JSON array, got {type(data).__name__}")
        (inner, _) = typing.get_args(tp)
        return tuple(_decode(inner, item, f"{path}[{i}]") for i, item in enumerate(data))
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(data)
        except ValueError:
            raise SchemaError(f"{path}: {data!r} is not one of {[m.value for m in tp]}") from None
    if tp is Any or origin is Mapping or tp is Mapping:
        return check_json_value(data, path)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SchemaError(f"{path}: expected a number, got {type(data).__name__}")
        return float(data)
    if tp in (int, str, bool):
        if type(data) is not tp:
            raise SchemaError(f"{path}: expected {tp.__name__}, got {type(data).__name__}")
        return data
    raise SchemaError(f"{path}: cannot decode type {tp}")


def trajectory_to_export(trajectory: schema.Trajectory) -> dict:
    """A self-contained JSON form of a trajectory (token streams as lists), for JSONL export."""
    events = []
    for event in trajectory.events:
        data = to_json(event)
        if event.llm is not None:
            data["llm"].update(
                {name: getattr(event.llm, name).tolist() for name in _LLM_ARRAY_FIELDS}
            )
        events.append(data)
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "header": to_json(trajectory.header),
        "events": events,
        "outcome": None if trajectory.outcome is None else to_json(trajectory.outcome),
        "annotations": [annotation_to_json(a) for a in trajectory.annotations],
    }


def trajectory_from_export(data: Any, path: str = "trajectory") -> schema.Trajectory:
    """Inverse of `trajectory_to_export`."""
    if not isinstance(data, Mapping):
        raise SchemaError(f"{path}: expected a JSON object")
    if data.get("schema_version") != schema.SCHEMA_VERSION:
        raise SchemaError(f"{path}.schema_version: expected {schema.SCHEMA_VERSION}")
    events = []
    for i, event in enumerate(data.get("events", [])):
        where = f"{path}.events[{i}]"
        arrays = None
        if isinstance(event, Mapping) and event.get("llm") is not None:
            llm = dict(event["llm"])
            dtypes = (np.int32, np.int32, np.float32, np.int32, np.int8)
            try:
                arrays = LLMArrays(
                    *(
                        np.asarray(llm.pop(n), d)
                        for n, d in zip(_LLM_ARRAY_FIELDS, dtypes, strict=True)
                    )
                )
            except (KeyError, TypeError, ValueError) as err:
                raise SchemaError(f"{where}.llm: bad or missing token stream ({err})") from err
            event = {**event, "llm": llm}
        events.append(event_from_json(event, arrays, where))
    outcome = data.get("outcome")
    return schema.Trajectory(
        header=from_json(schema.TrajectoryHeader, data.get("header"), f"{path}.header"),
        events=tuple(events),
        outcome=None if outcome is None else from_json(schema.Outcome, outcome, f"{path}.outcome"),
        annotations=tuple(
            annotation_from_json(a, f"{path}.annotations[{i}]")
            for i, a in enumerate(data.get("annotations", []))
        ),
    )
