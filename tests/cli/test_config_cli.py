"""parse_cli: presets, typed dotted overrides, --out / --resume, --help, config.yaml, errors."""

import dataclasses
import enum
import tempfile
from typing import Literal

import pytest

from sao_jax.config_cli import (
    ConfigError,
    apply_overrides,
    config_to_yaml,
    describe_fields,
    load_config,
    parse_cli,
)


class Dispatch(enum.Enum):
    CAPACITY = "capacity"
    RAGGED = "ragged"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Model shape.

    Attributes:
      width: hidden size,
        in units.
      experts: number of experts.
    """

    width: int = 64
    experts: int = 4
    dispatch: Dispatch = Dispatch.CAPACITY
    layer_types: tuple[str, ...] = ("moe", "moe")


@dataclasses.dataclass
class OptimConfig:
    lr: float = dataclasses.field(default=3e-4, metadata={"help": "peak learning rate"})
    schedule: Literal["cosine", "constant"] = "cosine"


@dataclasses.dataclass
class RunConfig:
    out_dir: str = "runs/default"
    resume: bool = False
    seed: int = 0
    policy_steps: int = 100
    algo: str = "sao"
    max_staleness: int | None = None
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    eval_splits: list[str] = dataclasses.field(default_factory=lambda: ["valid_seen"])


PRESETS = {
    "tiny": RunConfig(),
    "small": RunConfig(policy_steps=1000, model=ModelConfig(width=256, experts=8)),
}


def parse(argv, tmp_path=None, **kwargs):
    if tmp_path is not None and not any(a.startswith("--out") for a in argv):
        # a fresh directory per call: one that holds a run is refused without --resume
        argv = ["--out", tempfile.mkdtemp(dir=tmp_path), *argv]
    return parse_cli(argv, PRESETS, exit_on_error=False, **kwargs)


def test_default_preset_and_named_preset(tmp_path):
    assert parse([], tmp_path).policy_steps == 100
    small = parse(["--config", "small"], tmp_path)
    assert (small.policy_steps, small.model.width) == (1000, 256)
    named = parse(["--config=small"], tmp_path)
    assert dataclasses.replace(named, out_dir=small.out_dir) == small


def test_typed_nested_overrides(tmp_path):
    config = parse(
        [
            "optim.lr=1e-3",
            "model.experts=16",
            "model.dispatch=RAGGED",
            "seed=3",
            "model.layer_types=[dense,moe,moe]",
            "max_staleness=2",
            "eval_splits=[a,b]",
            "optim.schedule=constant",
            "algo=grpo",
        ],
        tmp_path,
    )
    assert isinstance(config, RunConfig) and isinstance(config.model, ModelConfig)
    assert config.optim.lr == 1e-3 and config.model.experts == 16 and config.seed == 3
    assert config.model.dispatch is Dispatch.RAGGED
    assert config.model.layer_types == ("dense", "moe", "moe")
    assert config.max_staleness == 2 and config.eval_splits == ["a", "b"]
    assert config.optim.schedule == "constant" and config.algo == "grpo"
    assert PRESETS["tiny"].model.experts == 4  # presets are never mutated


def test_out_writes_resolved_config_yaml(tmp_path):
    config = parse(["--out", str(tmp_path / "x"), "policy_steps=7"])
    assert config.out_dir == str(tmp_path / "x")
    text = (tmp_path / "x" / "config.yaml").read_text()
    assert text.startswith("# preset: tiny\n# overrides: out_dir=")
    assert "policy_steps=7" in text.splitlines()[1]
    assert load_config(tmp_path / "x" / "config.yaml", PRESETS["tiny"]) == config


def test_a_fresh_run_into_a_directory_that_holds_one_is_refused_and_changes_nothing(tmp_path):
    out = str(tmp_path / "run")
    parse(["--out", out, "seed=5"])
    # only config.yaml (a command refused before it ran): a corrected command reuses the dir
    assert parse(["--out", out, "seed=6"]).seed == 6
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')  # the run went on
    saved = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"already holds a run \(metrics.jsonl\).*--resume"):
        parse(["--out", out, "seed=7"])
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # not overwritten
    assert parse(["--out", out, "--resume"]).seed == 6  # resuming it is what works
    assert parse(["--out", out], save=False).seed == 0  # reading without writing is allowed


def test_resume_starts_from_the_saved_config(tmp_path):
    out = str(tmp_path / "run")
    first = parse(["--config", "small", "--out", out, "seed=5", "model.dispatch=RAGGED"])
    resumed = parse(["--out", out, "--resume", "policy_steps=2000"])
    assert resumed.resume is True
    assert resumed.seed == 5 and resumed.model.width == 256  # from the saved run
    assert resumed.model.dispatch is Dispatch.RAGGED
    assert resumed.policy_steps == 2000  # this command's override on top
    assert dataclasses.replace(resumed, resume=False, policy_steps=first.policy_steps) == first
    with pytest.raises(ConfigError, match="holds a run of preset 'small', not 'tiny'"):
        parse(["--config", "tiny", "--out", out, "--resume"])
    fresh = parse(["--out", str(tmp_path / "new"), "--resume"])  # nothing saved yet: the preset
    assert fresh.resume and fresh.policy_steps == 100


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["polcy_steps=5"], r"unknown key 'polcy_steps'\. Did you mean 'policy_steps'\?"),
        (["model.expert=5"], r"(?s)Did you mean 'model\.experts'\?\nValid keys: out_dir, resume"),
        (["policy_steps=many"], r"policy_steps expects int"),
        (["policy_steps=1.5"], r"policy_steps expects int"),
        (["resume=perhaps"], r"resume expects bool"),
        (["optim.schedule=linear"], r"optim\.schedule expects \{'cosine', 'constant'\}"),
        (["model.dispatch=DENSE"], r"model\.dispatch expects \{CAPACITY, RAGGED\}"),
        (["--config", "huge"], r"unknown preset 'huge'; choose one of \['tiny', 'small'\]"),
        (["--verbose"], r"unknown option '--verbose'"),
        (["steps"], r"argument 'steps' is not key=value"),
        (["=3"], r"override '=3' is not key=value"),
        (["--config"], r"--config needs a value"),
    ],
)
def test_bad_command_lines_are_named(tmp_path, argv, match):
    with pytest.raises(ConfigError, match=match):
        parse(argv, tmp_path)


def test_errors_exit_with_status_2_by_default(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_cli(["--out", str(tmp_path), "nope=1"], PRESETS)
    assert exit_info.value.code == 2
    assert "error: override 'nope=1': unknown key 'nope'" in capsys.readouterr().err


def test_out_and_resume_need_their_fields():
    @dataclasses.dataclass
    class Bare:
        steps: int = 1

    with pytest.raises(ConfigError, match="--out needs a field 'out_dir' in Bare"):
        parse_cli(["--out", "x"], {"only": Bare()}, exit_on_error=False)
    assert parse_cli(["steps=4"], {"only": Bare()}, exit_on_error=False) == Bare(steps=4)
    with pytest.raises(ConfigError, match="share one dataclass type"):
        parse_cli([], {"a": Bare(), "b": RunConfig()}, exit_on_error=False)


def test_help_lists_presets_and_fields_with_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_cli(["--config", "small", "--help"], PRESETS, prog="alfworld_sao")
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: alfworld_sao [--config NAME]")
    assert "presets: tiny, small (showing 'small')" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line and line[0].isalpha()}
    assert "256" in lines["model.width"] and "hidden size, in units." in lines["model.width"]
    assert "peak learning rate" in lines["optim.lr"] and "0.0003" in lines["optim.lr"]
    assert lines["model.dispatch"].split()[1:3] == ["{CAPACITY,", "RAGGED}"]
    assert lines["model.dispatch"].split()[3] == "CAPACITY"


def test_yaml_round_trip_and_stale_saved_config(tmp_path):
    config = apply_overrides(PRESETS["small"], ["model.layer_types=[dense]"])
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(config, ["preset: small"]))
    assert load_config(path, PRESETS["tiny"]) == config
    path.write_text(path.read_text() + "removed_field: 3\n")
    with pytest.raises(ConfigError, match="no longer matches the config: unknown key"):
        load_config(path, PRESETS["tiny"])
    with pytest.raises(FileNotFoundError, match="no config file"):
        load_config(tmp_path / "absent.yaml", PRESETS["tiny"])
    # sections=: only those top-level keys are read; the unknown one is ignored, the rest of
    # the result is the schema's
    partial = load_config(path, PRESETS["tiny"], sections=["model", "absent_section"])
    assert partial.model == config.model and partial.optim == PRESETS["tiny"].optim
    assert partial.model != PRESETS["tiny"].model
    path.write_text(path.read_text() + "model_extra: 1\n")
    with pytest.raises(ConfigError, match="unknown key"):  # a read section is still checked
        load_config(path, PRESETS["tiny"], sections=["model_extra"])


def test_describe_fields_covers_every_leaf():
    keys = [row[0] for row in describe_fields(PRESETS["tiny"])]
    assert keys[:3] == ["out_dir", "resume", "seed"]
    assert "model.layer_types" in keys and "optim.schedule" in keys and "model" not in keys


def test_real_model_config_nests_and_validates():
    from sao_jax.models import ModelConfig, get_model_config

    @dataclasses.dataclass
    class Experiment:
        model: ModelConfig = dataclasses.field(default_factory=lambda: get_model_config("tiny"))

    config = apply_overrides(Experiment(), ["model.num_experts=8", "model.dense_layers=[0]"])
    assert config.model == get_model_config("tiny", num_experts=8, dense_layers=(0,))
    with pytest.raises(ConfigError, match="num_heads must be positive"):  # its __post_init__
        apply_overrides(Experiment(), ["model.num_heads=0"])
