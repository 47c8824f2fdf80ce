"""What a failure analysis needs to know about one ATDP trajectory (pure, no I/O).

`facts(trajectory)` reads a decoded trajectory into `TrajectoryFacts`: its tenant, task (env,
task id, task type, task sentence), outcome, the composite version that served it, and the
symptoms of what went wrong -- replies the env's harness cannot parse (format), commands the
env refused (with the env's feedback, e.g. ALFWorld's "Nothing happens."), tool calls that
failed (tool name, error), other error classes, and how the episode ended.

Two recordings are read:
- the serving gateway's (an agent through `/v1/chat/completions`): `message` events (the
  prompts the model saw), `llm_call` events (the raw replies). The feedback to reply k is the
  current observation of prompt k + 1, read back by the env's harness (`read_prompt`); a
  refused command is one whose feedback is one of the env's refusal texts.
- the rollout engine's: `llm_call` then `env_step` per turn; the env step says whether the reply
  parsed and the command was admissible.

A trajectory whose header names no registered env (a tool-calling agent) has no env steps; its
symptoms come from event error classes and tool-call events.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from atdp_io import EventKind, Trajectory
from sao_jax.envs.alfworld.texts import NOTHING_HAPPENS
from sao_jax.envs.arithmetic.env import NOT_A_NUMBER, UNKNOWN_ACTION
from sao_jax.envs.base import PromptHarness
from sao_jax.envs.registry import env_class, env_names

# The env's answer to a command it does not accept, per env: what marks a refused command in a
# gateway recording (which has no env_step events carrying `admissible`).
REFUSAL_FEEDBACK: Mapping[str, tuple[str, ...]] = {
    "alfworld": (NOTHING_HAPPENS,),
    "arithmetic": (UNKNOWN_ACTION, NOT_A_NUMBER),
}
# llm_call error classes that mean the reply itself was malformed (not a tool's failure)
FORMAT_ERRORS = ("malformed_tool_call",)
_DIGITS = re.compile(r"\d+")


@dataclasses.dataclass(frozen=True)
class TrajectoryFacts:
    """One trajectory as the failure analysis sees it.

    success: the outcome (None: the trajectory is open or its outcome unknown).
    version: the composite version every llm_call was served under (None: none recorded, or
      the version changed within the trajectory; `versions` lists them in order).
    final_state: "success", "step_limit", "truncated[:by]", "ended" (the episode ended without
      success), "unlabelled" (closed without a success flag) or "open".
    format_errors: one entry per reply the harness could not parse (the parse error).
    refused: (command, feedback) per command the env refused.
    tool_errors: (tool name, error) per failed tool call.
    errors: other error classes of events (e.g. generation_error).
    actions / observations: the commands taken ("" for a malformed reply) and what the agent
      saw before each (for analyzers).
    memory_notes: ids of the memory notes retrieved into its prompts.
    tools: tool name -> the function spec (description, parameters) the model was shown.
    """

    trajectory_id: str
    tenant: str
    session_id: str
    created_at: float
    env: str
    task_id: str
    task_type: str
    task_text: str
    task: Mapping[str, Any]
    resettable: bool
    success: bool | None
    final_state: str
    steps: int
    versions: tuple[int, ...]
    version: int | None
    format_errors: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    tool_errors: tuple[tuple[str, str], ...] = ()
    errors: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    observations: tuple[str, ...] = ()
    memory_notes: tuple[str, ...] = ()
    tools: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


def normalized(text: str, words: int = 8) -> str:
    """A feedback or error text as a mode key: its first `words` words, numbers as #."""
    return " ".join(_DIGITS.sub("#", str(text)).split()[:words])


def _harness(env: str) -> PromptHarness | None:
    return env_class(env).harness if env in env_names() else None


def _content(event) -> str:
    observation = event.observation
    if isinstance(observation, Mapping):
        return str(observation.get("content") or "")
    return "" if observation is None else str(observation)


def _served_versions(trajectory: Trajectory) -> tuple[int, ...]:
    calls = [e for e in trajectory.events if e.kind == EventKind.LLM_CALL] or trajectory.events
    seen: list[int] = []
    for event in calls:
        v = event.metadata.composite_version
        if v is not None and v not in seen:
            seen.append(v)
    return tuple(seen)


def served_version(trajectory: Trajectory) -> int | None:
    """The composite version that served all of the trajectory's llm calls (None: none
    recorded, or more than one: a promotion happened mid-session)."""
    versions = _served_versions(trajectory)
    return versions[0] if len(versions) == 1 else None


