"""`python -m atdp_io inspect|export|purge PATH`.

- inspect: per tenant, trajectories (closed / open / purged), events, tokens, rewards and how
  many trajectories a training job may use (with the reasons the others may not).
- export: JSONL, one trajectory per line with its token streams, for a principal with access;
  expired and consent-withdrawn (or denied) trajectories never leave the store, and with
  `--eligible-only` only what a training job may use does. An operator exports anything only
  as an audited review: `--principal operator:<name> --review-reason TEXT`.
- purge: erase expired trajectories (retention), or list them with --dry-run.

Inspect and purge run as an operator (`--principal operator:<name>`, the default) without
content access; export reads content, so it needs the tenant itself or a grant. Every operator
or cross-tenant run lands in the tenant's audit log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tabulate import tabulate

from atdp_io import codec
from atdp_io.access import AccessDenied
from atdp_io.governance import EXPORT, OPERATOR_REVIEW
from atdp_io.locking import PartitionLockedError
from atdp_io.report import partition_report
from atdp_io.store import AtdpStore

_OPERATOR = "operator:cli"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        store = AtdpStore.open(args.path, create=False)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tenants = args.tenant or store.tenants()
    return {"inspect": _inspect, "export": _export, "purge": _purge}[args.command](
        store, tenants, args
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m atdp_io", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("inspect", "counts per tenant: trajectories, tokens, rewards, eligibility"),
        ("export", "JSONL export of trajectories"),
        ("purge", "erase expired trajectories"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("path", help="store root: a directory, a URL (gs://...) or a JSON spec")
        sub.add_argument("--tenant", action="append", help="restrict to a tenant (repeatable)")
        sub.add_argument("--now", type=float, default=None, help="unix time for expiry checks")
        default = None if name == "export" else _OPERATOR
        sub.add_argument("--principal", default=default, required=default is None)
    commands.choices["inspect"].add_argument("--json", action="store_true", help="JSON output")
    export = commands.choices["export"]
    export.add_argument("--out", default="-", help="output file (default stdout)")
    export.add_argument(
        "--eligible-only", action="store_true", help="only trajectories a training job may use"
    )
    export.add_argument("--include-open", action="store_true", help="also unclosed trajectories")
    export.add_argument(
        "--review-reason",
        default="",
        help="operators: export as an audited operator_review (ineligible data included)",
    )
    commands.choices["purge"].add_argument("--dry-run", action="store_true")
    return parser


def _now(store: AtdpStore, args) -> float:
    return store.clock() if args.now is None else args.now


def _inspect(store: AtdpStore, tenants: list[str], args) -> int:
    reports, failed = [], 0
    for tenant in tenants:
        try:
            reader = store.reader(tenant, principal=args.principal, purpose="inspect")
        except AccessDenied as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        reader.refresh()
        reports.append(partition_report(reader, _now(store, args)))
    if args.json:
        print(json.dumps(reports, indent=2))
    else:
        rows = [
            {**r, "ineligible": ", ".join(f"{k}={v}" for k, v in r["ineligible"].items()) or "-"}
            for r in reports
        ]
        print(tabulate(rows, headers="keys", floatfmt=".3f"))
    return 1 if failed else 0


def _export(store: AtdpStore, tenants: list[str], args) -> int:
    now, written = _now(store, args), 0
    purpose = OPERATOR_REVIEW if args.review_reason else EXPORT
    out = sys.stdout if args.out == "-" else open(args.out, "w")  # noqa: SIM115
    try:
        for tenant in tenants:
            try:
                reader = store.reader(
                    tenant, principal=args.principal, purpose=purpose, reason=args.review_reason
                )
            except (AccessDenied, ValueError) as err:  # ValueError: a blank review reason
                print(f"error: {err}", file=sys.stderr)
                return 1
            reader.refresh()
            # The reader leaves out what its purpose may not serve at `now`.
            listing = reader.eligible_entries if args.eligible_only else reader.entries
            for entry in listing(closed_only=not args.include_open, now=now):
                trajectory = reader.read_entries([entry], now=now)[0]
                line = {"tenant": tenant, "trajectory": codec.trajectory_to_export(trajectory)}
                out.write(json.dumps(line, ensure_ascii=False) + "\n")
                written += 1
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"exported {written} trajectories", file=sys.stderr)
    return 0


def _purge(store: AtdpStore, tenants: list[str], args) -> int:
    failed = 0
    for tenant in tenants:
        try:
            purged = store.purge_expired(
                tenant, principal=args.principal, now=_now(store, args), dry_run=args.dry_run
            )
        except (AccessDenied, PartitionLockedError) as err:
            print(f"error: {tenant}: {err}", file=sys.stderr)
            failed += 1
            continue
        verb = "would purge" if args.dry_run else "purged"
        print(f"{tenant}: {verb} {len(purged)} expired trajectories")
        for trajectory_id in purged:
            print(f"  {trajectory_id}")
    return 1 if failed else 0
