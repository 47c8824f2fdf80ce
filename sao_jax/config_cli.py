"""Typed experiment configs from the command line: presets, dotted overrides, config.yaml.

An experiment declares its config as (nested) dataclasses, names a few presets, and calls

    config = parse_cli(sys.argv[1:], {"tiny": TINY, "small": SMALL})

which understands

    --config NAME      start from preset NAME (default: the first preset)
    --out DIR          sets the config's `out_dir` field
    --resume           sets the config's `resume` field and starts from DIR/config.yaml
    key=value          override a field; nested fields as a.b.c=value; lists as k=[1,2]
    -h, --help         print the presets and every field with its type, default and help

Values are parsed as YAML and checked against the field types by omegaconf (int, float, bool,
str, Enum, Literal, Optional, list, tuple, dict, nested dataclasses). An unknown key or a value
of the wrong type stops with a message that names it and lists the valid keys. The resolved
config is written to `out_dir/config.yaml` (when the config has an `out_dir` field), headed by
the preset name and the overrides that produced it.

Field help comes from `field(metadata={"help": ...})` or from an `Attributes:` section of
the dataclass docstring.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

C = TypeVar("C")
CONFIG_FILE = "config.yaml"
OUT_FIELD, RESUME_FIELD = "out_dir", "resume"


class ConfigError(ValueError):
    """A bad command line, override, preset name or saved config."""


# -- reflection over the dataclass ------------------------------------------------------------


def _attribute_docs(cls: type) -> dict[str, str]:
    """`name: text` entries of the `Attributes:` section of a Google-style docstring."""
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    inside, current, indent = False, None, None
    for line in lines:
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


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        if issubclass(annotation, enum.Enum):
            return "{" + ", ".join(member.name for member in annotation) + "}"
        return annotation.__name__
    if typing.get_origin(annotation) is typing.Literal:
        return "{" + ", ".join(repr(a) for a in typing.get_args(annotation)) + "}"
    return str(annotation).replace("typing.", "")


def describe_fields(config: Any, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, current value, help) for every leaf field of a dataclass instance."""
    rows = []
    try:
        hints = typing.get_type_hints(type(config))
    except NameError:  # annotations naming classes local to a function
        hints = {f.name: f.type for f in dataclasses.fields(config)}
    docs = _attribute_docs(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        key = prefix + field.name
        if dataclasses.is_dataclass(value):
            rows.extend(describe_fields(value, key + "."))
            continue
        help_text = field.metadata.get("help", docs.get(field.name, ""))
        rows.append((key, _type_name(hints.get(field.name, Any)), value, help_text))
    return rows


# -- overrides and files ----------------------------------------------------------------------


def _structured(config: Any) -> Any:
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise ConfigError(f"expected a dataclass instance, got {type(config).__name__}")
    node = OmegaConf.structured(config)
    OmegaConf.set_readonly(node, False)  # frozen dataclasses are read-only nodes
    return node


def _key_error(key: str, config: Any, what: str) -> ConfigError:
    keys = [row[0] for row in describe_fields(config)]
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.8)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ConfigError(f"{what}: unknown key {key!r}.{hint}\nValid keys: {', '.join(keys)}")


def apply_overrides(config: C, overrides: Sequence[str]) -> C:
    """A copy of `config` with `key=value` / `a.b.c=value` overrides applied and type-checked."""
    node = _structured(config)
    for override in overrides:
        key, equals, _ = override.partition("=")
        if not equals or not key:
            raise ConfigError(f"override {override!r} is not key=value")
        try:
            node = OmegaConf.merge(node, OmegaConf.from_dotlist([override]))
        except (ConfigKeyError, ConfigAttributeError) as error:
            raise _key_error(key, config, f"override {override!r}") from error
        except OmegaConfBaseException as error:
            expected = dict((row[0], row[1]) for row in describe_fields(config)).get(key, "?")
            message = str(error).splitlines()[0]
            raise ConfigError(
                f"override {override!r}: {key} expects {expected}; {message}"
            ) from error
    try:
        return OmegaConf.to_object(node)
    except (ValueError, TypeError) as error:  # a dataclass __post_init__ refused the values
        raise ConfigError(f"overrides {list(overrides)}: {error}") from error


def config_to_yaml(config: Any, header: Sequence[str] = ()) -> str:
    """YAML text of a config, with optional `# ...` header lines."""
    comments = "".join(f"# {line}\n" for line in header)
    return comments + OmegaConf.to_yaml(_structured(config))


