"""`python -m atdp_io inspect|export|purge PATH`.

- inspect: per tenant, trajectories (closed / open / purged), events, tokens, rewards and how
  many trajectories a training job may use (with the reasons the others may not).
- export: JSONL, one trajectory per line with its token streams, for a principal with access;
  expired and consent-withdrawn (or denied) trajectories never leave the store, and with
  `--eligible-only` only what a training job may use does. An operator exports anything only
  as an audited review: `--principal operator:<name> --review-reason TEXT`.
- purge: erase expired trajectories (retention), or list them with --dry-run.
- lineage: what a trajectory was derived from, what was derived from it and which checkpoints
  trained on it (`--store DIR --tenant T --trajectory ID [--checkpoint CKPT_DIR]`); or which
  trajectories a checkpoint trained on (`--checkpoint DIR/<step> [--store DIR]`).

Inspect and purge run as an operator (`--principal operator:<name>`, the default) without
content access; export reads content, so it needs the tenant itself or a grant. Every operator
or cross-tenant run lands in the tenant's audit log.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence

from tabulate import tabulate

from atdp_io import codec, lineage, trained_on
from atdp_io.access import AccessDenied
from atdp_io.governance import EXPORT, OPERATOR_REVIEW
from atdp_io.locking import PartitionLockedError
from atdp_io.report import partition_report
from atdp_io.schema import SchemaError, SourceRef
from atdp_io.store import AtdpStore
from sao_jax.config_cli import parse_command

_OPERATOR = "operator:cli"


_STORE_HELP = "store root: a directory, a URL (gs://...) or a JSON spec"
_POSITIONAL = {"positional": True, "help": _STORE_HELP}


@dataclasses.dataclass
class Inspect:
    """counts per tenant: trajectories, tokens, rewards, eligibility

    Attributes:
      tenant: restrict to these tenants (repeatable, or comma separated; default: all).
      now: unix time for expiry checks (default: the store's clock).
      principal: who asks (an operator reads counts without content access; audited).
      json: JSON output instead of a table.
    """

    path: str = dataclasses.field(metadata=_POSITIONAL)
    tenant: list[str] = dataclasses.field(default_factory=list)
    now: float | None = None
    principal: str = _OPERATOR
    json: bool = False


@dataclasses.dataclass
class Export:
    """JSONL export of trajectories

    Attributes:
      principal: who reads: the tenant itself, a grantee, or `operator:<name>` with
        --review-reason.
      tenant: restrict to these tenants (repeatable, or comma separated; default: all).
      now: unix time for expiry checks (default: the store's clock).
      out: output file (- is stdout).
      eligible_only: only trajectories a training job may use.
      include_open: also unclosed trajectories.
      review_reason: operators: export as an audited operator_review (ineligible data
        included).
    """

    path: str = dataclasses.field(metadata=_POSITIONAL)
    principal: str = dataclasses.MISSING  # type: ignore[assignment]
    tenant: list[str] = dataclasses.field(default_factory=list)
    now: float | None = None
    out: str = "-"
    eligible_only: bool = False
    include_open: bool = False
    review_reason: str = ""


@dataclasses.dataclass
class Purge:
    """erase expired trajectories

    Attributes:
      tenant: restrict to these tenants (repeatable, or comma separated; default: all).
      now: unix time for expiry checks (default: the store's clock).
      principal: who purges (audited).
      dry_run: list what would be purged, erase nothing.
    """

    path: str = dataclasses.field(metadata=_POSITIONAL)
    tenant: list[str] = dataclasses.field(default_factory=list)
    now: float | None = None
    principal: str = _OPERATOR
    dry_run: bool = False


@dataclasses.dataclass
class Lineage:
    """derivations of a trajectory, or a checkpoint's data

    Attributes:
      store: store root (needed with --trajectory).
      tenant: the trajectory's tenant.
      trajectory: a trajectory id.
      checkpoint: checkpoint steps DIR/<step> or checkpoint directories (repeatable).
      principal: who asks (audited).
      json: JSON output.
    """

    store: str | None = None
    tenant: str | None = None
    trajectory: str | None = None
    checkpoint: list[str] = dataclasses.field(default_factory=list)
    principal: str = _OPERATOR
    json: bool = False


COMMANDS = {"inspect": Inspect, "export": Export, "purge": Purge, "lineage": Lineage}


def main(argv: Sequence[str] | None = None) -> int:
    command, args = parse_command(
        argv, COMMANDS, prog="python -m atdp_io", description=__doc__.split("\n")[0]
    )
    if command == "lineage":
        return _lineage(args)
    try:
        store = AtdpStore.open(args.path, create=False)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tenants = args.tenant or store.tenants()
    return {"inspect": _inspect, "export": _export, "purge": _purge}[command](store, tenants, args)


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


def _lineage(args) -> int:
    """`lineage`: answers from the store's headers and the checkpoints' trained-on sidecars."""
    if args.trajectory is None and not args.checkpoint:
        print(
            "error: lineage needs --trajectory (with --store, --tenant) or --checkpoint",
            file=sys.stderr,
        )
        return 2
    if args.trajectory is not None and (args.store is None or args.tenant is None):
        print("error: --trajectory needs --store and --tenant", file=sys.stderr)
        return 2
    store = None
    if args.store is not None:
        try:
            store = AtdpStore.open(args.store, create=False)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    try:
        if args.trajectory is not None:
            report = _trajectory_lineage(store, args)
        else:
            report = {
                "checkpoints": [
                    _checkpoint_lineage(p, store, args.principal) for p in args.checkpoint
                ]
            }
    except (AccessDenied, FileNotFoundError, SchemaError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_lineage(report)
    return 0


def _trajectory_lineage(store: AtdpStore, args) -> dict:
    reader = store.reader(args.tenant, principal=args.principal, purpose="inspect")
    reader.refresh()
    found = args.trajectory in reader.index.by_id
    derived = lineage.descendants(store, args.tenant, [args.trajectory])
    if not found and not derived:
        raise FileNotFoundError(
            f"no trajectory {args.trajectory!r} in {args.tenant!r}, and nothing stored names it "
            "as a source (never written, or purged with everything derived from it)"
        )
    ref = SourceRef(args.tenant, args.trajectory)
    directories = [trained_on.split_step_path(p)[0] for p in args.checkpoint]
    checkpoints = trained_on.checkpoints_trained_on(directories, {ref, *derived})
    return {
        "trajectory": str(ref),
        "stored": found,
        "derived_from": sorted(map(str, lineage.ancestors(store, args.tenant, args.trajectory))),
        "derived": sorted(map(str, derived)),
        "checkpoints": {path: sorted(map(str, refs)) for path, refs in sorted(checkpoints.items())},
    }


def _checkpoint_lineage(path: str, store: AtdpStore | None, principal: str) -> dict:
    directory, step = trained_on.split_step_path(path)
    if step is None:
        known = trained_on.steps(directory)
        if not known:
            raise FileNotFoundError(f"{path}: no checkpoint step with a trained-on sidecar")
        step = known[-1]
    step_path = str(directory / str(step))
    chain = trained_on.chain(step_path)
    if not chain:
        raise FileNotFoundError(f"{step_path}: no trained-on sidecar (saved without lineage)")
    live: dict[str, set[str]] = {}
    counts = trained_on.trained_on(step_path)
    rows = []
    for ref, batches in sorted(counts.items(), key=lambda item: str(item[0])):
        row = {"trajectory": str(ref), "batches": batches}
        if store is not None:
            if ref.tenant not in live:
                live[ref.tenant] = _live_ids(store, ref.tenant, principal)
            row["stored"] = ref.trajectory_id in live[ref.tenant]
        rows.append(row)
    return {
        "checkpoint": step_path,
        "chain": [item.path for item in chain],
        "trajectories": rows,
    }


def _live_ids(store: AtdpStore, tenant: str, principal: str) -> set[str]:
    if tenant not in store.tenants():
        return set()
    reader = store.reader(tenant, principal=principal, purpose="inspect")
    reader.refresh()
    return set(reader.index.by_id)


def _print_lineage(report: dict) -> None:
    if "trajectory" in report:
        state = "stored" if report["stored"] else "not stored (purged?)"
        print(f"{report['trajectory']}: {state}")
        for title, key in (("derived from", "derived_from"), ("derived", "derived")):
            print(f"{title}: {len(report[key])}")
            for item in report[key]:
                print(f"  {item}")
        print(f"checkpoints trained on it: {len(report['checkpoints'])}")
        for path, refs in report["checkpoints"].items():
            print(f"  {path} (through {', '.join(refs)})")
        return
    for checkpoint in report["checkpoints"]:
        print(f"{checkpoint['checkpoint']}: {len(checkpoint['trajectories'])} trajectories")
        print(f"  chain: {' <- '.join(checkpoint['chain'])}")
        if checkpoint["trajectories"]:
            print(tabulate(checkpoint["trajectories"], headers="keys"))
