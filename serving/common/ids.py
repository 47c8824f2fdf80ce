"""Opaque ids for sessions, completions and tool calls that survive ATDP redaction.

Ids end up in recorded events (trajectory id, metadata, tool-call ids), and the writer's
redactor rewrites anything that looks like a card or phone number or an API key: a hex id
with a long run of digits would come back as "[REDACTED:credit_card]" and no longer link a
reward to its completion. Ids are therefore drawn from lowercase letters (26 letters carry 122
bits) and redrawn in the rare case the redactor would still flag them.
"""

from __future__ import annotations

import secrets
import string

from atdp_io import Redactor

_LETTERS = string.ascii_lowercase
_SCREEN = Redactor()  # the built-in detectors, the strictest setting a proxy can run


def _letters(n: int) -> str:
    return "".join(secrets.choice(_LETTERS) for _ in range(n))


def opaque_id(prefix: str = "", length: int = 26) -> str:
    """`prefix` + `length` random lowercase letters, never flagged by the redactor."""
    while True:
        candidate = prefix + _letters(length)
        if not _SCREEN.might_match(candidate):
            return candidate


def interaction_id(kind: str, session_id: str) -> str:
    """`<kind>-<session id>-<12 letters>`: the session is readable from the id, so a reward
    sent with only the interaction id finds its session."""
    return opaque_id(f"{kind}-{session_id}-", 12)


def session_of(interaction: str) -> str | None:
    """The session id inside an interaction id, or None if it is not one of ours."""
    parts = interaction.split("-")
    return parts[1] if len(parts) == 3 and parts[1] else None
