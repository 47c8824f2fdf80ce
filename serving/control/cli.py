"""`python -m serving.control status|history|diff|promote|rollback|canary|analyse|audit TENANT`.

Talks to a running gateway's admin routes (`--url http://host:port`, admin key from
`--admin-key` or SAO_ADMIN_KEY), or, with the gateway stopped, to the store directly
(`--store STATE_DIR/composites`). Either way a write makes a new version; nothing is ever
overwritten.

- status: the tenant's current version, what made it, and its parts' fingerprints.
- history: every version, oldest first.
- diff: what changed between two versions, part by part.
- promote: a composite JSON file (the parts policy, harness, memory, tools, governance)
  becomes the next version.
- rollback: the next version restores an earlier version's content.
- canary: show the tenant's canary; `--share S` serves its newest version to that share of
  sessions; `--stop` ends it (`--no-keep`: rolling back to the baseline).
- analyse: failure modes of a window of the tenant's trajectories (`--buffer`: the ATDP store),
  and success by composite version.
- audit: the control plane's decision log (gate results, decisions, promotions, rollbacks).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from sao_jax.config_cli import parse_command
from serving.common.client import BlockingClient
from serving.common.errors import ApiError
from serving.control.canary import CanaryBook
from serving.control.cli_reports import report_main
from serving.control.composite import CompositeError
from serving.control.deploy import finish_canary
from serving.control.store import CompositeStore, ControlError


@dataclasses.dataclass(kw_only=True)
class _Target:
    """
    Attributes:
      tenant: the tenant whose composite to read or change.
      url: a running gateway (http://host:port); its admin routes are used.
      admin_key: the gateway's admin key (default: SAO_ADMIN_KEY).
      store: instead of --url: the composites directory (STATE_DIR/composites) of a stopped
        gateway.
      json: print JSON instead of text.
    """

    tenant: str = dataclasses.field(metadata={"positional": True})
    url: str | None = None
    admin_key: str | None = None
    store: str | None = None
    json: bool = False


@dataclasses.dataclass(kw_only=True)
class Status(_Target):
    """the current composite version of a tenant"""


@dataclasses.dataclass(kw_only=True)
class History(_Target):
    """every version of a tenant's composite, oldest first"""


@dataclasses.dataclass(kw_only=True)
class Diff(_Target):
    """what changed between two versions

    Attributes:
      old: the earlier version.
      new: the later version.
    """

    old: int = dataclasses.field(metadata={"positional": True})
    new: int = dataclasses.field(metadata={"positional": True})


@dataclasses.dataclass(kw_only=True)
class Promote(_Target):
    """make a composite JSON file the tenant's next version

    Attributes:
      file: JSON file with the parts (policy, harness, memory, tools, governance).
      reason: why (kept with the version).
      expected_version: refuse unless this is still the current version.
    """

    file: str = dataclasses.field(metadata={"positional": True})
    reason: str = ""
    expected_version: int | None = None


@dataclasses.dataclass(kw_only=True)
class Rollback(_Target):
    """restore an earlier version's content as the next version

    Attributes:
      version: the earlier version to restore.
      reason: why (kept with the version).
    """

    version: int = dataclasses.field(metadata={"positional": True})
    reason: str = ""


@dataclasses.dataclass(kw_only=True)
class CanaryCommand(_Target):
    """show, start (--share) or stop (--stop) the tenant's canary

    Attributes:
      share: start a canary: serve the newest version to this share of sessions, in (0, 1).
      baseline: the version the other sessions get (default: the newest's parent).
      stop: end the running canary.
      keep: with --stop: keep the newest version for everyone (--no-keep: roll back to the
        baseline).
      reason: why (kept in the audit log).
    """

    share: float | None = None
    baseline: int | None = None
    stop: bool = False
    keep: bool = True
    reason: str = ""


@dataclasses.dataclass(kw_only=True)
class Analyse:
    """failure modes of a window of the tenant's trajectories

    Attributes:
      tenant: whose trajectories.
      buffer: the ATDP store the gateway records into (its --buffer).
      since: only trajectories created at or after this unix time.
      until: only trajectories created before this unix time.
      versions: only trajectories served by these composite versions (comma-separated).
      limit: only the newest N.
      examples: example trajectory ids per mode.
      json: print JSON instead of text.
    """

    tenant: str = dataclasses.field(metadata={"positional": True})
    buffer: str
    since: float | None = None
    until: float | None = None
    versions: tuple[int, ...] | None = None
    limit: int | None = None
    examples: int = 3
    json: bool = False


@dataclasses.dataclass(kw_only=True)
class Audit:
    """the control plane's decision log of a tenant

    Attributes:
      tenant: whose entries.
      store: the composites directory (STATE_DIR/composites) holding decisions.jsonl.
      event: only entries of this event (gate, decision, promote, refused, watch, ...).
      last: only the last N entries.
      json: print JSON lines instead of a table.
    """

    tenant: str = dataclasses.field(metadata={"positional": True})
    store: str
    event: str | None = None
    last: int | None = None
    json: bool = False


COMMANDS = {
    "status": Status,
    "history": History,
    "diff": Diff,
    "promote": Promote,
    "rollback": Rollback,
    "canary": CanaryCommand,
    "analyse": Analyse,
    "audit": Audit,
}


class _Gateway:
    """The gateway's admin routes (`serving/gateway/control_routes.py`)."""

    def __init__(self, url: str, admin_key: str, tenant: str):
        self.client = BlockingClient(url, api_key=admin_key)
        self.path = f"/rl/control/{tenant}"

    def current(self) -> dict:
        return self.client.call(self.path)

    def history(self) -> list[dict]:
        return self.client.call(self.path + "/history")["versions"]

    def diff(self, old: int, new: int) -> dict:
        return self.client.call(f"{self.path}/diff?from={old}&to={new}")

    def put(self, composite: Any, reason: str, expected: int | None) -> dict:
        body = {"composite": composite, "reason": reason, "expected_version": expected}
        return self.client.call(self.path, body, method="PUT")

    def rollback(self, version: int, reason: str) -> dict:
        return self.client.call(self.path + "/rollback", {"version": version, "reason": reason})

    def canary(self) -> dict | None:
        return self.client.call(self.path + "/canary")["canary"]

    def start_canary(self, share: float, baseline: int | None, reason: str) -> dict:
        body = {"share": share, "baseline": baseline, "reason": reason}
        return self.client.call(self.path + "/canary", body, method="PUT")

    def stop_canary(self, keep: bool, reason: str) -> dict:
        return self.client.call(self.path + "/canary/stop", {"keep": keep, "reason": reason})


class _Store:
    """The store itself (a stopped gateway's STATE_DIR/composites)."""

    def __init__(self, root: str, tenant: str):
        self.store, self.tenant = CompositeStore(root), tenant
        self.canaries = CanaryBook(self.store)

    def current(self) -> dict:
        return self.store.current(self.tenant).to_json()

    def history(self) -> list[dict]:
        return [c.to_json() for c in self.store.history(self.tenant)]

    def diff(self, old: int, new: int) -> dict:
        return self.store.diff(self.tenant, old, new)

    def put(self, composite: Any, reason: str, expected: int | None) -> dict:
        made = self.store.put(self.tenant, composite, reason=reason, expected_version=expected)
        return made.to_json()

    def rollback(self, version: int, reason: str) -> dict:
        return self.store.rollback(self.tenant, version, reason=reason).to_json()

    def canary(self) -> dict | None:
        running = self.canaries.get(self.tenant)
        return None if running is None else running.to_json()

    def start_canary(self, share: float, baseline: int | None, reason: str) -> dict:
        return self.canaries.start(self.tenant, share=share, baseline=baseline).to_json()

    def stop_canary(self, keep: bool, reason: str) -> dict:
        made = finish_canary(self.store, self.canaries, self.tenant, keep=keep, reason=reason)
        return made.to_json()


def _when(created_at: float) -> str:
    if not created_at:
        return "-"
    return datetime.datetime.fromtimestamp(created_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _summary(c: dict) -> dict[str, Any]:
    return {
        "version": c["version"],
        "parent": c["parent"],
        "rollback_of": c["rollback_of"],
        "created (UTC)": _when(c["created_at"]),
        "reason": c["reason"],
        "policy": c["policy"]["version"] or "-",
        "notes": len(c["memory"]["notes"]),
        "tool schemas": len(c["tools"]["schemas"]),
        "harness": c["fingerprints"]["harness"],
        "memory": c["fingerprints"]["memory"],
    }


def _run(command: str, args, target) -> Any:
    if command == "status":
        return target.current()
    if command == "history":
        return target.history()
    if command == "diff":
        return target.diff(args.old, args.new)
    if command == "canary":
        if args.stop:
            return target.stop_canary(args.keep, args.reason)
        if args.share is not None:
            return target.start_canary(args.share, args.baseline, args.reason)
        return {"canary": target.canary()}
    if command == "promote":
        try:
            with open(args.file, encoding="utf-8") as f:
                composite = json.load(f)
        except (OSError, json.JSONDecodeError) as error:
            raise CompositeError(f"{args.file}: {error}") from None
        return target.put(composite, args.reason, args.expected_version)
    return target.rollback(args.version, args.reason)


def _print(command: str, result: Any) -> None:
    if command == "canary" and "canary" in result:
        running = result["canary"]
        print(
            "no canary running"
            if running is None
            else f"canary: version {running['version']} serves {running['share']:.0%} of "
            f"sessions, version {running['baseline']} the rest (salt {running['salt']!r})"
        )
    elif command == "canary" and "share" in result:
        print(f"canary started: version {result['version']} for {result['share']:.0%} of sessions")
    elif command == "history":
        print(tabulate([_summary(c) for c in result], headers="keys") if result else "no versions")
    elif command == "diff":
        changed = result["changed"]
        print(f"version {result['from_version']} -> {result['to_version']}:", end="")
        print(" no change" if not changed else "")
        for part, entry in changed.items():
            print(f"  {part}:")
            for key in ("notes_added", "notes_removed", "notes_changed"):
                if entry.get(key):
                    print(f"    {key.replace('_', ' ')}: {', '.join(entry[key])}")
            print(f"    from: {json.dumps(entry['from'], sort_keys=True)}")
            print(f"    to:   {json.dumps(entry['to'], sort_keys=True)}")
    else:
        summary = _summary(result)
        print(f"tenant {result['tenant']}: composite version {result['version']}")
        for key, value in summary.items():
            if key != "version":
                print(f"  {key}: {value if value is not None else '-'}")


def main(argv: Sequence[str] | None = None) -> int:
    command, args = parse_command(
        argv, COMMANDS, prog="python -m serving.control", description=__doc__.split("\n")[0]
    )
    if command in ("analyse", "audit"):
        return report_main(command, args)
    if (args.url is None) == (args.store is None):
        print(
            "error: give exactly one of --url (a gateway) and --store (a directory)",
            file=sys.stderr,
        )
        return 2
    if args.url is not None:
        key = args.admin_key or os.environ.get("SAO_ADMIN_KEY")
        if not key:
            print("error: --admin-key (or SAO_ADMIN_KEY) is required with --url", file=sys.stderr)
            return 2
        target: Any = _Gateway(args.url, key, args.tenant)
    else:
        target = _Store(args.store, args.tenant)
    try:
        result = _run(command, args, target)
    except ApiError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    except (ControlError, CompositeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        _print(command, result)
    return 0
