"""Mean +- std over seeds of `experiments.alfworld_sao` runs: held-out curve, start -> end, control.

    python -m experiments.compare_runs "groups=[default=runs/fl_s*]"
    python -m experiments.compare_runs "groups=[entropy=runs/ent_s*,default=runs/fl_s*]" \\
        control=runs/ctl100_s* out=runs/compare
    python -m experiments.compare_runs "groups=[default=runs/fl_s*]" split=valid_seen window=25

Each group is NAME=GLOB: the run directories the glob matches (relative to the current
directory, sorted), one a seed, finished or still running. Per group it prints

1. the greedy curve on `split`: per policy step at which the runs evaluated
   (`eval.every_policy_steps`), each run's success (%) and the mean +- std over runs of the
   gain over their start, in points (100 x (success - start)); step 0 is the start;
2. start -> end on valid_unseen and valid_seen, per run and mean +- std of the gain (finished
   runs: those with a summary.json);
3. with `control=GLOB`: each run against the control run of its seed, per window of `window`
   RL iterations the mean rollout success (`batch/success_rate`) of the run minus the control's,
   in points, and mean +- std over the group's runs (complete windows only).

std is the sample standard deviation (n - 1); one run shows its value alone. Writes
OUT/compare.png (mean gain per policy step, one line per group, +- std band), OUT/compare.json
(every number printed) and OUT/compare.md (the tables).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from yaml import YAMLError  # omegaconf's parser (a dependency of omegaconf)

from sao_jax.config_cli import parse_cli
from sao_jax.metrics.seeds import eval_curve, format_mean_std, gains, mean_std, windowed_differences
from sao_jax.metrics.summary import SUMMARY_FILE, json_ready, summary_table
from sao_jax.metrics.writer import METRICS_FILE, decode_value, read_metrics

PROG = "python -m experiments.compare_runs"
START_END_SPLITS = ("valid_unseen", "valid_seen")
POINTS = 100.0


class CompareError(Exception):
    """Input the comparison cannot use (reported as one line, exit status 2)."""


@dataclasses.dataclass
class CompareRunsConfig:
    """Runs of several seeds, grouped, as mean +- std over seeds.

    Attributes:
      groups: NAME=GLOB entries, one a group (e.g. `[entropy=runs/ent_s*,default=runs/fl_s*]`);
        the glob names run directories of `experiments.alfworld_sao`.
      control: a glob of control runs (e.g. a learning rate of ~0), one a seed; each run is
        compared with the control run of its seed (empty: no control table).
      split: the split of the greedy curve.
      window: RL iterations a window of the control comparison spans.
      out: where compare.png, compare.json and compare.md go.
    """

    groups: tuple[str, ...] = ()
    control: str = ""
    split: str = "valid_unseen"
    window: int = 50
    out: str = "runs/compare_runs"

    def __post_init__(self):
        if not self.groups:
            raise ValueError("groups is empty: give groups=[NAME=GLOB,...]")
        names = []
        for entry in self.groups:
            name, equals, pattern = entry.partition("=")
            if not equals or not name.strip() or not pattern.strip():
                raise ValueError(f"groups entry {entry!r} is not NAME=GLOB")
            names.append(name.strip())
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"groups names {repeated} more than one group")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")

    def group_globs(self) -> dict[str, str]:
        """Group name -> glob, in the order given."""
        pairs = (entry.partition("=") for entry in self.groups)
        return {name.strip(): pattern.strip() for name, _, pattern in pairs}


@dataclasses.dataclass
class Run:
    """One run directory: its metrics records, summary.json (None: still running) and seed."""

    path: Path
    records: list[dict[str, Any]]
    summary: dict[str, Any] | None
    seed: int | None
    from_run: str | None
    label: str = ""  # its column in the tables: the directory's name, its path if not unique

    def __post_init__(self):
        self.label = self.label or self.path.name


def label_uniquely(runs: list[Run]) -> list[Run]:
    """`runs`, each labelled by its directory's name, or by its path where two names agree
    (e.g. `runs/a/seed0` and `runs/b/seed0`), so no run's column hides another's."""
    names = [run.path.name for run in runs]
    return [
        dataclasses.replace(run, label=str(run.path) if names.count(run.path.name) > 1 else "")
        for run in runs
    ]


def start_key(split: str, tag: str = "start") -> str:
    """summary.json's success key of `split` (`valid_unseen` -> `unseen_success_start`)."""
    return f"{split.removeprefix('valid_')}_success_{tag}"


