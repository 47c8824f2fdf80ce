"""A deployed agent's composite policy `A = <pi, H, M, T, G>`, one immutable version of it.

The five parts, each a frozen dataclass with a JSON form and a content fingerprint:

- `PolicyRef` (pi): which policy the deployment means to run (a version label, a checkpoint);
  declarative: the worker records the policy version that actually sampled every token.
- `Harness` (H): a system prompt (prepended to the client's, or replacing it), instructions
  appended after it, tool-description overrides by tool name, and optionally `ReplyChoices`:
  the reply kept (by constrained decoding) to the options the last user message lists.
- `Memory` (M): notes with retrieval keys, each naming the trajectories it was learned from;
  `top_k` notes at most are retrieved into one conversation (`apply.py`).
- `Tools` (T): tool-schema overrides by tool name, each with its own version.
- `Governance` (G): the scope of the composite (its tenant only) and whether an update learned
  here may propagate to other tenants (default: no).

`CompositePolicy` is one version of a tenant's composite: the parts plus its version number,
its parent version and what made it (a put, a rollback). Fingerprints are 16 lowercase letters
of the sha256 of a part's canonical JSON, so equal content has equal fingerprints whatever the
version, and the ATDP redactor never mistakes one for a secret or a phone number.

JSON decoding (`*_from_json`) rejects unknown fields and wrong types with a `CompositeError`
that names the field, so a malformed composite never reaches the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from serving.common.errors import ApiError
from serving.common.openai_requests import MAX_REPLY_CHOICES
from serving.common.tool_specs import check_parameters

SYSTEM_MODES = ("prepend", "replace")
SCOPES = ("tenant",)
MAX_TOP_K = 64
_NOTE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class CompositeError(ValueError):
    """A composite (or part of one) that is malformed; the message names the field."""


def fingerprint(data: Any) -> str:
    """16 lowercase letters naming canonical JSON `data` (sha256, one letter per byte)."""
    raw = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    digest = hashlib.sha256(raw.encode()).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest[:16])


# ------------------------------------------------------------------------- field checks


def _object(data: Any, path: str, fields: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise CompositeError(f"{path}: expected a JSON object, got {type(data).__name__}")
    unknown = set(data) - fields
    if unknown:
        raise CompositeError(f"{path}: unknown field(s) {sorted(unknown)}; known: {sorted(fields)}")
    return data


def _str(data: Mapping, name: str, path: str, default: str = "") -> str:
    value = data.get(name, default)
    if not isinstance(value, str):
        raise CompositeError(f"{path}.{name}: expected a string, got {type(value).__name__}")
    return value


def _strings(data: Mapping, name: str, path: str) -> tuple[str, ...]:
    value = data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CompositeError(f"{path}.{name}: expected a list of strings")
    return tuple(value)


def _str_map(data: Mapping, name: str, path: str) -> dict[str, str]:
    value = data.get(name, {})
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise CompositeError(f"{path}.{name}: expected an object of tool name -> string")
    return dict(value)


# ------------------------------------------------------------------------- the five parts


@dataclasses.dataclass(frozen=True)
class PolicyRef:
    """pi: the policy this composite runs. version: a label ("3", "sao-step-1200"); checkpoint:
    where its weights are (empty: whatever the workers serve)."""

    version: str = ""
    checkpoint: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "checkpoint": self.checkpoint}

    @classmethod
    def from_json(cls, data: Any, path: str = "policy") -> PolicyRef:
        data = _object(data, path, {"version", "checkpoint"})
        return cls(_str(data, "version", path), _str(data, "checkpoint", path))


@dataclasses.dataclass(frozen=True)
class ReplyChoices:
    """Keeps each reply to one of the options the conversation's last user message lists,
    e.g. the admissible actions an env prompt ends with (enforced as the request's choice list:
    the worker's grammar mask, recorded with the call, so training sees the masked sampling).

    pattern: a regular expression with exactly one group, searched in the last user message's
      text; the group is the list. separator: what separates the options in it. template: the
      reply for one option, `{choice}` standing for it (e.g. `<action>{choice}</action>`).
    A message the pattern does not match, or one listing more options than a request's own
    choice list may (`MAX_REPLY_CHOICES`), leaves the reply free.
    """

    pattern: str
    separator: str = ", "
    template: str = "{choice}"

    def __post_init__(self):
        try:
            groups = re.compile(self.pattern).groups
        except re.error as error:
            raise CompositeError(f"harness.reply_choices.pattern: {error}") from None
        if groups != 1:
            raise CompositeError(
                f"harness.reply_choices.pattern needs exactly one group (the list), has {groups}"
            )
        if not self.separator:
            raise CompositeError("harness.reply_choices.separator must not be empty")
        if self.template.count("{choice}") != 1:
            raise CompositeError("harness.reply_choices.template needs '{choice}' exactly once")

    def options(self, text: str) -> tuple[str, ...] | None:
        """The options `text` lists (stripped, duplicates once), None if it lists none."""
        found = re.search(self.pattern, text)
        if found is None:
            return None
        options = [o.strip() for o in found.group(1).split(self.separator)]
        options = list(dict.fromkeys(o for o in options if o))
        return tuple(options) if 0 < len(options) <= MAX_REPLY_CHOICES else None

    def replies(self, text: str) -> tuple[str, ...] | None:
        """The replies allowed after a user message `text` (the template around each option)."""
        options = self.options(text)
        if options is None:
            return None
        return tuple(self.template.replace("{choice}", o) for o in options)

    def to_json(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "separator": self.separator, "template": self.template}

    @classmethod
    def from_json(cls, data: Any, path: str = "harness.reply_choices") -> ReplyChoices:
        data = _object(data, path, {"pattern", "separator", "template"})
        if "pattern" not in data:
            raise CompositeError(f"{path}.pattern is required")
        return cls(
            _str(data, "pattern", path),
            _str(data, "separator", path, ", "),
            _str(data, "template", path, "{choice}"),
        )


@dataclasses.dataclass(frozen=True)
class Harness:
    """H: the in-context harness.

    system_prompt: text put before the client's system message ("prepend") or instead of it
    ("replace"); instructions: paragraphs appended after it, in order; tool_descriptions: tool
    name -> the description the model sees instead of the client's; reply_choices: keep the
    reply to the options the last user message lists (`ReplyChoices`; None: free replies).
    """

    system_prompt: str = ""
    system_mode: str = "prepend"
    instructions: tuple[str, ...] = ()
    tool_descriptions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    reply_choices: ReplyChoices | None = None

    def __post_init__(self):
        if self.system_mode not in SYSTEM_MODES:
            raise CompositeError(
                f"harness.system_mode: {self.system_mode!r} is not one of {list(SYSTEM_MODES)}"
            )

    @property
    def edits_system(self) -> bool:
        return bool(self.system_prompt or self.instructions or self.system_mode == "replace")

    def to_json(self) -> dict[str, Any]:
        return {
            "system_prompt": self.system_prompt,
            "system_mode": self.system_mode,
            "instructions": list(self.instructions),
            "tool_descriptions": dict(sorted(self.tool_descriptions.items())),
            # only when set: harnesses without it keep the fingerprints they always had
            **(
                {}
                if self.reply_choices is None
                else {"reply_choices": self.reply_choices.to_json()}
            ),
        }

    @classmethod
    def from_json(cls, data: Any, path: str = "harness") -> Harness:
        fields = {"system_prompt", "system_mode", "instructions", "tool_descriptions"}
        data = _object(data, path, fields | {"reply_choices"})
        choices = data.get("reply_choices")
        return cls(
            _str(data, "system_prompt", path),
            _str(data, "system_mode", path, "prepend"),
            _strings(data, "instructions", path),
            _str_map(data, "tool_descriptions", path),
            None if choices is None else ReplyChoices.from_json(choices, f"{path}.reply_choices"),
        )


@dataclasses.dataclass(frozen=True)
class MemoryNote:
    """One memory note. keys: words or phrases whose occurrence in a conversation retrieves it
    (case-insensitive, whole words); created_from: ids of the trajectories it was learned from."""

    id: str
    text: str
    keys: tuple[str, ...]
    created_from: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.id, str) or not _NOTE_ID.match(self.id):
            raise CompositeError(
                f"memory.notes: id {self.id!r} must be 1-128 letters, digits or _.:-"
            )
        if not self.text.strip():
            raise CompositeError(f"memory.notes[{self.id}].text: must not be empty")
        if not self.keys or not all(k.strip() for k in self.keys):
            raise CompositeError(f"memory.notes[{self.id}].keys: needs non-empty keys")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "keys": list(self.keys),
            "created_from": list(self.created_from),
        }

    @classmethod
    def from_json(cls, data: Any, path: str) -> MemoryNote:
        data = _object(data, path, {"id", "text", "keys", "created_from"})
        if "id" not in data or "text" not in data:
            raise CompositeError(f"{path}: 'id' and 'text' are required")
        return cls(
            _str(data, "id", path),
            _str(data, "text", path),
            _strings(data, "keys", path),
            _strings(data, "created_from", path),
        )


@dataclasses.dataclass(frozen=True)
class Memory:
    """M: the notes, and how many at most are retrieved into one conversation."""

    notes: tuple[MemoryNote, ...] = ()
    top_k: int = 3

    def __post_init__(self):
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise CompositeError("memory.top_k: expected an integer")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise CompositeError(f"memory.top_k: must be 0 to {MAX_TOP_K}")
        ids = [n.id for n in self.notes]
        if len(set(ids)) != len(ids):
            raise CompositeError("memory.notes: note ids must be unique")

    def to_json(self) -> dict[str, Any]:
        return {"notes": [n.to_json() for n in self.notes], "top_k": self.top_k}

    @classmethod
    def from_json(cls, data: Any, path: str = "memory") -> Memory:
        data = _object(data, path, {"notes", "top_k"})
        notes = data.get("notes", [])
        if not isinstance(notes, list):
            raise CompositeError(f"{path}.notes: expected a list")
        return cls(
            tuple(MemoryNote.from_json(n, f"{path}.notes[{i}]") for i, n in enumerate(notes)),
            data.get("top_k", 3),
        )


@dataclasses.dataclass(frozen=True)
class ToolSchema:
    """One tool-schema override: the JSON-schema `parameters` the model sees, and its version."""

    version: str
    parameters: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "parameters": self.parameters}


@dataclasses.dataclass(frozen=True)
class Tools:
    """T: tool-schema overrides by tool name (applied only to tools the client exposes)."""

    schemas: Mapping[str, ToolSchema] = dataclasses.field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        return {name: s.version for name, s in sorted(self.schemas.items())}

    def to_json(self) -> dict[str, Any]:
        return {"schemas": {name: s.to_json() for name, s in sorted(self.schemas.items())}}

    @classmethod
    def from_json(cls, data: Any, path: str = "tools") -> Tools:
        data = _object(data, path, {"schemas"})
        schemas = data.get("schemas", {})
        if not isinstance(schemas, Mapping):
            raise CompositeError(f"{path}.schemas: expected an object of tool name -> schema")
        out = {}
        for name, entry in schemas.items():
            where = f"{path}.schemas[{name}]"
            if not name:
                raise CompositeError(f"{path}.schemas: tool names must not be empty")
            entry = _object(entry, where, {"version", "parameters"})
            version = _str(entry, "version", where)
            parameters = entry.get("parameters")
            if not version or not isinstance(parameters, Mapping):
                raise CompositeError(
                    f"{where}: needs a non-empty 'version' and 'parameters' (a JSON schema object)"
                )
            try:  # the same check a client's tool gets: the proxy must be able to use it
                check_parameters(parameters, f"{where}.parameters")
            except ApiError as error:
                raise CompositeError(error.message) from None
            out[name] = ToolSchema(version, dict(parameters))
        return cls(out)


@dataclasses.dataclass(frozen=True)
class Governance:
    """G: scope "tenant" (the composite serves its own tenant only); allow_cross_tenant: whether
    an update learned from this tenant's data may be proposed to other tenants (default no)."""

    scope: str = "tenant"
    allow_cross_tenant: bool = False

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise CompositeError(f"governance.scope: {self.scope!r} is not one of {list(SCOPES)}")

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "allow_cross_tenant": self.allow_cross_tenant}

    @classmethod
    def from_json(cls, data: Any, path: str = "governance") -> Governance:
        data = _object(data, path, {"scope", "allow_cross_tenant"})
        allow = data.get("allow_cross_tenant", False)
        if not isinstance(allow, bool):
            raise CompositeError(f"{path}.allow_cross_tenant: expected true or false")
        return cls(_str(data, "scope", path, "tenant"), allow)


