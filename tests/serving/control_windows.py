"""Test helpers for the control plane: ALFWorld episodes played for real and written into a
real ATDP store as the gateway records them, and agents that stand in for a model.

`record_episode` plays an ALFWorld game (the real env, its real prompts) with a reply function
and writes the trajectory the way the data proxy does for an agent behind the gateway: per turn
a `message` event (the user prompt) and an `llm_call` event (the raw reply), every event
attributed to a composite version, the outcome on close. `tool_episode` writes a tool-calling
session (no env) whose tool calls may fail.

The agents answer the messages a model would see (`apply_chat` already applied): they know a
game's solution (the oracle expert's commands, computed on a copy of the game beforehand) only
when their context says so, and write the reply format their context asks for.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    AtdpStore,
    Event,
    EventKind,
    EventMetadata,
    Governance,
    LLMCall,
    Outcome,
    ReplayClass,
    ToolCall,
    Trajectory,
    TrajectoryHeader,
)
from sao_jax.envs.alfworld import AlfworldEnv
from sao_jax.envs.base import PromptOptions, tagged_reply
from sao_jax.envs.prompted import PromptedEnv
from serving.common.ids import opaque_id
from serving.control.apply import MEMORY_HEADER

SPLIT, SIZE, MAX_STEPS, HISTORY = "train", "small", 12, 1
_STEP = re.compile(r"you have already taken (\d+) step")
_TASK = re.compile(r"Your task is to: (.*?)\.\n")


def task_spec(index: int, **extra) -> dict:
    """The header.task the online agent records for ALFWorld game `index`."""
    env = AlfworldEnv(SPLIT, size=SIZE, max_steps=MAX_STEPS)
    _, info = env.reset(index)
    return {
        "env": "alfworld", "split": SPLIT, "index": index, "size": SIZE, "phrasing": "0.4.2",
        "max_steps": MAX_STEPS, "layout": "windowed", "history_length": HISTORY,
        "task_type": info["task_type"], "game_id": info["task_id"], **extra,
    }  # fmt: skip


@functools.cache
def solution(index: int) -> tuple[str, tuple[str, ...]]:
    """(task sentence, the oracle expert's winning commands) of game `index`."""
    env = AlfworldEnv(SPLIT, size=SIZE, max_steps=MAX_STEPS, expert="oracle")
    _, info = env.reset(index)
    commands = []
    done = False
    while not done:
        command = env.expert_action()
        commands.append(command)
        _, _, done, info = env.step(command)
    assert info["won"], f"the oracle does not win game {index} in {MAX_STEPS} steps"
    return info["task"], tuple(commands)


def winnable_games(n: int, *, start: int = 0, types: int | None = None) -> list[int]:
    """The first `n` game indices from `start` the oracle wins within MAX_STEPS (each of a
    new task type while fewer than `types` types are covered, when given)."""
    out, seen = [], set()
    index = start
    while len(out) < n:
        try:
            solution(index)
        except AssertionError:
            index += 1
            continue
        kind = task_spec(index)["task_type"]
        if types is None or kind not in seen or len(seen) >= types:
            out.append(index)
            seen.add(kind)
        index += 1
    return out


Reply = Callable[[str, int, str | None], str]  # (prompt, step, expert command) -> reply


def expert_reply(prompt: str, step: int, command: str | None) -> str:
    return tagged_reply(command or "look", think=False)


def untagged_reply(prompt: str, step: int, command: str | None) -> str:
    return command or "look"


def wandering_reply(prompt: str, step: int, command: str | None) -> str:
    return tagged_reply("look", think=False)


def refused_reply(prompt: str, step: int, command: str | None) -> str:
    return tagged_reply("fly to the moon", think=False)


def _metadata(session_id: str, version: int | None, extra: Mapping | None = None):
    fields = {} if version is None else {"composite_version": version}
    return EventMetadata(
        timestamp=time.time(), session_id=session_id, extra=dict(extra or {}), **fields
    )


def llm_call(reply: str, tools: Sequence[Mapping] = ()) -> LLMCall:
    n = max(1, len(reply.split()))
    return LLMCall(
        model_id="sao-test",
        policy_version=0,
        input_ids=np.arange(1, 9, dtype=np.int32),
        output_ids=np.arange(1, n + 1, dtype=np.int32),
        output_logprobs=np.full(n, -0.1, np.float32),
        tools=tuple(tools),
        finish_reason="stop",
    )


def _header(tenant: str, task: Mapping, created_at: float | None) -> TrajectoryHeader:
    session_id = opaque_id()  # as the gateway names sessions (never mistaken for a secret)
    return TrajectoryHeader(
        trajectory_id=session_id,
        governance=Governance.synthetic(tenant, expires_at=None),
        created_at=time.time() if created_at is None else created_at,
        session_id=session_id,
        task=dict(task),
    )


def record_episode(
    store: AtdpStore,
    tenant: str,
    index: int,
    reply: Reply,
    *,
    version: int | None = 1,
    created_at: float | None = None,
) -> Trajectory:
    """Play ALFWorld game `index` with `reply` and write it as the gateway records it."""
    task = task_spec(index)
    env = AlfworldEnv(SPLIT, size=SIZE, max_steps=MAX_STEPS, expert="oracle")
    prompted = PromptedEnv(env, PromptOptions(history_length=HISTORY))
    prompt, info = prompted.reset(index)
    header = _header(tenant, task, created_at)
    events, done, step = [], False, 0
    while not done:
        text = reply(prompt, step, env.expert_action())
        events.append(Event(EventKind.MESSAGE, ReplayClass.NON_REPLAYABLE,
                            observation={"role": "user", "content": prompt},
                            metadata=_metadata(header.session_id, version)))  # fmt: skip
        events.append(Event(EventKind.LLM_CALL, ReplayClass.DETERMINISTIC,
                            action=Action(ActionKind.MESSAGE, text=text), llm=llm_call(text),
                            metadata=_metadata(header.session_id, version,
                                               {"context_rewritten": step > 0})))  # fmt: skip
        prompt, _, done, info = prompted.step(text)
        step += 1
    outcome = Outcome(success=bool(info["won"]), info={"steps": step})
    trajectory = Trajectory(header, tuple(events), outcome)
    with store.writer(tenant) as writer:
        writer.append([trajectory])
    return trajectory


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def tool_episode(
    store: AtdpStore, tenant: str, *, fails: bool, version: int | None = 1, task_type="weather"
) -> Trajectory:
    """A tool-calling session: the model calls get_weather; the agent reports the call on
    /rl/event (with an error when `fails`); the session succeeds when the call did."""
    header = _header(tenant, {"task_type": task_type}, None)
    sid = header.session_id
    arguments = {} if fails else {"city": "Paris"}
    call = ToolCall("get_weather", arguments, call_id="call-1")
    extra = {"event_type": "tool", "reported": True}
    if fails:
        extra["error"] = "missing required argument 'city'"
    events = [
        Event(EventKind.MESSAGE, ReplayClass.NON_REPLAYABLE,
              observation={"role": "user", "content": "What is the weather in Paris?"},
              metadata=_metadata(sid, version)),
        Event(EventKind.LLM_CALL, ReplayClass.DETERMINISTIC,
              action=Action(ActionKind.TOOL_CALLS, tool_calls=(call,)),
              llm=llm_call("call", (WEATHER_TOOL,)), metadata=_metadata(sid, version)),
        Event(EventKind.TOOL_CALL, ReplayClass.APPROXIMATE,
              action=Action(ActionKind.TOOL_CALLS, tool_calls=(call,)),
              result=None if fails else "12 C", metadata=_metadata(sid, version, extra),
              error_class="tool_error" if fails else ""),
    ]  # fmt: skip
    trajectory = Trajectory(header, tuple(events), Outcome(success=not fails))
    with store.writer(tenant) as writer:
        writer.append([trajectory])
    return trajectory


# --------------------------------------------------------------------------- agents


def _system_text(messages: Sequence[Mapping]) -> str:
    return "\n".join(
        str(m.get("content") or "") for m in messages if m.get("role") in ("system", "developer")
    )


def _prompt(messages: Sequence[Mapping]) -> str:
    return next(str(m["content"]) for m in reversed(messages) if m.get("role") == "user")


def _shared_start(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


class ContextAgent:
    """A stand-in for a model that follows its context.

    knows: "all" (it knows every game's solution), "notes" (only a game whose task a retrieved
    memory note names), or a set of policy versions under which it knows all. Without the
    solution it looks around (`look`) until the step limit, or, with `refuses`, tries a
    command the game does not accept. It wraps the command in `<action>` tags unless
    `needs_format` and no reply-format instruction is in its system text; an instruction to
    drop the tags ("without tags") is obeyed. With `drifts`, the command it means comes out
    with a word too many (" now"), which the game refuses.

    Kept to a choice list (the harness's `reply_choices`), it says the allowed reply that
    shares the longest beginning with what it would have said (the first one on a tie), as a
    token mask keeps a model on its own words as far as the list allows.
    """

    def __init__(
        self, games: Sequence[int], *, knows="all", needs_format=False, refuses=False, drifts=False
    ):
        self.solutions = dict(solution(g) for g in games)
        self.knows, self.needs_format, self.refuses = knows, needs_format, refuses
        self.drifts = drifts

    def _knows(self, task: str, system: str, policy) -> bool:
        if self.knows == "all":
            return True
        if self.knows == "notes":
            return MEMORY_HEADER in system and f"{task}:" in system
        return policy.version in self.knows

    def __call__(self, messages: Sequence[Mapping], policy, choices=None) -> str:
        reply = self._reply(messages, policy)
        if choices is None or reply in choices:
            return reply
        shared = [_shared_start(reply, choice) for choice in choices]
        return choices[shared.index(max(shared))]

    def _reply(self, messages: Sequence[Mapping], policy) -> str:
        prompt, system = _prompt(messages), _system_text(messages)
        task = _TASK.search(prompt).group(1)
        step = int(m.group(1)) if (m := _STEP.search(prompt)) else 0
        commands = self.solutions.get(task, ())
        if self._knows(task, system, policy) and step < len(commands):
            command = commands[step] + (" now" if self.drifts else "")
        else:
            command = "fly to the moon" if self.refuses else "look"
        if "without tags" in system:
            return command
        if self.needs_format and "Answer with exactly one action in this format" not in system:
            return command
        return tagged_reply(command, think=False)