def read_summary(path: Path) -> dict[str, Any] | None:
    file = path / SUMMARY_FILE
    if not file.is_file():
        return None
    try:
        summary = json.loads(file.read_text())
    except ValueError as error:
        raise CompareError(f"{file} is not JSON: {error}") from None
    return {key: decode_value(value) for key, value in summary.items()}


def read_config(path: Path) -> dict[str, Any]:
    file = path / "config.yaml"
    if not file.is_file():
        return {}
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(file))
    except (OmegaConfBaseException, YAMLError, ValueError) as error:
        raise CompareError(f"{file} is not a readable config: {error}") from None
    return loaded if isinstance(loaded, dict) else {}


def load_run(path: Path) -> Run:
    if not (path / METRICS_FILE).is_file():
        raise CompareError(f"{path} holds no {METRICS_FILE} (not an experiments.alfworld_sao run)")
    try:
        records = read_metrics(path)
    except ValueError as error:
        raise CompareError(str(error)) from None
    summary, config = read_summary(path), read_config(path)
    seed = summary.get("seed") if summary else None
    if seed is None:
        seed = config.get("seed")
    from_run = (config.get("warm_start") or {}).get("from_run")
    return Run(path, records, summary, seed if isinstance(seed, int) else None, from_run)


def expand(pattern: str, what: str) -> list[Path]:
    """The directories `pattern` matches, sorted; CompareError when none."""
    paths = [Path(p) for p in sorted(glob.glob(pattern)) if Path(p).is_dir()]
    if not paths:
        raise CompareError(f"{what} {pattern!r} matches no directory")
    return paths


def run_start(run: Run, split: str) -> float | None:
    """Success on `split` before RL: summary.json's, else the run's start evaluation, else that
    of the run it took its warm start from (`warm_start.from_run`); None when none is known."""
    key = start_key(split)
    if run.summary and isinstance(run.summary.get(key), int | float):
        return float(run.summary[key])
    own = eval_curve(run.records, split).get(0)
    if own is not None or not run.from_run or not Path(run.from_run).is_dir():
        return own
    source = Path(run.from_run)
    summary = read_summary(source)
    if summary and isinstance(summary.get(key), int | float):
        return float(summary[key])
    if (source / METRICS_FILE).is_file():
        return eval_curve(read_metrics(source), split).get(0)
    return None


def pair_controls(groups: Mapping[str, list[Run]], controls: list[Run]) -> dict[Path, Run]:
    """Each run's control run (the one of its seed); CompareError when one is missing."""
    by_seed: dict[int, Run] = {}
    for control in controls:
        if control.seed is None:
            raise CompareError(f"control {control.path}: no seed in summary.json or config.yaml")
        if control.seed in by_seed:
            raise CompareError(
                f"controls {by_seed[control.seed].path} and {control.path} share seed "
                f"{control.seed}"
            )
        by_seed[control.seed] = control
    pairs = {}
    for runs in groups.values():
        for run in runs:
            if run.seed is None:
                raise CompareError(f"{run.path}: no seed in summary.json or config.yaml")
            if run.seed not in by_seed:
                raise CompareError(
                    f"{run.path} (seed {run.seed}) has no control run of its seed among "
                    f"{[str(c.path) for c in controls]}"
                )
            pairs[run.path] = by_seed[run.seed]
    return pairs


def _aggregate(values: Sequence[float], scale: float = POINTS, signed: bool = True) -> dict:
    mean, std = mean_std(values)
    return {
        "n": len(values),
        "mean": mean * scale,
        "std": std * scale,
        "text": format_mean_std(values, scale=scale, signed=signed),
    }