PARTS = ("policy", "harness", "memory", "tools", "governance")


@dataclasses.dataclass(frozen=True)
class CompositeSpec:
    """The content of a composite: its five parts (no version)."""

    policy: PolicyRef = PolicyRef()
    harness: Harness = Harness()
    memory: Memory = Memory()
    tools: Tools = Tools()
    governance: Governance = Governance()

    def to_json(self) -> dict[str, Any]:
        return {part: getattr(self, part).to_json() for part in PARTS}

    @classmethod
    def from_json(cls, data: Any, path: str = "composite") -> CompositeSpec:
        data = _object(data, path, set(PARTS))
        decoders = {
            "policy": PolicyRef.from_json,
            "harness": Harness.from_json,
            "memory": Memory.from_json,
            "tools": Tools.from_json,
            "governance": Governance.from_json,
        }
        try:
            parts = {p: decoders[p](data[p], f"{path}.{p}") for p in PARTS if p in data}
        except CompositeError:
            raise
        except (TypeError, ValueError) as error:  # e.g. a dataclass check on a decoded field
            raise CompositeError(f"{path}: {error}") from None
        return cls(**parts)

    def fingerprints(self) -> dict[str, str]:
        """part -> fingerprint of its content."""
        return {part: fingerprint(getattr(self, part).to_json()) for part in PARTS}


