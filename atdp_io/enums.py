"""The closed vocabularies of ATDP records (string enums, stored by value)."""

from enum import StrEnum


class EventKind(StrEnum):
    LLM_CALL = "llm_call"  # the policy was called; `llm` holds the lossless call
    TOOL_CALL = "tool_call"  # a tool ran; `action` holds the call, `result` its return object
    ENV_STEP = "env_step"  # an environment consumed an action and produced an observation
    MESSAGE = "message"  # a user / human / system message entered the episode
    RETRIEVAL = "retrieval"  # retrieved snippets entered the context


class ReplayClass(StrEnum):
    DETERMINISTIC = "deterministic"  # re-running the recorded inputs reproduces the record
    APPROXIMATE = "approximate"  # can be re-run, outcome may differ (stochastic env, live tool)
    NON_REPLAYABLE = "non_replayable"  # side effects or a human in the loop


class Classification(StrEnum):
    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    RESTRICTED = "restricted"


class LegalBasis(StrEnum):
    CONSENT = "consent"
    CONTRACT = "contract"
    LEGITIMATE_INTEREST = "legitimate_interest"
    SYNTHETIC = "synthetic"  # simulated environments: no data subject
    NONE = "none"


class ConsentStatus(StrEnum):
    GRANTED = "granted"
    DENIED = "denied"
    WITHDRAWN = "withdrawn"
    NOT_APPLICABLE = "not_applicable"


class ReviewStatus(StrEnum):
    NOT_REQUIRED = "not_required"
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class RedactionStatus(StrEnum):
    """Set by the writer's redactor, never by the caller."""

    UNSCANNED = "unscanned"  # not yet through a redactor (only before the writer sees it)
    TEXT_ONLY = "text_only"  # text fields scanned and cleaned; token streams not scanned
    CLEAN = "clean"  # text and token streams scanned, nothing found
    REDACTED = "redacted"  # findings were replaced before the record touched disk


class Verdict(StrEnum):
    UNKNOWN = "unknown"
    TRUSTED = "trusted"
    IGNORED = "ignored"
    CORRECTED = "corrected"
    CONTRADICTED = "contradicted"


class ActionKind(StrEnum):
    MESSAGE = "message"  # free text to a user or another agent
    COMMAND = "command"  # a text action for an environment (e.g. an ALFWorld command)
    TOOL_CALLS = "tool_calls"  # one or more typed tool calls
