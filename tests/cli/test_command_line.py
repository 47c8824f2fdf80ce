"""The one command-line convention: both spellings, nesting, booleans, None, lists, positional
and remainder fields, flattened configs, subcommands, errors with suggestions, --help."""

import dataclasses

import pytest

from sao_jax.config_cli import ConfigError, parse_cli, parse_command, split_known


@dataclasses.dataclass
class Optim:
    """Optimiser.

    Attributes:
      lr: peak learning rate.
      betas: Adam's two decay rates.
    """

    lr: float = 3e-4
    betas: tuple[float, ...] = (0.9, 0.95)


@dataclasses.dataclass
class Job:
    """A job.

    Attributes:
      name: run name (kept verbatim: never a number or a bool).
      num_slots: requests decoded together.
      warmup: compile before serving.
      reprefill: recompute caches after a swap.
      max_staleness: staleness capacity (none: off).
      tags: free-form labels.
      seed: random seed.
    """

    name: str = "run"
    num_slots: int = 32
    warmup: bool = False
    reprefill: bool = True
    max_staleness: int | None = 4
    tags: list[str] = dataclasses.field(default_factory=list)
    seed: int = 0
    optim: Optim = dataclasses.field(default_factory=Optim)

    def __post_init__(self):
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")


def parse(*argv):
    return parse_cli(list(argv), Job, exit_on_error=False)


def printed_help(capsys, parser, *args, **kwargs) -> str:
    """What `parser(*args, **kwargs)` prints before it exits 0 (a --help)."""
    with pytest.raises(SystemExit) as exit_info:
        parser(*args, **kwargs)
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def help_rows(text: str) -> dict[str, list[str]]:
    """The --help table's rows by field name, split into words."""
    return {line.split()[0]: line.split() for line in text.splitlines() if line[:1].isalpha()}


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-slots", "4"],
        ["--num_slots", "4"],
        ["--num-slots=4"],
        ["num_slots=4"],
        ["num-slots=4"],
    ],
)
def test_every_spelling_sets_the_same_field(argv):
    assert parse(*argv) == Job(num_slots=4)


def test_nested_fields_in_both_spellings():
    expected = Job(optim=Optim(lr=1e-3, betas=(0.8, 0.9)))
    assert parse("--optim.lr", "1e-3", "--optim.betas", "0.8,0.9") == expected
    assert parse("optim.lr=1e-3", "optim.betas=[0.8,0.9]") == expected
    assert parse("--optim.lr=0.001", "--optim.betas=[0.8, 0.9]") == expected


def test_booleans():
    assert parse("--warmup").warmup is True
    assert parse("--no-reprefill").reprefill is False
    assert parse("--no_reprefill", "--reprefill").reprefill is True  # the last one wins
    assert parse("warmup=true", "reprefill=false") == Job(warmup=True, reprefill=False)
    assert parse("--warmup=yes").warmup is True
    with pytest.raises(ConfigError, match="warmup expects bool"):
        parse("warmup=perhaps")
    with pytest.raises(ConfigError, match="only a boolean field has a --no- form"):
        parse("--no-seed")


def test_none_strings_and_negative_numbers():
    assert parse("--max-staleness", "none").max_staleness is None
    assert parse("max_staleness=null").max_staleness is None
    assert parse("--seed", "-3").seed == -3
    # strings stay as typed: YAML would read these as an int, a bool and None
    assert parse("--name", "0x10").name == "0x10"
    assert parse("name=yes").name == "yes"
    assert parse("--name", "none").name == "none"  # `name` is not optional
    with pytest.raises(ConfigError, match="seed expects int"):
        parse("--seed", "none")


def test_lists_and_repeated_list_fields():
    assert parse("--tags", "a,b").tags == ["a", "b"]
    assert parse("--tags", "a", "--tags", "b", "tags=c").tags == ["a", "b", "c"]
    assert parse("tags=[x, y]").tags == ["x", "y"]
    assert parse("--tags", "").tags == []
    assert parse().tags == [] and Job().tags == []