def curve_section(runs: list[Run], split: str) -> tuple[dict, list[str]]:
    """The greedy curve of a group: per run success per policy step, per step the mean gain."""
    per_run, notes = {}, []
    for run in runs:
        start = run_start(run, split)
        if start is None:
            notes.append(f"{run.path}: no start success on {split} known; left out of the curve")
            continue
        per_run[run.label] = dict(sorted({**eval_curve(run.records, split), 0: start}.items()))
    rises = {label: gains(curve, curve[0]) for label, curve in per_run.items()}
    rows = []
    for step in sorted({step for curve in per_run.values() for step in curve}):
        have = {label: curve[step] for label, curve in per_run.items() if step in curve}
        rise = [rises[label][step] for label in have]
        rows.append({"policy_step": step, "success": have, "gain": _aggregate(rise)})
    return {"runs": per_run, "steps": rows}, notes


def start_end_section(runs: list[Run]) -> tuple[dict, list[str]]:
    """Start -> end per run and mean +- std per split, over the runs with a summary.json."""
    finished = [run for run in runs if run.summary is not None]
    notes = [
        f"{run.path}: no {SUMMARY_FILE} yet (still running?); left out of start -> end"
        for run in runs
        if run.summary is None
    ]
    per_run: dict[str, dict] = {}
    splits: dict[str, dict] = {}
    for split in START_END_SPLITS:
        starts, ends, rises = [], [], []
        for run in finished:
            start = run.summary.get(start_key(split))
            end = run.summary.get(start_key(split, "end"))
            if not isinstance(start, int | float) or not isinstance(end, int | float):
                continue
            per_run.setdefault(run.label, {"seed": run.seed})[split] = {
                "start": start,
                "end": end,
                "gain": (end - start) * POINTS,
            }
            starts.append(start)
            ends.append(end)
            rises.append(end - start)
        if rises:
            splits[split] = {
                "start": _aggregate(starts, signed=False),
                "end": _aggregate(ends, signed=False),
                "gain": _aggregate(rises),
            }
    return {"runs": per_run, "splits": splits}, notes


def control_section(runs: list[Run], controls: Mapping[Path, Run], window: int) -> dict:
    """Per window of RL iterations, each run's rollout success minus its control's (points)."""
    per_run = {
        run.label: {
            "control": str(controls[run.path].path),
            "seed": run.seed,
            "differences": [
                d * POINTS
                for d in windowed_differences(run.records, controls[run.path].records, window)
            ],
        }
        for run in runs
    }
    count = max((len(r["differences"]) for r in per_run.values()), default=0)
    windows = []
    for index in range(count):
        values = [
            r["differences"][index] for r in per_run.values() if len(r["differences"]) > index
        ]
        windows.append(
            {"iterations": [index * window, (index + 1) * window], **_aggregate(values, scale=1.0)}
        )
    return {"runs": per_run, "windows": windows}


# -- tables, plot, files ------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{value * POINTS:.1f}"


def _curve_rows(curve: dict) -> list[dict]:
    labels = list(curve["runs"])
    return [
        {
            "policy step": row["policy_step"],
            **{
                label: _pct(row["success"][label]) if label in row["success"] else ""
                for label in labels
            },
            "gain (points)": row["gain"]["text"],
            "n": row["gain"]["n"],
        }
        for row in curve["steps"]
    ]


def _start_end_rows(start_end: dict) -> list[dict]:
    rows = []
    for label, run in start_end["runs"].items():
        row = {"run": label, "seed": run["seed"]}
        for split in START_END_SPLITS:
            if split in run:
                short = split.removeprefix("valid_")
                row[f"{short} start"] = _pct(run[split]["start"])
                row[f"{short} end"] = _pct(run[split]["end"])
                row[f"{short} gain"] = f"{run[split]['gain']:+z.1f}"
        rows.append(row)
    mean_row = {"run": "mean +- std", "seed": ""}
    for split, aggregate in start_end["splits"].items():
        short = split.removeprefix("valid_")
        for column in ("start", "end", "gain"):
            mean_row[f"{short} {column}"] = aggregate[column]["text"]
    return [*rows, mean_row]


def _control_rows(control: dict) -> list[dict]:
    rows = []
    for index, aggregate in enumerate(control["windows"]):
        first, last = aggregate["iterations"]
        row = {"RL iterations": f"{first}-{last}"}
        for label, run in control["runs"].items():
            differences = run["differences"]
            row[label] = f"{differences[index]:+z.1f}" if len(differences) > index else ""
        rows.append({**row, "over control (points)": aggregate["text"], "n": aggregate["n"]})
    return rows


