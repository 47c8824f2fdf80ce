"""Typed dataclass configs as data: their fields, docs, overrides and YAML form.

The command line (`sao_jax.config_cli`) is built on these; they are also what a program uses
to change a config in code (`apply_overrides(config, ["model.width=128"])`) or to read back a
saved `config.yaml` (`load_config`).

A config is a (nested) dataclass, given as an instance (its values are the defaults) or as the
class (its field defaults; a field without one is required). Values are checked against the
field types by omegaconf (int, float, bool, str, Enum, Literal, Optional, list, tuple, dict,
nested dataclasses) and the dataclass's `__post_init__` runs on the result. Field help comes
from `field(metadata={"help": ...})` or the `Attributes:` section of the class docstring (the
one docstring parser of the project's commands).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import operator
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

C = TypeVar("C")
REQUIRED = "(required)"  # the default shown for a field without one
_NONE_WORDS = ("none", "null", "~")
_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")


class ConfigError(ValueError):
    """A bad command line, override, preset name or saved config."""


# -- reflection -------------------------------------------------------------------------------


def attribute_docs(cls: type) -> dict[str, str]:
    """`name: text` entries of the `Attributes:` sections of a class's Google-style docstring
    and its bases' (the class's own entry wins); an entry's continuation lines (indented
    deeper) are joined to it."""
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        docs.update(_docstring_attributes(base.__doc__ or ""))
    return docs


def _docstring_attributes(docstring: str) -> dict[str, str]:
    docs: dict[str, str] = {}
    inside, current, indent = False, None, None
    for line in docstring.splitlines():
        stripped = line.strip()
        if stripped == "Attributes:":
            inside, indent = True, None
            continue
        if not inside:
            continue
        if not stripped:
            current = None
            continue
        line_indent = len(line) - len(line.lstrip())
        if indent is None:
            indent = line_indent
        if line_indent < indent:
            break
        name, colon, text = stripped.partition(":")
        if line_indent == indent and colon and name.isidentifier():
            current = name
            docs[name] = text.strip()
        elif current is not None:
            docs[current] += " " + stripped
    return docs


def _optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else functools.reduce(operator.or_, args)), True
    return annotation, False


def type_name(annotation: Any) -> str:
    """How --help names a field's type: `int`, `{A, B}` for enums / literals, `str | None`."""
    base, optional = _optional(annotation)
    if optional:
        return f"{type_name(base)} | None"
    if isinstance(base, type) and not typing.get_args(base):
        if issubclass(base, enum.Enum):
            return "{" + ", ".join(member.name for member in base) + "}"
        return base.__name__
    if typing.get_origin(base) is typing.Literal:
        return "{" + ", ".join(repr(a) for a in typing.get_args(base)) + "}"
    return str(base).replace("typing.", "")


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One settable field: its dotted key, type, default (or REQUIRED), help and metadata;
    `name` is how it is set and shown (the key, or its own name inside a flattened config)."""

    key: str
    annotation: Any
    default: Any
    help: str
    metadata: typing.Mapping[str, Any]
    name: str = ""

    @property
    def is_bool(self) -> bool:
        return _optional(self.annotation)[0] is bool

    @property
    def is_sequence(self) -> bool:
        return typing.get_origin(_optional(self.annotation)[0]) in (list, tuple)

    @property
    def is_mapping(self) -> bool:
        return typing.get_origin(_optional(self.annotation)[0]) is dict


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except NameError:  # annotations naming classes local to a function
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _field_default(config: Any, field: dataclasses.Field) -> Any:
    if not isinstance(config, type):
        return getattr(config, field.name)
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return REQUIRED


def leaves(config: Any, prefix: str = "", short: str | None = None) -> list[Leaf]:
    """Every leaf field of a dataclass instance or class, nested dataclasses flattened.

    A nested config whose field has `metadata={"flatten": True}` also answers to its own
    field names in the place of its own (`--num-slots` for `worker.num_slots`,
    `model.d_model` for `model.config.d_model`); a field that the outer config also has
    is left out (the outer one is the setting, the outer config passes it on), and so are the
    names in `metadata["hide"]` (fields that mean nothing there).
    """
    cls = config if isinstance(config, type) else type(config)
    hints, docs, rows = _hints(cls), attribute_docs(cls), []
    own = {field.name for field in dataclasses.fields(cls)}
    for field in dataclasses.fields(cls):
        annotation = hints.get(field.name, Any)
        value = _field_default(config, field)
        if value is REQUIRED and dataclasses.is_dataclass(annotation):
            value = annotation  # a nested config without a default: its own field defaults
        name = short + field.name if short is not None else prefix + field.name
        base, optional = _optional(annotation)
        help_text = field.metadata.get("help", docs.get(field.name, ""))
        if optional and dataclasses.is_dataclass(base):
            # an optional nested config: settable as a whole (`none`) or field by field
            # (setting one of its fields builds it from its defaults)
            rows.append(
                Leaf(prefix + field.name, annotation, value, help_text, field.metadata, name)
            )
            value = base if value is None else value
        if dataclasses.is_dataclass(value):
            flat = field.metadata.get("flatten", False)
            if flat:  # its fields sit where it sits: `model.d_model` for model.config.d_model
                inner_short = name.removesuffix(field.name)
            else:
                inner_short = name + "." if short is not None else None
            inner_prefix = prefix + field.name + "."
            inner = leaves(value, inner_prefix, inner_short)
            hidden = set(field.metadata.get("hide", ()))
            rows.extend(
                row
                for row in inner
                if row.key.removeprefix(inner_prefix).split(".")[0] not in hidden
                and not (flat and row.name in own)
            )
            continue
        rows.append(Leaf(prefix + field.name, annotation, value, help_text, field.metadata, name))
    return rows


def by_name(rows: Sequence[Leaf]) -> dict[str, Leaf]:
    """Leaves by dotted key and by short name (a flattened config's fields)."""
    return {**{row.key: row for row in rows}, **{row.name: row for row in rows}}


def describe_fields(config: Any, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every leaf field of a dataclass instance or class."""
    return [(r.name, type_name(r.annotation), r.default, r.help) for r in leaves(config, prefix)]


def show_default(value: Any) -> str:
    if value is REQUIRED:
        return REQUIRED
    return value.name if isinstance(value, enum.Enum) else repr(value)


# -- values and overrides ---------------------------------------------------------------------


def is_key(text: str) -> bool:
    """Whether `text` can name a field (`a.b_c`, `a.b-c`); a path or URL cannot."""
    return _KEY.fullmatch(text) is not None


def normal_key(text: str) -> str:
    """`-` and `_` are the same in names: `num-slots` is `num_slots`."""
    return text.replace("-", "_")


def parse_value(text: str, leaf: Leaf | None) -> Any:
    """The Python value of `text` for `leaf` (omegaconf then checks it against the type).

    `none` / `null` is None for an optional field; strings stay verbatim (a key `0x10` or
    `yes` is not a number or a bool); a list or tuple takes `[a, b]` (YAML) or `a,b`; anything
    else is read as YAML (numbers, bools, enum names, dicts).
    """
    annotation = Any if leaf is None else leaf.annotation
    base, optional = _optional(annotation)
    stripped = text.strip()
    if optional and stripped.lower() in _NONE_WORDS:
        return None
    if base is str and not (len(stripped) > 1 and stripped[0] == stripped[-1] in "'\""):
        return text
    if leaf is not None and leaf.is_sequence and not stripped.startswith("["):
        items = [part.strip() for part in text.split(",") if part.strip()]
        element = typing.get_args(base)[0] if typing.get_args(base) else Any
        if element is str:
            return items
        return [_yaml(item) for item in items]
    return _yaml(text)


def _yaml(text: str) -> Any:
    # omegaconf's YAML reader (it reads 1e-3 as a float, unlike plain PyYAML)
    return OmegaConf.to_container(OmegaConf.from_dotlist([f"value={text}"]))["value"]


def structured(config: Any) -> Any:
    """The writable omegaconf node of a dataclass instance or class."""
    if not dataclasses.is_dataclass(config):
        raise ConfigError(f"expected a dataclass, got {type(config).__name__}")
    node = OmegaConf.structured(config)
    OmegaConf.set_readonly(node, False)  # frozen dataclasses are read-only nodes
    return node


def unknown_key(key: str, config: Any, what: str) -> ConfigError:
    """An error naming `key`, the closest valid keys and every valid key."""
    keys = [leaf.name for leaf in leaves(config)]
    close = difflib.get_close_matches(normal_key(key), keys, n=3, cutoff=0.7)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ConfigError(f"{what}: unknown key {key!r}.{hint}\nValid keys: {', '.join(keys)}")


def find_leaf(key: str, by_key: typing.Mapping[str, Leaf]) -> tuple[str, Leaf | None] | None:
    """(the field's dotted key, its leaf) for `key` in either spelling; the leaf is None for a
    key inside a dict-typed field (`tags.color`); None when nothing matches."""
    key = normal_key(key)
    if key in by_key:
        return by_key[key].key, by_key[key]
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        owner = by_key.get(".".join(parts[:cut]))
        if owner is not None and owner.is_mapping:
            return key, None
    return None


def set_value(node: Any, key: str, value: Any, config: Any, spelled: str) -> Any:
    """`node` with `key` set to `value`, type-checked (a ConfigError names `spelled`)."""
    nested: Any = value
    for part in reversed(key.split(".")):
        nested = {part: nested}
    try:
        return OmegaConf.merge(node, nested)
    except (ConfigKeyError, ConfigAttributeError) as error:
        raise unknown_key(key, config, spelled) from error
    except OmegaConfBaseException as error:
        expected = by_name(leaves(config)).get(key)
        kind = type_name(expected.annotation) if expected else "?"
        message = str(error).splitlines()[0]
        raise ConfigError(f"{spelled}: {key} expects {kind}; {message}") from error


def build(node: Any, what: str, config: Any) -> Any:
    """The dataclass instance of `node`, a node of `config` (its `__post_init__` checks run
    here; a required field left unset is named as it is set)."""
    try:
        return OmegaConf.to_object(node)
    except MissingMandatoryValue as error:
        key = str(getattr(error, "full_key", "") or error)
        name = next((row.name for row in leaves(config) if row.key == key), key)
        raise ConfigError(f"{what}: {name} is required (give --{name} VALUE)") from error
    except (ValueError, TypeError) as error:  # a dataclass __post_init__ refused the values
        raise ConfigError(f"{what}: {error}") from error


def apply_overrides(config: C, overrides: Sequence[str]) -> C:
    """A copy of `config` (instance or class) with `key=value` / `a.b.c=value` overrides
    applied and type-checked."""
    node, by_key = structured(config), by_name(leaves(config))
    for override in overrides:
        key, equals, text = override.partition("=")
        if not equals or not key:
            raise ConfigError(f"override {override!r} is not key=value")
        found = find_leaf(key, by_key)
        if found is None:
            raise unknown_key(key, config, f"override {override!r}")
        node = set_value(
            node, found[0], parse_value(text, found[1]), config, f"override {override!r}"
        )
    return build(node, f"overrides {list(overrides)}", config)


# -- files ------------------------------------------------------------------------------------


def config_to_yaml(config: Any, header: Sequence[str] = ()) -> str:
    """YAML text of a config, with optional `# ...` header lines."""
    comments = "".join(f"# {line}\n" for line in header)
    return comments + OmegaConf.to_yaml(structured(config))


def load_config(path: str | os.PathLike, schema: C, *, sections: Sequence[str] | None = None) -> C:
    """Read a config.yaml written by `parse_cli`, checked against `schema`'s dataclass.
    `sections`: read only these top-level keys of the file (the rest of the result is
    `schema`'s), e.g. to compare a few settings with another job's run, whose file may hold
    sections this schema does not know."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    try:
        saved = OmegaConf.load(path)
        if sections is not None:
            saved = OmegaConf.masked_copy(saved, [k for k in sections if k in saved])
        return OmegaConf.to_object(OmegaConf.merge(structured(schema), saved))
    except (ConfigKeyError, ConfigAttributeError) as error:
        key = getattr(error, "full_key", None) or str(error)
        raise unknown_key(str(key), schema, f"{path} no longer matches the config") from error
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path}: {str(error).splitlines()[0]}") from error