def test_unknown_keys_and_options_suggest_the_closest():
    with pytest.raises(ConfigError, match=r"unknown option '--num-slot'.*Did you mean 'num_slots'"):
        parse("--num-slot", "3")
    with pytest.raises(ConfigError, match=r"(?s)Did you mean 'optim\.lr'\?\nValid keys: name,"):
        parse("optim.lrr=1")
    with pytest.raises(ConfigError, match=r"--seed needs a value"):
        parse("--seed")
    with pytest.raises(ConfigError, match=r"argument 'stray' is not key=value"):
        parse("stray")
    with pytest.raises(ConfigError, match="-- ends the options only for a command that runs"):
        parse("--", "ls")
    with pytest.raises(ConfigError, match="num_slots must be >= 1, got 0"):  # __post_init__
        parse("--num-slots", "0")


def test_errors_exit_2_with_a_pointer_to_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_cli(["--sead", "1"], Job, prog="job")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: unknown option '--sead'" in err and "Did you mean 'seed'" in err
    assert "(see job --help)" in err


@dataclasses.dataclass
class Copy:
    """copy a store

    Attributes:
      source: where from.
      dest: where to.
      dry_run: say what would be copied.
    """

    source: str = dataclasses.field(metadata={"positional": True})
    dest: str = dataclasses.field(metadata={"positional": True})
    dry_run: bool = False


@dataclasses.dataclass
class Launch:
    """run a command

    Attributes:
      workers: processes to start.
      command: what each runs.
    """

    workers: int = dataclasses.field(metadata={"help": "processes to start"})
    command: list[str] = dataclasses.field(default_factory=list, metadata={"remainder": True})


COMMANDS = {"copy": Copy, "launch": Launch}


def test_subcommands_positional_required_and_remainder_fields():
    assert parse_command(["copy", "gs://a/x=1", "/b", "--dry-run"], COMMANDS) == (
        "copy",
        Copy("gs://a/x=1", "/b", True),  # a URL with `=` is a value, not a key
    )
    assert parse_command(["copy", "--dest", "/b", "source=/a"], COMMANDS)[1] == Copy("/a", "/b")
    name, launch = parse_command(
        ["launch", "--workers", "2", "--", "python", "-m", "x", "--config", "big"], COMMANDS
    )
    assert (name, launch) == ("launch", Launch(2, ["python", "-m", "x", "--config", "big"]))
    with pytest.raises(ConfigError, match=r"workers is required \(give --workers VALUE\)"):
        parse_command(["launch", "--", "true"], COMMANDS, exit_on_error=False)
    with pytest.raises(ConfigError, match=r"unknown command 'cp'; choose one of \['copy', 'l"):
        parse_command(["cp", "a", "b"], COMMANDS, exit_on_error=False)
    with pytest.raises(ConfigError, match="give a command: copy, launch"):
        parse_command([], COMMANDS, exit_on_error=False)
    with pytest.raises(ConfigError, match=r"argument 'c' is not key=value"):
        parse_command(["copy", "a", "b", "c"], COMMANDS, exit_on_error=False)


def test_help_of_a_command_and_of_the_command_list(capsys):
    text = printed_help(
        capsys, parse_command, ["--help"], COMMANDS, prog="tool", description="Tools."
    )
    assert text.startswith("usage: tool {copy,launch} ...\n\nTools.\n")
    assert "  copy    copy a store\n  launch  run a command\n" in text
    text = printed_help(capsys, parse_command, ["copy", "-h"], COMMANDS, prog="tool")
    assert text.startswith("usage: tool copy SOURCE DEST [--key VALUE | key=VALUE ...]\n")
    rows = help_rows(text)
    assert rows["source"][1:3] == ["str", "(required)"]
    assert rows["dry_run"][1:4] == ["bool", "False", "say"]
    text = printed_help(capsys, parse_command, ["launch", "--help"], COMMANDS, prog="tool")
    assert "[-- COMMAND ...]" in text.splitlines()[0]


def test_help_lists_every_field_with_type_default_and_help(capsys):
    text = printed_help(capsys, parse_cli, ["--help"], Job, prog="job", description="Runs a job.")
    assert text.startswith("usage: job [--key VALUE | key=VALUE ...]\n\nRuns a job.\n")
    assert "--key VALUE, --key=VALUE or key=VALUE" in text
    rows = help_rows(text)
    for leaf in ("name", "num_slots", "warmup", "max_staleness", "tags", "optim.lr"):
        assert leaf in rows
    assert rows["max_staleness"][1:5] == ["int", "|", "None", "4"]
    assert rows["optim.lr"][1:] == ["float", "0.0003", "peak", "learning", "rate."]
    assert "(kept verbatim: never a number or a bool)" in text