@dataclasses.dataclass(frozen=True)
class CompositePolicy:
    """One version of a tenant's composite.

    version: 0 is the empty composite every tenant starts with (never stored); each put or
    rollback makes the next. parent: the version it was made from. rollback_of: for a
    rollback, the earlier version whose content it restores. reason: the operator's note.
    """

    tenant: str
    version: int
    spec: CompositeSpec
    parent: int | None = None
    created_at: float = 0.0
    reason: str = ""
    rollback_of: int | None = None

    @property
    def fingerprints(self) -> dict[str, str]:
        return self.spec.fingerprints()

    def attribution(self) -> dict[str, Any]:
        """What every ATDP event produced under this composite records (`metadata`)."""
        fp = self.fingerprints
        return {
            "version": self.version,
            "harness": fp["harness"],
            "memory": fp["memory"],
            "tools": self.spec.tools.versions(),
            "policy": self.spec.policy.version,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "version": self.version,
            "parent": self.parent,
            "created_at": self.created_at,
            "reason": self.reason,
            "rollback_of": self.rollback_of,
            "fingerprints": self.fingerprints,
            **self.spec.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any, path: str = "composite") -> CompositePolicy:
        head = {"tenant", "version", "parent", "created_at", "reason", "rollback_of"}
        data = _object(data, path, head | {"fingerprints"} | set(PARTS))
        spec = CompositeSpec.from_json({p: data[p] for p in PARTS if p in data}, path)
        return cls(
            tenant=data["tenant"],
            version=data["version"],
            spec=spec,
            parent=data.get("parent"),
            created_at=float(data.get("created_at", 0.0)),
            reason=data.get("reason", ""),
            rollback_of=data.get("rollback_of"),
        )


def diff(old: CompositePolicy, new: CompositePolicy) -> dict[str, Any]:
    """What changed from `old` to `new`, part by part: {part: {"from": json, "to": json}} for
    every part whose fingerprint differs (memory also as notes added / removed / changed)."""
    out: dict[str, Any] = {}
    a, b = old.fingerprints, new.fingerprints
    for part in PARTS:
        if a[part] == b[part]:
            continue
        before, after = getattr(old.spec, part).to_json(), getattr(new.spec, part).to_json()
        entry: dict[str, Any] = {"from": before, "to": after}
        if part == "memory":
            was = {n["id"]: n for n in before["notes"]}
            now = {n["id"]: n for n in after["notes"]}
            entry["notes_added"] = sorted(set(now) - set(was))
            entry["notes_removed"] = sorted(set(was) - set(now))
            entry["notes_changed"] = sorted(i for i in set(was) & set(now) if was[i] != now[i])
        out[part] = entry
    return {"from_version": old.version, "to_version": new.version, "changed": out}
