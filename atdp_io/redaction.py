"""Redaction that runs before a record touches disk.

The writer passes every header, event and annotation through a `Redactor`. Built-in detectors
are the catalogue of `atdp_io.secret_catalogue`: credentials (PEM private keys, AWS secret keys,
provider API keys, Stripe keys, webhook URLs, passwords in URLs, bearer / basic auth, JWTs,
`key=value` secrets) and personal data (e-mail, phone, payment cards, IBANs, US SSNs); callers
add their own patterns by name. Every JSON string (observation, hidden state, action text, tool
arguments and results, metadata) is scanned, keys included, and a string under a secret-like key
(`{"password": ...}`) is replaced whole.

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
from collections.abc import Callable, Iterator, Mapping
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from atdp_io import codec, schema
from atdp_io import secret_catalogue as catalogue
from atdp_io.schema import RedactionStatus

_BUILTIN = catalogue.by_name()


def _minimal(literals) -> tuple[str, ...]:
    """`literals` lower-cased, without any that holds another (that one is then necessary)."""
    lowered = set(map(str.lower, literals))
    return tuple(sorted(t for t in lowered if not any(o != t and o in t for o in lowered)))


def _guarded(literals: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, tuple], ...]]:
    """(plain literals, (guard, literals holding it)...): a literal with `_ - : .` in it is
    tested only when its guard character is in the text, which halves the tests on prose."""
    plain, groups = [], {}
    for literal in literals:
        guard = next((g for g in "_-:." if g in literal), None)
        (groups.setdefault(guard, []) if guard else plain).append(literal)
    return tuple(plain), tuple((g, tuple(group)) for g, group in groups.items())


# Necessary conditions for the built-in detectors (see `atdp_io.secret_catalogue`), checked
# before any regex runs: C-speed substring tests on the lower-cased text (every match holds one
# of its detector's literals, and a lower-cased literal is a weaker, still necessary,
# condition), then the shapes of the numeric detectors. Clean text, the common case, pays one
# lower() and these tests. Includes the literals of secret-like mapping keys.
_PLAIN, _GUARDED = _guarded(
    _minimal(
        [t for d in catalogue.CATALOGUE for t in (*d.triggers, *d.lower_triggers)]
        + list(catalogue.SECRET_KEY_TRIGGERS)
    )
)
_DIGIT_RUN, _IBAN_HEAD = catalogue.SHAPES


def _builtin_might_match(text: str) -> bool:
    lowered = text.lower()
    for literal in _PLAIN:
        if literal in lowered:
            return True
    for guard, literals in _GUARDED:
        if guard in lowered:
            for literal in literals:
                if literal in lowered:
                    return True
    return _DIGIT_RUN.search(text) is not None or _IBAN_HEAD.search(text) is not None


def _might_hold_secret_key(text: str) -> bool:
    """False only when no string in `text` can be a secret-like mapping key."""
    lowered = text.lower()
    return any(trigger in lowered for trigger in catalogue.SECRET_KEY_TRIGGERS)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


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
        unknown = set(disable) - set(_BUILTIN)
        if unknown:
            raise ValueError(f"Redactor.disable: unknown detectors {sorted(unknown)}")
        patterns = {d.name: d.pattern for d in catalogue.CATALOGUE if d.name not in disable}
        for name, pattern in (extra_patterns or {}).items():
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(f"Redactor.extra_patterns: bad detector name {name!r}")
            if name in _BUILTIN:
                raise ValueError(f"Redactor.extra_patterns: {name!r} shadows a built-in detector")
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"Redactor.extra_patterns[{name!r}]: {err}") from err
            patterns[name] = pattern
        # One compiled regex per detector, merged leftmost-first in catalogue order (what one
        # alternation would find): alone, a regex that opens with a literal or a class skips
        # ahead in C, which one big alternation cannot (it tries every branch at every position).
        self._names = tuple(patterns)
        self._regexes = tuple(re.compile(p) for p in patterns.values())
        self._validators = {
            d.name: d.validate for d in catalogue.CATALOGUE if d.validate and d.name in patterns
        }
        self._value_groups = {
            d.name: d.value_group
            for d in catalogue.CATALOGUE
            if d.value_group and d.name in patterns
        }
        self._secret_keys = "secret_assignment" in patterns
        # User patterns have no cheap necessary condition: with any, every text is scanned.
        self._custom = bool(extra_patterns)
        self._tokenizer = tokenizer

    def redact_text(self, text: str, report: RedactionReport) -> str:
        """Returns `text` with every finding replaced, counting findings into `report`."""
        pieces, last = [], 0
        for name, match in self._matches(text):
            pieces += (text[last : match.start()], self._replacement(name, match, report))
            last = match.end()
        if not pieces:
            return text
        pieces.append(text[last:])
        return "".join(pieces)

    def _matches(self, text: str) -> Iterator[tuple[str, re.Match]]:
        """Non-overlapping matches of all detectors, leftmost first, ties to the earlier one."""
        regexes = self._regexes
        heads = [regex.search(text) for regex in regexes]
        while True:
            best = None
            for i, head in enumerate(heads):
                if head is not None and (best is None or head.start() < heads[best].start()):
                    best = i
            if best is None:
                return
            match = heads[best]
            pos = match.end()
            if pos == match.start():  # an empty match (a user pattern) replaces nothing
                more = pos < len(text)  # (a search from past the end still finds one at it)
                heads[best] = regexes[best].search(text, pos + 1) if more else None
                continue
            yield self._names[best], match
            for i, head in enumerate(heads):
                if head is not None and head.start() < pos:
                    heads[i] = regexes[i].search(text, pos)

    def _replacement(self, name: str, match: re.Match, report: RedactionReport) -> str:
        group = self._value_groups.get(name)
        validate = self._validators.get(name)
        found = -1  # the whole match
        if validate is not None:
            found = validate(match.group(group or 0))
            if not found:
                return match.group()
        report.findings[name] += 1
        whole = match.group()
        if group is None:
            if 0 < found < len(whole):  # the finding is a prefix: the rest may hold others
                return f"[REDACTED:{name}]{self.redact_text(whole[found:], report)}"
            return f"[REDACTED:{name}]"
        # Only the secret goes; its context (`password=`, `"SecretAccessKey": "`) stays.
        start, end = match.span(group)
        offset = match.start()
        return f"{whole[: start - offset]}[REDACTED:{name}]{whole[end - offset :]}"

    def redact_json(self, value: Any, report: RedactionReport) -> Any:
        """Redacts every string inside a JSON value (keys included).

        A string stored under a secret-like key (`{"password": ...}`, `"client_secret"`) is a
        secret whatever it looks like, and is replaced whole.
        """
        if isinstance(value, str):
            return self.redact_text(value, report)
        if isinstance(value, Mapping):
            return {
                self.redact_text(k, report): self._redact_item(k, v, report)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self.redact_json(v, report) for v in value]
        return value

    def _redact_item(self, key: Any, value: Any, report: RedactionReport) -> Any:
        if self._is_secret_item(key, value):
            report.findings["secret_assignment"] += 1
            return "[REDACTED:secret_assignment]"
        return self.redact_json(value, report)

    def _is_secret_item(self, key: Any, value: Any) -> bool:
        return (
            self._secret_keys
            and isinstance(value, str)
            and bool(value)
            and isinstance(key, str)
            and catalogue.is_secret_key(key)
        )

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
            header,
            self._string_fn(report),
            skip=("tenant", "trajectory_id"),
            items=self._items(report),
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
        if self._needs_exact_pass("\x00".join(strings)):
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
        return any(regex.search(text) is not None for regex in self._regexes)

    def _needs_exact_pass(self, joined: str) -> bool:
        """Whether the strings of a record (NUL-joined) need the per-string pass of
        `redact_json`: a detector may match, or a string may be a secret-like key."""
        if not (self._custom or _builtin_might_match(joined)):
            return False
        if any(regex.search(joined) is not None for regex in self._regexes):
            return True
        return self._secret_keys and _might_hold_secret_key(joined)

    def redact_annotation(self, note: schema.Annotation) -> schema.Annotation:
        report = RedactionReport()
        return _map_strings(
            note, self._string_fn(report), skip=("trajectory_id",), items=self._items(report)
        )

    def _string_fn(self, report: RedactionReport) -> Callable[[str], str]:
        return lambda text: self.redact_text(text, report)

    def _items(self, report: RedactionReport) -> Callable[[Any, Any], Any]:
        """The mapping-item hook of `_map_strings`: secret-like keys, else `_NOT_SECRET`."""

        def item(key: Any, value: Any) -> Any:
            if self._is_secret_item(key, value):
                report.findings["secret_assignment"] += 1
                return "[REDACTED:secret_assignment]"
            return _NOT_SECRET

        return item

    def _redact_tokens(self, llm: schema.LLMCall, report: RedactionReport) -> schema.LLMCall:
        tokenizer = self._tokenizer
        changes: dict[str, Any] = {}
        before = sum(report.findings.values())
        text = tokenizer.decode(llm.input_ids.tolist())
        cleaned = self.redact_text(text, report) if self.might_match(text) else text
        if sum(report.findings.values()) > before:
            changes["input_ids"] = np.asarray(tokenizer.encode(cleaned), np.int32)
        before = sum(report.findings.values())
        text = tokenizer.decode(llm.output_ids.tolist())
        cleaned = self.redact_text(text, report) if self.might_match(text) else text
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


_NOT_SECRET = object()


def _map_strings(
    record: Any,
    fn: Callable[[str], str],
    skip: tuple[str, ...] = (),
    items: Callable[[Any, Any], Any] | None = None,
) -> Any:
    """Applies `fn` to every string reachable from a schema record, except fields in `skip`.

    `items(key, value)` sees each mapping item first; unless it returns `_NOT_SECRET`, its
    result replaces the value.
    """
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
            new = _map_strings(value, fn, skip, items)
            if new is not value:
                changes[field.name] = new
        return dataclasses.replace(record, **changes) if changes else record
    if isinstance(record, Mapping):
        mapped = {}
        for key, value in record.items():
            new = _NOT_SECRET if items is None else items(key, value)
            if new is _NOT_SECRET:
                new = _map_strings(value, fn, skip, items)
            mapped[fn(key) if isinstance(key, str) else key] = new
        return mapped
    if isinstance(record, (list, tuple)):
        mapped = [_map_strings(v, fn, skip, items) for v in record]
        return tuple(mapped) if isinstance(record, tuple) else mapped
    return record
