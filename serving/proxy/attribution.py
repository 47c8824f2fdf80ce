"""Which composite policy produced an event: the `EventMetadata` fields that name it.

The gateway applies the tenant's composite (serving/control) and passes its attribution with
the call (`CallContext.composite`): {"version": int, "harness": fingerprint, "memory":
fingerprint, "tools": {tool name: schema version}, "policy": label}. Every event of the call
records it; events the agent reports later (/rl/event) record the session's latest one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def composite_fields(composite: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keyword arguments of `EventMetadata` for `composite` (none when there is none)."""
    if composite is None:
        return {}
    return {
        "composite_version": int(composite["version"]),
        "memory_version": composite.get("memory", ""),
        "tool_schema_versions": dict(composite.get("tools") or {}),
        "policy_version": composite.get("policy", ""),
    }


def harness_fingerprint(template_fingerprint: str, composite: Mapping[str, Any] | None) -> str:
    """The chat template's fingerprint, joined by `+` with the composite harness's when a
    composite (version > 0) shaped the prompt."""
    if composite is None or not composite.get("version"):
        return template_fingerprint
    return f"{template_fingerprint}+{composite['harness']}"
