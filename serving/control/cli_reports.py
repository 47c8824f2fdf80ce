"""The read-only reports of `python -m serving.control`: `analyse` (failure modes of a window
of a tenant's trajectories, from the ATDP store) and `audit` (the decision log)."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from atdp_io import AtdpStore
from serving.control.analysis import Analysis, analyse
from serving.control.audit import DecisionLog
from serving.control.store import ControlError
from serving.control.window import WindowSpec, read_window


def _interval(e: dict[str, Any]) -> str:
    return f"{e['value']:.2f} [{e['low']:.2f}, {e['high']:.2f}] n={e['n']}"


def print_analysis(analysis: Analysis, examples: int) -> None:
    out = analysis.to_json()
    print(
        f"{out['trajectories']} trajectories, {out['successes']} successes, "
        f"{out['failures']} failures; success {_interval(out['success_rate'])}"
    )
    print("success by composite version:")
    for version, estimate in out["by_version"].items():
        print(f"  {version}: {_interval(estimate)}")
    if not analysis.modes:
        print("no failure modes")
        return
    rows = [
        {
            "mode": m.id,
            "failures": m.count,
            "share": f"{m.share:.0%}",
            "failure rate": f"{m.failure_rate.value:.2f} [{m.failure_rate.low:.2f}, "
            f"{m.failure_rate.high:.2f}]",
            "tenants": len(m.tenants),
            "task types": len(m.task_types),
            "examples": ", ".join(m.examples[:examples]),
        }
        for m in analysis.modes
    ]
    print(tabulate(rows, headers="keys"))


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _what(entry: dict[str, Any]) -> str:
    event = entry["event"]
    if event == "gate":
        return f"{entry['candidate']['id']}: {entry['verdict']} ({'; '.join(entry['reasons'])})"
    if event == "decision":
        return f"{entry['action']} {entry.get('chosen') or ''}: {entry['reason']}"
    if event in ("promote", "rollback"):
        return f"version {entry['version']}: {entry.get('reason') or entry['candidate']['id']}"
    if event == "refused":
        return f"{entry['action']} {entry['candidate']['id']}: {entry['error']}"
    if event == "watch":
        return (
            f"{entry['status']} (version {entry['current_version']} vs {entry['previous_version']})"
        )
    if event == "analysis":
        return f"{entry['trajectories']} trajectories, {entry['failures']} failures"
    return json.dumps({k: v for k, v in entry.items() if k not in ("time", "event", "tenant")})[
        :120
    ]


def report_main(command: str, args) -> int:
    """Run `analyse` or `audit`; exit status 0, or 1 with the error on stderr."""
    try:
        if command == "analyse":
            spec = WindowSpec(
                args.tenant, since=args.since, until=args.until, versions=args.versions,
                limit=args.limit,
            )  # fmt: skip
            store = AtdpStore.open(args.buffer, create=False)
            analysis = analyse(read_window(store, spec), window=spec.to_json())
            if args.json:
                print(json.dumps(analysis.to_json(), indent=2, sort_keys=True))
            else:
                print_analysis(analysis, args.examples)
            return 0
        if not Path(args.store).is_dir():
            raise FileNotFoundError(f"no composite store at {args.store!r}")
        entries = DecisionLog(args.store).entries(args.tenant, args.event)
        if args.last is not None:
            entries = entries[-args.last :]
        if args.json:
            for entry in entries:
                print(json.dumps(entry, sort_keys=True))
        elif entries:
            rows = [{"time (UTC)": _when(e["time"]), "event": e["event"], "what": _what(e)}
                    for e in entries]  # fmt: skip
            print(tabulate(rows, headers="keys"))
        else:
            print("no entries")
        return 0
    except (ControlError, FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