@dataclasses.dataclass
class Outer:
    """A server with an inner part.

    Attributes:
      port: the outer port (the inner one's is passed on).
      inner: the inner part.
    """

    port: int = 80
    inner: Job = dataclasses.field(
        default_factory=Job, metadata={"flatten": True, "hide": ("seed",)}
    )


def test_a_flattened_config_answers_to_its_own_field_names(capsys):
    assert parse_cli(["--num-slots", "3", "--port", "1"], Outer) == Outer(1, Job(num_slots=3))
    assert parse_cli(["inner.optim.lr=0.1"], Outer).inner.optim.lr == 0.1
    assert parse_cli(["--optim.lr", "0.2"], Outer).inner.optim.lr == 0.2
    with pytest.raises(ConfigError, match="unknown option '--seed'"):  # hidden
        parse_cli(["--seed", "1"], Outer, exit_on_error=False)
    with pytest.raises(SystemExit):
        parse_cli(["--help"], Outer)
    fields = [
        line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()
    ]
    assert fields[fields.index("field") + 1 :] == [
        "port", "name", "num_slots", "warmup", "reprefill", "max_staleness", "tags", "optim.lr",
        "optim.betas",
    ]  # fmt: skip


def test_presets_keep_their_meaning_of_config_and_out(tmp_path):
    @dataclasses.dataclass
    class Run:
        out_dir: str = ""
        steps: int = 1

    presets = {"a": Run(steps=2), "b": Run(steps=3)}
    run = parse_cli(["--config", "b", "--out", str(tmp_path), "--steps", "5"], presets)
    assert run == Run(str(tmp_path), 5)
    assert "# overrides: out_dir=" in (tmp_path / "config.yaml").read_text()


def test_split_known_takes_only_the_named_keys():
    argv = ["--process-id", "1", "--config", "x", "num_processes=2", "--coordinator_address=h:1"]
    found, rest = split_known(argv, ["process_id", "num_processes", "coordinator_address"])
    assert found == ["process_id=1", "num_processes=2", "coordinator_address=h:1"]
    assert rest == ["--config", "x"]
    with pytest.raises(ConfigError, match="--process_id needs a value"):
        split_known(["--process_id"], ["process_id"])


def test_split_known_reads_named_switches_without_a_value():
    argv = ["--dry-run", "--no-run", "--create=false", "rl.rows=2", "--other"]
    found, rest = split_known(argv, ["dry_run", "run", "create"], switches=["dry_run", "run"])
    assert found == ["dry_run=true", "run=false", "create=false"]
    assert rest == ["rl.rows=2", "--other"]
    with pytest.raises(ConfigError, match="--create needs a value"):
        split_known(["--create"], ["create"])  # not named a switch: a value must follow


@dataclasses.dataclass
class WithOptionalPart:
    """
    Attributes:
      optim: an optimiser, or none for the default one.
    """

    optim: Optim | None = None


def test_an_optional_nested_config_is_built_from_one_of_its_fields():
    assert parse_cli([], WithOptionalPart).optim is None
    built = parse_cli(["--optim.lr", "0.5"], WithOptionalPart).optim
    assert built == Optim(lr=0.5)  # the rest from Optim's defaults
    assert parse_cli(["optim.lr=0.5", "optim=none"], WithOptionalPart).optim is None
    with pytest.raises(ConfigError, match=r"Did you mean 'optim\.lr'"):
        parse_cli(["optim.lrr=1"], WithOptionalPart, exit_on_error=False)


@dataclasses.dataclass
class Spec:
    """
    Attributes:
      path: where from.
      optim: its settings, spelled as the spec's own (`spec.lr`).
    """

    path: str = ""
    optim: Optim = dataclasses.field(default_factory=Optim, metadata={"flatten": True})


@dataclasses.dataclass
class Experiment:
    spec: Spec = dataclasses.field(default_factory=Spec)


def test_a_flattened_config_inside_a_nested_one_keeps_the_outer_prefix(capsys):
    config = parse_cli(["spec.lr=0.5", "--spec.betas", "0.1,0.2"], Experiment)
    assert config.spec.optim == Optim(lr=0.5, betas=(0.1, 0.2))
    assert parse_cli(["spec.optim.lr=0.25"], Experiment).spec.optim.lr == 0.25
    fields = list(help_rows(printed_help(capsys, parse_cli, ["--help"], Experiment)))
    assert fields[fields.index("field") + 1 :] == ["spec.path", "spec.lr", "spec.betas"]