class _Steps:
    """Collects the per-turn symptoms while walking the events."""

    def __init__(self, env: str, think: bool):
        self.harness = _harness(env)
        self.refusals = REFUSAL_FEEDBACK.get(env, ())
        self.think = think
        self.actions: list[str] = []
        self.observations: list[str] = []
        self.format_errors: list[str] = []
        self.refused: list[tuple[str, str]] = []
        self.tool_errors: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.task_text = ""
        self._pending: str | None = None  # a gateway reply's command awaiting its feedback
        self._prompt = ""

    def prompt(self, text: str) -> None:
        """A user message: the next turn's prompt, carrying the feedback to the last reply."""
        self._prompt = text
        if self.harness is None:
            return
        task, observations = self.harness.read_prompt(text)
        self.task_text = self.task_text or task
        if self._pending is not None and observations:
            self._feedback(self._pending, observations[-1])
        self._pending = None

    def _feedback(self, command: str, feedback: str) -> None:
        if command and feedback.strip() in self.refusals:
            self.refused.append((command, feedback.strip()))

    def llm_call(self, event, has_env_steps: bool) -> None:
        self.notes += list(event.metadata.extra.get("memory_notes", ()))
        for tool in event.llm.tools:
            function = tool.get("function", tool)
            if isinstance(function, Mapping) and function.get("name"):
                self.tools[str(function["name"])] = dict(function)
        if event.error_class in FORMAT_ERRORS:
            self.format_errors.append(event.error_class)
        elif event.error_class.startswith("malformed_tool"):
            names = [c.name for c in event.action.tool_calls] if event.action else []
            self.tool_errors.append((names[0] if names else "unknown_tool", event.error_class))
        elif event.error_class:
            self.errors.append(event.error_class)
        text = event.action.text if event.action else ""
        if has_env_steps or self.harness is None:
            self.actions.append(text)  # the rollout records the parsed command itself
            self.observations.append(_content(event))
            return
        parsed = self.harness.parse_reply(text, think=self.think)
        if not parsed.valid:
            self.format_errors.append(parsed.error or "malformed reply")
        command = parsed.action if parsed.valid else ""
        self.actions.append(command)
        observations = self.harness.read_prompt(self._prompt)[1]
        self.observations.append(observations[-1] if observations else "")
        self._pending = command

    def env_step(self, event) -> None:
        result = event.result if isinstance(event.result, Mapping) else {}
        if result.get("invalid_reply"):
            self.format_errors.append(str(result.get("parse_error") or "malformed reply"))
        elif result.get("admissible") is False:
            command = event.action.text if event.action else ""
            self.refused.append((command, str(event.observation or "").strip()))

    def tool_call(self, event) -> None:
        if event.error_class:
            name = event.action.tool_calls[0].name if event.action else "unknown_tool"
            # a tool the agent reported on /rl/event carries its own error text
            error = event.metadata.extra.get("error") or event.error_class
            self.tool_errors.append((name, str(error)))


def _final_state(trajectory: Trajectory, steps: int, max_steps: int | None) -> str:
    outcome = trajectory.outcome
    if outcome is None:
        return "open"
    if outcome.success is None:
        return "unlabelled"
    if outcome.success:
        return "success"
    truncated_by = outcome.info.get("truncated_by") if outcome.info else None
    if truncated_by and truncated_by != "max_steps":
        return f"truncated:{truncated_by}"
    if max_steps is not None and steps >= max_steps:
        return "step_limit"
    return "ended" if outcome.terminated else "truncated"


def facts(trajectory: Trajectory) -> TrajectoryFacts:
    """The `TrajectoryFacts` of a decoded trajectory (see the module docstring)."""
    header = trajectory.header
    task = dict(header.task)
    env = str(task.get("env", "")) if task.get("env", "") in env_names() else ""
    steps = _Steps(env, bool(task.get("think", False)))
    has_env_steps = any(e.kind == EventKind.ENV_STEP for e in trajectory.events)
    n_calls = 0
    for event in trajectory.events:
        if event.kind == EventKind.MESSAGE:
            if isinstance(event.observation, Mapping) and event.observation.get("role") == "user":
                steps.prompt(_content(event))
        elif event.kind == EventKind.LLM_CALL:
            n_calls += 1
            steps.llm_call(event, has_env_steps)
        elif event.kind == EventKind.ENV_STEP:
            steps.env_step(event)
        elif event.kind == EventKind.TOOL_CALL:
            steps.tool_call(event)
        elif event.error_class:
            steps.errors.append(event.error_class)
    versions = _served_versions(trajectory)
    success = trajectory.outcome.success if trajectory.outcome is not None else None
    max_steps = task.get("max_steps")
    task_text = str(task.get("sentence", "")) or steps.task_text
    task_type = str(task.get("task_type", ""))
    if not task_type and task_text and steps.harness is not None:
        task_type = steps.harness.task_type_of(task_text)
    task_id = str(task.get("game_id") or task.get("task_id") or "")
    if not task_id and env and "index" in task:
        task_id = f"{env}-{task.get('split', '')}-{task['index']}"
    return TrajectoryFacts(
        trajectory_id=trajectory.trajectory_id,
        tenant=header.governance.tenant,
        session_id=header.session_id,
        created_at=header.created_at,
        env=env,
        task_id=task_id or task_text,
        task_type=task_type,
        task_text=task_text,
        task=task,
        resettable=bool(env) and "split" in task and "index" in task,
        success=success,
        final_state=_final_state(trajectory, n_calls, max_steps),
        steps=n_calls,
        versions=versions,
        version=versions[0] if len(versions) == 1 else None,
        format_errors=tuple(steps.format_errors),
        refused=tuple(steps.refused),
        tool_errors=tuple(steps.tool_errors),
        errors=tuple(steps.errors),
        actions=tuple(steps.actions),
        observations=tuple(steps.observations),
        memory_notes=tuple(dict.fromkeys(steps.notes)),
        tools=steps.tools,
    )
