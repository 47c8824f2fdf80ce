"""Event records: one step `e_t = <o, h, a, y, r, m>` of a trajectory.

`observation` (o), `hidden` (h), `action` (a), `result` (y), `rewards` (r) and `metadata` (m),
plus the lossless LLM call when the event is one. Validated on construction; errors name the
field. Re-exported by `atdp_io.schema`, the module to import from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from atdp_io.enums import ActionKind, EventKind, RedactionStatus, ReplayClass, Verdict
from atdp_io.validation import (
    as_array,
    check_enum,
    check_finite,
    check_int,
    check_str,
    fail,
)


@dataclasses.dataclass(frozen=True)
class DecodingParams:
    """Sampling parameters of an LLM call (top_k 0 means off)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_finite("decoding.temperature", self.temperature, nonneg=True)
        check_finite("decoding.top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise fail("decoding.top_p", f"must be in (0, 1], got {self.top_p}")
        check_int("decoding.top_k", self.top_k, minimum=0)
        check_int("decoding.max_tokens", self.max_tokens, optional=True, minimum=1)
        check_int("decoding.seed", self.seed, optional=True)
        object.__setattr__(self, "stop", tuple(self.stop))
        for i, stop in enumerate(self.stop):
            check_str(f"decoding.stop[{i}]", stop)


@dataclasses.dataclass(frozen=True, eq=False)
class LLMCall:
    """One lossless policy call.

    Shapes: `input_ids [P] int32` (every token the model was given), `output_ids [N] int32`,
    `output_logprobs [N] float32` (log-prob of each sampled token at temperature 1 under the
    generating weights), `output_versions [N] int32` (the policy version that sampled each token;
    defaults to `policy_version`, differs within a call when generation was interrupted by a
    weight update), `loss_mask [N] int8` (defaults to ones; zero where redaction rewrote tokens).
    """

    model_id: str
    policy_version: int
    input_ids: np.ndarray
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    decoding: DecodingParams = dataclasses.field(default_factory=DecodingParams)
    prompt_template_fingerprint: str = ""
    system_prompt_version: str = ""
    tools: tuple[Mapping[str, Any], ...] = ()
    finish_reason: str = ""
    output_versions: np.ndarray | None = None
    loss_mask: np.ndarray | None = None

    def __post_init__(self):
        check_str("llm.model_id", self.model_id, nonempty=True)
        check_int("llm.policy_version", self.policy_version, minimum=0)
        object.__setattr__(self, "policy_version", int(self.policy_version))
        set_ = object.__setattr__
        set_(self, "input_ids", as_array("llm.input_ids", self.input_ids, np.int32))
        set_(self, "output_ids", as_array("llm.output_ids", self.output_ids, np.int32))
        logprobs = as_array("llm.output_logprobs", self.output_logprobs, np.float32)
        set_(self, "output_logprobs", logprobs)
        n_out = self.output_ids.shape[0]
        if self.input_ids.shape[0] == 0:
            raise fail("llm.input_ids", "must not be empty")
        if self.input_ids.size and self.input_ids.min() < 0:
            raise fail("llm.input_ids", "token ids must be >= 0")
        if n_out and self.output_ids.min() < 0:
            raise fail("llm.output_ids", "token ids must be >= 0")
        if logprobs.shape[0] != n_out:
            raise fail("llm.output_logprobs", f"length {logprobs.shape[0]} != output_ids {n_out}")
        if n_out and not (np.all(np.isfinite(logprobs)) and logprobs.max() <= 1e-4):
            raise fail("llm.output_logprobs", "log-probs must be finite and <= 0")
        versions = as_array("llm.output_versions", self.output_versions, np.int32, allow_none=True)
        if versions is None:
            versions = np.full(n_out, self.policy_version, np.int32)
        elif versions.shape[0] != n_out:
            raise fail("llm.output_versions", f"length {versions.shape[0]} != output_ids {n_out}")
        elif n_out and versions.min() < 0:
            raise fail("llm.output_versions", "versions must be >= 0")
        set_(self, "output_versions", versions)
        mask = as_array("llm.loss_mask", self.loss_mask, np.int8, allow_none=True)
        if mask is None:
            mask = np.ones(n_out, np.int8)
        elif mask.shape[0] != n_out:
            raise fail("llm.loss_mask", f"length {mask.shape[0]} != output_ids {n_out}")
        elif n_out and not np.all((mask == 0) | (mask == 1)):
            raise fail("llm.loss_mask", "must hold only 0 and 1")
        set_(self, "loss_mask", mask)
        check_str("llm.prompt_template_fingerprint", self.prompt_template_fingerprint)
        check_str("llm.system_prompt_version", self.system_prompt_version)
        check_str("llm.finish_reason", self.finish_reason)
        set_(self, "tools", tuple(self.tools))
        for i, tool in enumerate(self.tools):
            if not isinstance(tool, Mapping):
                raise fail(f"llm.tools[{i}]", "expected a JSON object (tool schema)")
        if not isinstance(self.decoding, DecodingParams):
            raise fail("llm.decoding", "expected DecodingParams")

    @property
    def context_ids(self) -> np.ndarray:
        """`[P + N] int32`: the input followed by the sampled output."""
        return np.concatenate([self.input_ids, self.output_ids])


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A typed tool invocation and its decision context (schema, version, permission scope)."""

    name: str
    arguments: Mapping[str, Any]
    call_id: str = ""
    version: str = ""
    argument_schema: Mapping[str, Any] | None = None
    permission_scope: str = ""

    def __post_init__(self):
        check_str("tool_call.name", self.name, nonempty=True)
        if not isinstance(self.arguments, Mapping):
            raise fail(f"tool_call[{self.name}].arguments", "expected a JSON object")
        if self.argument_schema is not None and not isinstance(self.argument_schema, Mapping):
            raise fail(f"tool_call[{self.name}].argument_schema", "expected a JSON object")
        for field in ("call_id", "version", "permission_scope"):
            check_str(f"tool_call[{self.name}].{field}", getattr(self, field))


@dataclasses.dataclass(frozen=True)
class Action:
    """The chosen action `a`: a message, an environment command, or typed tool calls."""

    kind: ActionKind
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def __post_init__(self):
        check_enum("action.kind", self.kind, ActionKind)
        check_str("action.text", self.text)
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        for i, call in enumerate(self.tool_calls):
            if not isinstance(call, ToolCall):
                raise fail(f"action.tool_calls[{i}]", "expected ToolCall")
        if self.kind == ActionKind.TOOL_CALLS and not self.tool_calls:
            raise fail("action.tool_calls", "kind 'tool_calls' needs at least one ToolCall")
        if self.kind != ActionKind.TOOL_CALLS and self.tool_calls:
            raise fail("action.tool_calls", f"kind '{self.kind}' must not carry tool calls")


@dataclasses.dataclass(frozen=True)
class Reward:
    """One reward signal; `source` names its channel (env, user_feedback, tests, ...)."""

    value: float
    source: str = "env"

    def __post_init__(self):
        check_finite("reward.value", self.value)
        check_str("reward.source", self.source, nonempty=True)


@dataclasses.dataclass(frozen=True)
class EventMetadata:
    """`m`: cost and provenance of one event. Times in unix seconds, cost in US dollars."""

    timestamp: float | None = None
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    session_id: str = ""
    interaction_id: str = ""
    harness_fingerprint: str = ""
    model_id: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The composite policy that produced the event (serving/control): its version (None: not
    # served under one), the fingerprint of its memory, the versions of the tool schemas it
    # overrode (tool name -> version) and the policy it names. Absent in older records.
    composite_version: int | None = None
    memory_version: str = ""
    tool_schema_versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    policy_version: str = ""

    def __post_init__(self):
        check_finite("metadata.timestamp", self.timestamp, optional=True)
        check_finite("metadata.latency_s", self.latency_s, optional=True, nonneg=True)
        check_int("metadata.prompt_tokens", self.prompt_tokens, optional=True, minimum=0)
        check_int("metadata.completion_tokens", self.completion_tokens, optional=True, minimum=0)
        check_finite("metadata.cost_usd", self.cost_usd, optional=True, nonneg=True)
        for field in ("session_id", "interaction_id", "harness_fingerprint", "model_id"):
            check_str(f"metadata.{field}", getattr(self, field))
        if not isinstance(self.extra, Mapping):
            raise fail("metadata.extra", "expected a JSON object")
        check_int("metadata.composite_version", self.composite_version, optional=True, minimum=0)
        check_str("metadata.memory_version", self.memory_version)
        check_str("metadata.policy_version", self.policy_version)
        if not isinstance(self.tool_schema_versions, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.tool_schema_versions.items()
        ):
            raise fail("metadata.tool_schema_versions", "expected a mapping tool name -> version")


@dataclasses.dataclass(frozen=True, eq=False)
class Event:
    """One step `<o, h, a, y, r, m>` plus the lossless LLM call when `kind` is LLM_CALL.

    `observation`, `hidden` and `result` are JSON values (text or structured). `error_class`
    names a tool or environment failure; `verdict` is the initial judgement of a tool result
    (later judgements are `VerdictUpdate` annotations).
    """

    kind: EventKind
    replay: ReplayClass
    observation: Any = None
    hidden: Any = None
    action: Action | None = None
    result: Any = None
    rewards: tuple[Reward, ...] = ()
    metadata: EventMetadata = dataclasses.field(default_factory=EventMetadata)
    llm: LLMCall | None = None
    error_class: str = ""
    verdict: Verdict = Verdict.UNKNOWN
    redaction: RedactionStatus = RedactionStatus.UNSCANNED

    def __post_init__(self):
        check_enum("event.kind", self.kind, EventKind)
        check_enum("event.replay", self.replay, ReplayClass)
        check_enum("event.verdict", self.verdict, Verdict)
        check_enum("event.redaction", self.redaction, RedactionStatus)
        check_str("event.error_class", self.error_class)
        object.__setattr__(self, "rewards", tuple(self.rewards))
        for i, reward in enumerate(self.rewards):
            if not isinstance(reward, Reward):
                raise fail(f"event.rewards[{i}]", "expected Reward")
        if self.action is not None and not isinstance(self.action, Action):
            raise fail("event.action", "expected Action or None")
        if not isinstance(self.metadata, EventMetadata):
            raise fail("event.metadata", "expected EventMetadata")
        if self.kind == EventKind.LLM_CALL:
            if not isinstance(self.llm, LLMCall):
                raise fail("event.llm", "an llm_call event needs an LLMCall")
        elif self.llm is not None:
            raise fail("event.llm", f"only llm_call events carry an LLMCall, not '{self.kind}'")
        if self.kind == EventKind.TOOL_CALL and (
            self.action is None or self.action.kind != ActionKind.TOOL_CALLS
        ):
            raise fail("event.action", "a tool_call event needs an action of kind 'tool_calls'")
