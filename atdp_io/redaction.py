"""Redaction that runs before a record touches disk.

The writer passes every header, event and annotation through a `Redactor`. Built-in detectors:
e-mail addresses, phone numbers, credit-card numbers (Luhn-checked), API keys of common providers,
bearer tokens, JWTs and `key=value` secrets; callers add their own patterns by name. Every JSON
string (observation, hidden state, action text, tool arguments and results, metadata) is scanned.

Token ids carry the same text as the prompt, so a redactor built with a `tokenizer`
(`encode(text) -> list[int]`, `decode(ids) -> str`) also scans LLM token streams: an input with a
finding is re-encoded from its redacted text; an output with a finding is re-encoded too and its
loss mask and log-probs are zeroed, because the recorded log-probs belong to the original tokens.
Without a tokenizer the token streams are left as they are and the record says `TEXT_ONLY`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from atdp_io import codec, schema
from atdp_io.schema import RedactionStatus

_BUILTIN_PATTERNS: dict[str, str] = {
    "bearer_token": r"\b(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}",
    "jwt": r"\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}",
    "api_key": (
        r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
        r"|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|hf_[A-Za-z0-9]{30,})"
    ),
    "secret_assignment": (
        r"\b(?i:api[_-]?key|secret|access[_-]?token|auth[_-]?token|password|passwd)"
        r"\s*[:=]\s*['\"]?[^\s'\",;]{6,}"
    ),
    "email": r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
    "credit_card": r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])",
    "phone": (
        r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]?\d{3,4}"
        r"(?!\w)"
    ),
}


# Necessary conditions for the built-in detectors, checked with C-speed substring tests before
# any regex runs: a literal every match contains (case-sensitive or lower-cased), or a run of
# digits and separators (phone numbers: >= 9 characters starting with a digit, "(" or "+";
# card numbers: >= 13 digits).
_TRIGGERS = (
    "@",
    "eyJ",
    "sk-",
    "AKIA",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "xox",
    "AIza",
    "hf_",
)
_LOWER_TRIGGERS = ("bearer", "api", "secret", "token", "passw")
_DIGIT_RUN = re.compile(r"[\d(+][\d\s().+-]{8,}")


def _builtin_might_match(text: str) -> bool:
    for trigger in _TRIGGERS:
        if trigger in text:
            return True
    lowered = text.lower()
    for trigger in _LOWER_TRIGGERS:
        if trigger in lowered:
            return True
    return _DIGIT_RUN.search(text) is not None


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = int(char)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


@dataclasses.dataclass
class RedactionReport:
    """What one redaction pass found, by detector name."""

    findings: Counter = dataclasses.field(default_factory=Counter)
    tokens_scanned: bool = True

    @property
    def status(self) -> RedactionStatus:
        if not self.tokens_scanned:
            return RedactionStatus.TEXT_ONLY
        return RedactionStatus.REDACTED if self.findings else RedactionStatus.CLEAN


class Redactor:
    """Replaces sensitive substrings with `[REDACTED:<detector>]`.

    Args:
      extra_patterns: name -> regular expression, added to the built-in detectors.
      tokenizer: enables scanning of LLM token streams (see module docstring).
      disable: names of built-in detectors to turn off (e.g. "phone" for numeric-heavy tasks).
    """

    def __init__(
        self,
        extra_patterns: Mapping[str, str] | None = None,
        tokenizer: Tokenizer | None = None,
        disable: tuple[str, ...] = (),
    ):
        unknown = set(disable) - set(_BUILTIN_PATTERNS)
        if unknown:
            raise ValueError(f"Redactor.disable: unknown detectors {sorted(unknown)}")
        patterns = {k: v for k, v in _BUILTIN_PATTERNS.items() if k not in disable}
        for name, pattern in (extra_patterns or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"Redactor.extra_patterns: bad detector name {name!r}")
            if name in patterns:
                raise ValueError(f"Redactor.extra_patterns: {name!r} shadows a built-in detector")
            try:
                # Compiled as a group of the combined pattern: global flags must be scoped.
                re.compile(f"(?P<{name}>{pattern})")
            except re.error as err:
                raise ValueError(f"Redactor.extra_patterns[{name!r}]: {err}") from err
            patterns[name] = pattern
        # One alternation, so a string is scanned once; earlier detectors win on overlaps.
        self._regex = re.compile("|".join(f"(?P<{n}>{p})" for n, p in patterns.items()))
        # User patterns have no cheap necessary condition: with any, every text is scanned.
        self._custom = bool(extra_patterns)
        self._tokenizer = tokenizer

    def redact_text(self, text: str, report: RedactionReport) -> str:
        """Returns `text` with every finding replaced, counting findings into `report`."""

        def replace(match: re.Match) -> str:
            name = match.lastgroup
            if name == "credit_card" and not _luhn_ok(re.sub(r"\D", "", match.group())):
                return match.group()
            report.findings[name] += 1
            return f"[REDACTED:{name}]"

        return self._regex.sub(replace, text)

    def redact_json(self, value: Any, report: RedactionReport) -> Any:
        """Redacts every string inside a JSON value (keys included)."""
        if isinstance(value, str):
            return self.redact_text(value, report)
        if isinstance(value, Mapping):
            return {
                self.redact_text(k, report): self.redact_json(v, report) for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self.redact_json(v, report) for v in value]
        return value

    def redact_header(self, header: schema.TrajectoryHeader) -> schema.TrajectoryHeader:
        """Redacts a header; a trajectory id must be opaque, so a finding in it is an error."""
        report = RedactionReport(tokens_scanned=True)
        self.redact_text(header.trajectory_id, report)
        if report.findings:
            raise schema.SchemaError(
                f"header.trajectory_id: contains sensitive data ({', '.join(report.findings)}); "
                "use an opaque id"
            )
        redacted = _map_strings(
            header, lambda s: self.redact_text(s, report), skip=("tenant", "trajectory_id")
        )
        governance = dataclasses.replace(redacted.governance, redaction=report.status)
        return dataclasses.replace(redacted, governance=governance)

    def redact_event(self, event: schema.Event) -> tuple[schema.Event, RedactionReport]:
        """The event as it may be stored, and what was found."""
        payload, llm, report = self.prepare_event(event)
        arrays = None
        if llm is not None:
            arrays = codec.LLMArrays(*(getattr(llm, name) for name in codec.LLMArrays._fields))
        return codec.event_from_json(payload, arrays), report

    def prepare_event(
        self, event: schema.Event
    ) -> tuple[dict, schema.LLMCall | None, RedactionReport]:
        """The event's redacted JSON payload (status filled in) and its storable LLM call.

        The writer's hot path: strings are gathered and scanned in one pass, and only an event
        with a finding is rebuilt.
        """
        report = RedactionReport(tokens_scanned=event.llm is None or self._tokenizer is not None)
        strings: list[str] = []
        payload = codec.to_json_unchecked(event, strings)
        if self.might_match("\x00".join(strings)):
            payload = self.redact_json(payload, report)
        llm = event.llm
        if llm is not None and self._tokenizer is not None:
            llm = self._redact_tokens(llm, report)
        payload["redaction"] = report.status.value
        return payload, llm, report

    def might_match(self, text: str) -> bool:
        """False only when no detector can match `text` (cheap literal checks first).

        Callers join many strings with NUL: joining can add a spurious cross-string match but
        never hide a real one, and any hit sends the record through the exact per-string pass.
        """
        if not (self._custom or _builtin_might_match(text)):
            return False
        return self._regex.search(text) is not None

    def redact_annotation(self, note: schema.Annotation) -> schema.Annotation:
        report = RedactionReport()
        return _map_strings(note, lambda s: self.redact_text(s, report), skip=("trajectory_id",))

    def _redact_tokens(self, llm: schema.LLMCall, report: RedactionReport) -> schema.LLMCall:
        tokenizer = self._tokenizer
        changes: dict[str, Any] = {}
        before = sum(report.findings.values())
        text = tokenizer.decode(llm.input_ids.tolist())
        cleaned = self.redact_text(text, report)
        if sum(report.findings.values()) > before:
            changes["input_ids"] = np.asarray(tokenizer.encode(cleaned), np.int32)
        before = sum(report.findings.values())
        text = tokenizer.decode(llm.output_ids.tolist())
        cleaned = self.redact_text(text, report)
        if sum(report.findings.values()) > before:
            ids = np.asarray(tokenizer.encode(cleaned), np.int32)
            n = ids.shape[0]
            # The recorded log-probs belong to the original tokens: keep the tokens for context
            # but never train on them.
            changes.update(
                output_ids=ids,
                output_logprobs=np.zeros(n, np.float32),
                output_versions=np.full(n, llm.policy_version, np.int32),
                loss_mask=np.zeros(n, np.int8),
            )
        return dataclasses.replace(llm, **changes) if changes else llm


def _map_strings(record: Any, fn: Callable[[str], str], skip: tuple[str, ...] = ()) -> Any:
    """Applies `fn` to every string reachable from a schema record, except fields in `skip`."""
    if isinstance(record, (StrEnum, bool, int, float, np.ndarray)) or record is None:
        return record  # StrEnum first: enum members are str instances but never free text
    if isinstance(record, str):
        return fn(record)
    if dataclasses.is_dataclass(record):
        changes = {}
        for field in dataclasses.fields(record):
            if field.name in skip:
                continue
            value = getattr(record, field.name)
            new = _map_strings(value, fn, skip)
            if new is not value:
                changes[field.name] = new
        return dataclasses.replace(record, **changes) if changes else record
    if isinstance(record, Mapping):
        return {
            fn(k) if isinstance(k, str) else k: _map_strings(v, fn, skip) for k, v in record.items()
        }
    if isinstance(record, (list, tuple)):
        mapped = [_map_strings(v, fn, skip) for v in record]
        return tuple(mapped) if isinstance(record, tuple) else mapped
    return record
