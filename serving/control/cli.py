"""`python -m serving.control status|history|diff|promote|rollback TENANT ...`.

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
from serving.control.composite import CompositeError
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


COMMANDS = {
    "status": Status,
    "history": History,
    "diff": Diff,
    "promote": Promote,
    "rollback": Rollback,
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


class _Store:
    """The store itself (a stopped gateway's STATE_DIR/composites)."""

    def __init__(self, root: str, tenant: str):
        self.store, self.tenant = CompositeStore(root), tenant

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
    if command == "promote":
        try:
            with open(args.file, encoding="utf-8") as f:
                composite = json.load(f)
        except (OSError, json.JSONDecodeError) as error:
            raise CompositeError(f"{args.file}: {error}") from None
        return target.put(composite, args.reason, args.expected_version)
    return target.rollback(args.version, args.reason)


def _print(command: str, result: Any) -> None:
    if command == "history":
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
