"""The command line of every command: a typed dataclass config from presets and `argv`.

A command declares its config as a (nested) dataclass and calls one of

    config = parse_cli(argv, {"tiny": TINY, "small": SMALL})   # presets (instances)
    config = parse_cli(argv, ServerConfig)                      # the class's field defaults
    name, config = parse_command(argv, {"inspect": Inspect, "export": Export})  # subcommands

which all understand the same command line:

    --key VALUE, --key=VALUE, key=VALUE
                       set a field; `-` and `_` are the same in names (--num-slots,
                       num_slots=); nested fields as a.b.c (--model.width 64)
    --x / --no-x       booleans (also x=true, --x=false)
    none               the value None of an optional field (--max-staleness none)
    a,b or [a,b]       lists and tuples; a list field given twice collects both values
    PATH               a positional field (`metadata={"positional": True}`), in order
    -- ARG ...         the rest of the line, for a `metadata={"remainder": True}` field
    --config NAME      start from preset NAME (default: the first); without presets, the
                       field whose metadata names the flag "--config" (e.g. a model preset)
    --out DIR          the `out_dir` field (when the config has no field `out`)
    -h, --help         usage, presets, and every field with its type, default and help

A nested config field with `metadata={"flatten": True}` answers to its own field names
(`python -m serving --num-slots 4` sets `worker.num_slots`); see `config_fields.leaves`.

Field types and `__post_init__` checks are those of `sao_jax.config_fields`. An unknown key
or a value of the wrong type stops with a message that names it, suggests the closest keys
and lists the valid ones. With presets and an `out_dir` field, the resolved config is written
to `out_dir/config.yaml`, headed by the preset and the overrides that produced it;
`--resume` (a `resume` field) starts from that file.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sao_jax.config_fields import (
    ConfigError,
    Leaf,
    apply_overrides,
    build,
    by_name,
    config_to_yaml,
    describe_fields,
    find_leaf,
    is_key,
    leaves,
    load_config,
    normal_key,
    parse_value,
    set_value,
    show_default,
    structured,
    type_name,
    unknown_key,
)

__all__ = [
    "ConfigError",
    "apply_overrides",
    "config_to_yaml",
    "describe_fields",
    "format_help",
    "load_config",
    "parse_cli",
    "parse_command",
    "split_known",
]

C = TypeVar("C")
CONFIG_FILE = "config.yaml"
OUT_FIELD, RESUME_FIELD = "out_dir", "resume"
HELP_WIDTH = 64  # columns of the help text before it wraps
SYNTAX = (
    "Set a field as --key VALUE, --key=VALUE or key=VALUE (`-` and `_` alike; nested a.b.c);\n"
    "booleans --x / --no-x; `none` for an optional field; lists a,b or [a,b]."
)


# -- splitting the command line ---------------------------------------------------------------


@dataclasses.dataclass
class _Line:
    """A command line split into its parts; `pairs` are (key, value text, as spelled)."""

    preset: str | None = None
    help: bool = False
    pairs: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _Splitter:
    """Turns `argv` into (key, value) pairs against the fields of one config."""

    def __init__(self, config: Any, presets: bool):
        self.config = config
        self.presets = presets
        self.leaves = leaves(config)
        self.by_key = by_name(self.leaves)
        self.flags = {
            leaf.metadata["flag"]: leaf.key for leaf in self.leaves if "flag" in leaf.metadata
        }
        self.positional = [leaf.key for leaf in self.leaves if leaf.metadata.get("positional")]
        self.remainder = next((x.key for x in self.leaves if x.metadata.get("remainder")), None)

    def split(self, argv: Sequence[str]) -> _Line:
        line, items, positional = _Line(), list(argv), list(self.positional)
        while items:
            item = items.pop(0)
            if item in ("-h", "--help"):
                line.help = True
            elif item == "--":
                if self.remainder is None:
                    raise ConfigError("-- ends the options only for a command that runs one")
                line.pairs.append((self.remainder, items, "--"))
                items = []
            elif item.startswith("--") and len(item) > 2:
                self._option(item, items, line)
            elif item.startswith("-") and not _is_number(item):
                raise self._unknown_option(item)
            else:
                key, equals, text = item.partition("=")
                if equals and is_key(key):
                    line.pairs.append((key, text, f"override {item!r}"))
                elif equals and not key:
                    raise ConfigError(f"override {item!r} is not key=value")
                elif positional:
                    line.pairs.append((positional.pop(0), item, f"argument {item!r}"))
                else:
                    raise ConfigError(f"argument {item!r} is not key=value")
        return line

    def _option(self, item: str, items: list[str], line: _Line) -> None:
        flag, equals, text = item.partition("=")
        if not equals:
            text = None
        if self.presets and flag == "--config":
            line.preset = self._value(flag, text, items)
            return
        key, negated = self._flag_key(flag)
        if key is None:
            raise self._unknown_option(item)
        leaf = self.by_key.get(key)
        if leaf is not None and leaf.is_bool and text is None:
            text = "false" if negated else "true"
        elif negated:
            raise ConfigError(f"{flag}: only a boolean field has a --no- form")
        text = self._value(flag, text, items)
        line.pairs.append((key, text, f"option {flag}"))

    def _flag_key(self, flag: str) -> tuple[str | None, bool]:
        if flag in self.flags:
            return self.flags[flag], False
        name = normal_key(flag[2:])
        if flag == "--out" and "out" not in self.by_key and OUT_FIELD in self.by_key:
            return OUT_FIELD, False
        found = find_leaf(name, self.by_key) if is_key(name) else None
        if found is not None:
            return found[0], False
        if name.startswith("no_"):
            found = find_leaf(name[3:], self.by_key)
            if found is not None:
                return found[0], True  # `_option` refuses it unless the field is a bool
        return None, False

    @staticmethod
    def _value(flag: str, text: str | None, items: list[str]) -> str:
        if text is not None:
            return text
        if not items or (items[0].startswith("-") and not _is_number(items[0])):
            raise ConfigError(f"{flag} needs a value")
        return items.pop(0)

    def _unknown_option(self, item: str) -> ConfigError:
        flag = item.partition("=")[0]
        for special, field in (("--out", OUT_FIELD), ("--resume", RESUME_FIELD)):
            if flag == special and self.presets:
                kind = type(self.config).__name__
                return ConfigError(f"{flag} needs a field {field!r} in {kind}")
        return unknown_key(flag.lstrip("-"), self.config, f"unknown option {item!r}")


def _apply(config: Any, pairs: Sequence[tuple[str, Any, str]], what: str) -> Any:
    """`config` with the pairs set (a list field given twice collects both values)."""
    node, by_key, seen = structured(config), by_name(leaves(config)), {}
    for key, text, spelled in pairs:
        found = find_leaf(key, by_key)
        if found is None:
            raise unknown_key(key, config, spelled)
        key, leaf = found
        value = list(text) if isinstance(text, list) else parse_value(text, leaf)
        if leaf is not None and leaf.is_sequence and key in seen and isinstance(value, list):
            value = [*seen[key], *value]
        seen[key] = value
        node = set_value(node, key, value, config, spelled)
    return build(node, what, config)


def split_known(
    argv: Sequence[str], keys: Sequence[str], *, switches: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """(`key=value` overrides of the given top-level keys found in `argv`, the other items).

    For a command that hands part of its line to another config (e.g. the multi-process
    flags): `--key VALUE`, `--key=VALUE` and `key=VALUE` are recognised in either spelling;
    the boolean keys named in `switches` also as `--key` / `--no-key` (no value follows).
    """
    wanted = {normal_key(k) for k in keys}
    flags = {normal_key(k) for k in switches}
    found, rest, items = [], [], list(argv)
    while items:
        item = items.pop(0)
        name, equals, text = item.removeprefix("--").partition("=")
        if item.startswith("--") and not equals:
            if normal_key(name) in flags:
                found.append(f"{normal_key(name)}=true")
                continue
            if name.startswith(("no-", "no_")) and normal_key(name[3:]) in flags:
                found.append(f"{normal_key(name[3:])}=false")
                continue
        if normal_key(name) in wanted and (item.startswith("--") or equals):
            if not equals:
                if not items:
                    raise ConfigError(f"{item} needs a value")
                text = items.pop(0)
            found.append(f"{normal_key(name)}={text}")
        else:
            rest.append(item)
    return found, rest


# -- help -------------------------------------------------------------------------------------


def _usage(prog: str, config: Any, presets: bool) -> str:
    rows = leaves(config)
    parts = [prog]
    if presets:
        parts.append("[--config NAME]")
    if presets and any(r.key == OUT_FIELD for r in rows):
        parts.append("[--out DIR]")
    parts += [r.name.upper() for r in rows if r.metadata.get("positional")]
    parts.append("[--key VALUE | key=VALUE ...]")
    parts += [f"[-- {r.name.upper()} ...]" for r in rows if r.metadata.get("remainder")]
    return "usage: " + " ".join(parts)


def _help_text(row: Leaf) -> str:
    text = row.help
    if "flag" in row.metadata:
        text = f"{text} (also {row.metadata['flag']})".strip()
    return text


def format_help(
    presets: Mapping[str, Any] | Any, preset: str | None, prog: str, description: str
) -> str:
    """The --help text: usage, presets, and every field with type, default and help."""
    from tabulate import tabulate

    has_presets = isinstance(presets, Mapping)
    config = presets[preset] if has_presets else presets
    rows = [
        (
            row.name,
            type_name(row.annotation),
            show_default(row.default),
            textwrap.fill(_help_text(row), HELP_WIDTH),
        )
        for row in leaves(config)
    ]
    head = f"presets: {', '.join(presets)} (showing {preset!r})\n\n" if has_presets else ""
    return (
        _usage(prog, config, has_presets)
        + "\n\n"
        + (f"{description.strip()}\n\n" if description.strip() else "")
        + head
        + SYNTAX
        + "\n\n"
        + tabulate(rows, headers=["field", "type", "default", "help"], tablefmt="simple")
        + "\n"
    )


# -- entry points -----------------------------------------------------------------------------


def _exit_on_error(exit_on_error: bool, run: Callable[[], C], prog: str | None) -> C:
    try:
        return run()
    except ConfigError as error:
        if not exit_on_error:
            raise
        name = prog or Path(sys.argv[0]).name
        print(f"error: {error}\n(see {name} --help)", file=sys.stderr)
        raise SystemExit(2) from error


def parse_cli(
    argv: Sequence[str] | None,
    presets: Mapping[str, C] | type[C],
    *,
    prog: str | None = None,
    description: str = "",
    save: bool = True,
    exit_on_error: bool = True,
) -> C:
    """Resolve a config from presets (or a dataclass's defaults) and the command line.

    Args:
      argv: arguments without the program name (None: `sys.argv[1:]`).
      presets: name -> config instance, all of one dataclass type, the first the default; or
        a dataclass class, whose field defaults are the only preset.
      save: write `out_dir/config.yaml` when presets are given and the config has `out_dir`;
        an `out_dir` that already holds files of a run (anything besides config.yaml) is
        refused unless the config's `resume` is set (which loads the saved config, with the
        command line's settings on top).
      exit_on_error: print the error and exit with status 2 (as argparse does) instead of
        raising ConfigError.
    Raises:
      SystemExit(0) after printing help for -h / --help.
    """
    return _exit_on_error(
        exit_on_error, lambda: _parse(argv, presets, prog, description, save), prog
    )


def parse_command(
    argv: Sequence[str] | None,
    commands: Mapping[str, type],
    *,
    prog: str | None = None,
    description: str = "",
    exit_on_error: bool = True,
) -> tuple[str, Any]:
    """(command name, its config) for `PROG COMMAND [fields...]`: each command is a dataclass
    class whose docstring's first line is its summary in `PROG --help`."""

    def run() -> tuple[str, Any]:
        items = list(sys.argv[1:] if argv is None else argv)
        name = prog or Path(sys.argv[0]).name
        if not items or items[0] in ("-h", "--help"):
            if items:
                print(_commands_help(commands, name, description), end="")
                raise SystemExit(0)
            raise ConfigError(f"give a command: {', '.join(commands)}")
        command = items.pop(0)
        if command not in commands:
            raise ConfigError(f"unknown command {command!r}; choose one of {list(commands)}")
        cls = commands[command]
        summary = (cls.__doc__ or "").strip().split("\n\n")[0]
        return command, _parse(items, cls, f"{name} {command}", summary, save=False)

    return _exit_on_error(exit_on_error, run, prog)


def _commands_help(commands: Mapping[str, type], prog: str, description: str) -> str:
    width = max(len(name) for name in commands)
    lines = [
        f"  {name:<{width}}  {(cls.__doc__ or '').strip().splitlines()[0]}"
        for name, cls in commands.items()
    ]
    return (
        f"usage: {prog} {{{','.join(commands)}}} ...\n\n"
        + (f"{description.strip()}\n\n" if description.strip() else "")
        + "commands:\n"
        + "\n".join(lines)
        + f"\n\n`{prog} COMMAND --help` lists a command's fields.\n"
    )


def _parse(
    argv: Sequence[str] | None,
    presets: Mapping[str, C] | type[C],
    prog: str | None,
    description: str,
    save: bool,
) -> C:
    has_presets = isinstance(presets, Mapping)
    if has_presets:
        if not presets:
            raise ConfigError("parse_cli needs at least one preset")
        kinds = {type(p).__name__ for p in presets.values()}
        if len(kinds) != 1:
            raise ConfigError(f"presets must share one dataclass type, got {sorted(kinds)}")
    elif not (isinstance(presets, type) and dataclasses.is_dataclass(presets)):
        raise ConfigError(f"parse_cli needs presets or a dataclass, got {presets!r}")
    schema = next(iter(presets.values())) if has_presets else presets
    line = _Splitter(schema, has_presets).split(sys.argv[1:] if argv is None else argv)
    name = (line.preset or next(iter(presets))) if has_presets else None
    if has_presets and name not in presets:
        raise ConfigError(f"unknown preset {name!r}; choose one of {list(presets)}")
    prog = prog or Path(sys.argv[0]).name
    if line.help:
        print(format_help(presets, name, prog, description), end="")
        raise SystemExit(0)
    base = presets[name] if has_presets else presets
    pairs = line.pairs
    overrides = [f"{k}={v}" for k, v, _ in pairs]
    what = f"overrides {overrides}" if has_presets and overrides else prog
    config = _apply(base, pairs, what)
    if not has_presets:
        return config
    out_dir = getattr(config, OUT_FIELD, None)
    saved = Path(out_dir) / CONFIG_FILE if out_dir else None
    resume = getattr(config, RESUME_FIELD, False)
    earlier = _earlier_run_files(saved) if save and not resume and saved is not None else []
    if earlier:
        # a fresh run there would add its episodes, checkpoints and metrics to the earlier
        # run's (or fail half-way on an ATDP id that exists): refuse before touching anything.
        # A directory holding only config.yaml (a command refused before it ran) is reused.
        hint = "continue it with --resume, " if hasattr(config, RESUME_FIELD) else ""
        raise ConfigError(
            f"{out_dir} already holds a run ({', '.join(earlier)}); {hint}choose another "
            "--out, or delete the directory to start over"
        )
    if resume and saved is not None and saved.is_file():
        saved_preset = _saved_preset(saved)
        if line.preset and saved_preset and line.preset != saved_preset:
            raise ConfigError(
                f"{out_dir} holds a run of preset {saved_preset!r}, not {line.preset!r}; "
                "drop --config to resume it or choose another --out"
            )
        name = saved_preset or name
        # the saved run's config, with this command's settings on top
        config = _apply(load_config(saved, base), pairs, what)
    if save and saved is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        header = [f"preset: {name}", f"overrides: {' '.join(overrides) or '(none)'}"]
        saved.write_text(config_to_yaml(config, header))
    return config


def _earlier_run_files(saved: Path, shown: int = 4) -> list[str]:
    """What the run directory of `saved` (its config.yaml) holds besides that file, sorted
    (the first `shown` names, then how many more)."""
    if not saved.parent.is_dir():
        return []
    names = sorted(p.name for p in saved.parent.iterdir() if p.name != saved.name)
    return names[:shown] + ([f"{len(names) - shown} more"] if len(names) > shown else [])


def _saved_preset(path: Path) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith("# preset: "):
            return line.removeprefix("# preset: ").strip()
    return None