def tables(name: str, result: dict, split: str, window: int) -> list[tuple[str, list[dict]]]:
    """(title, rows) of each table of one group (those it has data for)."""
    out = []
    if result["curve"]["steps"]:
        title = f"{name}: greedy success on {split} (%) and gain over start"
        out.append((title, _curve_rows(result["curve"])))
    if result["start_end"]["splits"]:
        title = f"{name}: start -> end success (%), gain in points"
        out.append((title, _start_end_rows(result["start_end"])))
    control = result.get("control")
    if control is not None and control["windows"]:
        title = f"{name}: rollout success minus the control's, per {window} RL iterations"
        out.append((title, _control_rows(control)))
    return out


def plot(results: Mapping[str, dict], split: str, path: Path) -> None:
    """compare.png: mean greedy gain per policy step, one line per group, +- std band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    for index, (name, result) in enumerate(results.items()):
        rows = result["curve"]["steps"]
        if not rows:
            continue
        steps = np.asarray([row["policy_step"] for row in rows])
        mean = np.asarray([row["gain"]["mean"] for row in rows])
        std = np.asarray([row["gain"]["std"] for row in rows])
        color = f"C{index % 10}"
        runs = len(result["curve"]["runs"])
        ax.plot(steps, mean, color=color, marker="o", markersize=4, label=f"{name} (n={runs})")
        band = np.isfinite(std)
        ax.fill_between(steps, mean - std, mean + std, where=band, color=color, alpha=0.2)
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    ax.set_xlabel("policy step")
    ax.set_ylabel(f"greedy success gain on {split} (points)")
    ax.set_title("mean +- std over seeds (sample std)", fontsize=10)
    ax.grid(alpha=0.3)
    if results:
        ax.legend(fontsize=8)
    figure.savefig(path, dpi=110)


def render(blocks: list[tuple[str, list[dict]]], notes: list[str], tablefmt: str) -> str:
    markdown = tablefmt == "github"
    parts = []
    for title, rows in blocks:
        parts.append(f"### {title}\n" if markdown else f"{title}\n")
        parts.append(summary_table(rows, tablefmt=tablefmt, numparse=False) + "\n")
    if notes:
        parts.append("\n".join(("- " if markdown else "note: ") + note for note in notes) + "\n")
    std = "std: sample standard deviation over runs (n - 1); one run: its value alone.\n"
    return "\n".join(parts) + "\n" + std


def compare(config: CompareRunsConfig) -> dict:
    """Read every run, compute the tables; CompareError on input it cannot use."""
    groups = {
        name: label_uniquely([load_run(path) for path in expand(pattern, f"group {name}:")])
        for name, pattern in config.group_globs().items()
    }
    controls = {}
    if config.control:
        control_runs = [load_run(path) for path in expand(config.control, "control")]
        controls = pair_controls(groups, control_runs)
    results, notes = {}, []
    for name, runs in groups.items():
        curve, curve_notes = curve_section(runs, config.split)
        start_end, start_end_notes = start_end_section(runs)
        results[name] = {
            "runs": [str(run.path) for run in runs],
            "curve": curve,
            "start_end": start_end,
        }
        if controls:
            results[name]["control"] = control_section(runs, controls, config.window)
        notes += curve_notes + start_end_notes
    return {
        "split": config.split,
        "window": config.window,
        "control": config.control or None,
        "groups": results,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> dict:
    config = parse_cli(argv, CompareRunsConfig, prog=PROG, description=__doc__.split("\n")[0])
    try:
        result = compare(config)
    except CompareError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    blocks = [
        block
        for name, group in result["groups"].items()
        for block in tables(name, group, config.split, config.window)
    ]
    text = render(blocks, result["notes"], "simple")
    print(text, end="")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(
        "# Runs compared: mean +- std over seeds\n\n" + render(blocks, result["notes"], "github")
    )
    (out / "compare.json").write_text(
        json.dumps(json_ready(result), indent=1, allow_nan=False) + "\n"
    )
    plot(result["groups"], config.split, out / "compare.png")
    print(f"\nwrote {out / 'compare.png'}, compare.json, compare.md")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