def load_config(path: str | os.PathLike, schema: C) -> C:
    """Read a config.yaml written by `parse_cli`, checked against `schema`'s dataclass."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    try:
        saved = OmegaConf.load(path)
        return OmegaConf.to_object(OmegaConf.merge(_structured(schema), saved))
    except (ConfigKeyError, ConfigAttributeError) as error:
        key = getattr(error, "full_key", None) or str(error)
        raise _key_error(str(key), schema, f"{path} no longer matches the config") from error
    except OmegaConfBaseException as error:
        raise ConfigError(f"{path}: {str(error).splitlines()[0]}") from error


def _saved_preset(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith("# preset: "):
            return line.removeprefix("# preset: ").strip()
    return None


# -- the command line -------------------------------------------------------------------------


@dataclasses.dataclass
class _Args:
    preset: str | None = None
    out: str | None = None
    resume: bool = False
    help: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)


def _split_argv(argv: Sequence[str]) -> _Args:
    args = _Args()
    items = list(argv)
    while items:
        item = items.pop(0)
        flag, equals, inline = item.partition("=")
        if item in ("-h", "--help"):
            args.help = True
        elif item == "--resume":
            args.resume = True
        elif flag in ("--config", "--out"):
            if not equals:
                if not items or items[0].startswith("-"):
                    raise ConfigError(f"{flag} needs a value")
                inline = items.pop(0)
            if flag == "--config":
                args.preset = inline
            else:
                args.out = inline
        elif item.startswith("-"):
            raise ConfigError(
                f"unknown option {item!r}; options are --config, --out, --resume, --help "
                "(set fields as key=value)"
            )
        elif equals:
            args.overrides.append(item)
        else:
            raise ConfigError(f"argument {item!r} is not key=value")
    return args


def format_help(presets: Mapping[str, Any], preset: str, prog: str, description: str) -> str:
    """The --help text: usage, presets, and every field of `preset` with type and default."""
    from tabulate import tabulate

    rows = [
        (key, kind, value.name if isinstance(value, enum.Enum) else repr(value), text)
        for key, kind, value, text in describe_fields(presets[preset])
    ]
    return (
        f"usage: {prog} [--config NAME] [--out DIR] [--resume] [key=value ...]\n\n"
        + (f"{description}\n\n" if description else "")
        + f"presets: {', '.join(presets)} (showing {preset!r})\n\n"
        + tabulate(rows, headers=["field", "type", "default", "help"], tablefmt="simple")
        + "\n"
    )


def parse_cli(
    argv: Sequence[str] | None,
    presets: Mapping[str, C],
    *,
    prog: str | None = None,
    description: str = "",
    save: bool = True,
    exit_on_error: bool = True,
) -> C:
    """Resolve a config from presets and the command line (see the module docstring).

    Args:
      argv: arguments without the program name (None: `sys.argv[1:]`).
      presets: name -> config instance, all of one dataclass type; the first is the default.
      save: write `out_dir/config.yaml` when the config has an `out_dir`.
      exit_on_error: print the error and exit with status 2 (as argparse does) instead of
        raising ConfigError.
    Raises:
      SystemExit(0) after printing help for -h / --help.
    """
    try:
        return _parse(argv, presets, prog, description, save)
    except ConfigError as error:
        if not exit_on_error:
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from error


def _parse(
    argv: Sequence[str] | None,
    presets: Mapping[str, C],
    prog: str | None,
    description: str,
    save: bool,
) -> C:
    if not presets:
        raise ConfigError("parse_cli needs at least one preset")
    kinds = {type(p).__name__ for p in presets.values()}
    if len(kinds) != 1:
        raise ConfigError(f"presets must share one dataclass type, got {sorted(kinds)}")
    args = _split_argv(sys.argv[1:] if argv is None else argv)
    name = args.preset or next(iter(presets))
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}; choose one of {list(presets)}")
    prog = prog or Path(sys.argv[0]).name
    if args.help:
        print(format_help(presets, name, prog, description), end="")
        raise SystemExit(0)

    base = presets[name]
    field_names = {f.name for f in dataclasses.fields(base)}
    overrides = list(args.overrides)
    for flag, field, value in (
        ("--out", OUT_FIELD, args.out),
        ("--resume", RESUME_FIELD, args.resume),
    ):
        if value:
            if field not in field_names:
                raise ConfigError(f"{flag} needs a field {field!r} in {type(base).__name__}")
            overrides.insert(0, f"{field}={value if field == OUT_FIELD else 'true'}")

    config = apply_overrides(base, overrides)
    out_dir = getattr(config, OUT_FIELD, None)
    saved = Path(out_dir) / CONFIG_FILE if out_dir else None
    if getattr(config, RESUME_FIELD, False) and saved is not None and saved.is_file():
        saved_preset = _saved_preset(saved)
        if args.preset and saved_preset and args.preset != saved_preset:
            raise ConfigError(
                f"{out_dir} holds a run of preset {saved_preset!r}, not {args.preset!r}; "
                "drop --config to resume it or choose another --out"
            )
        name = saved_preset or name
        # the saved run's config, with this command's overrides on top
        config = apply_overrides(load_config(saved, base), overrides)
    if save and saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        header = [f"preset: {name}", f"overrides: {' '.join(overrides) or '(none)'}"]
        saved.write_text(config_to_yaml(config, header))
    return config
