"""Deterministic re-scoring: the recorded actions' log-probs under a candidate's context.

The gateway records what the model saw (the composite applied) and the tokens it sampled. For
each llm call of a trajectory, `recorded_calls` rebuilds the client's own conversation (the
served composite's additions taken out: memory messages, the harness system text) and keeps the
sampled output ids. A `ContextScorer` then scores those same output ids after the conversation
as another composite would show it: its harness, memory and tools applied, its policy's
weights (`model_scorer`: a real model and its tokenizer's chat template, as the data proxy
renders prompts).

`rescore_evidence` compares candidate and current composite on the calls of successful
trajectories (known-good actions): the per-trajectory mean log-prob per token, paired, with a
bootstrap interval. It is a veto: a candidate under which known-good actions become clearly
less likely (interval below `-tolerance`) is "worse"; re-scoring recorded tokens cannot show
that another action would have succeeded, so it never says "better" (replay and canary do).

Approximations, by construction: a conversation whose context the agent rewrote keeps only a
leading system message of the earlier one (the proxy records only the messages it had not
seen); a client system message the served harness replaced ("replace" mode) is lost; a tool the
served composite re-described keeps that description unless the candidate sets its own.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atdp_io import ActionKind, EventKind, Trajectory
from serving.control.apply import MEMORY_HEADER, apply_chat
from serving.control.composite import CompositePolicy, CompositeSpec, PolicyRef
from serving.control.evidence import Evidence, judge, skipped
from serving.control.stats import bootstrap_mean


@dataclasses.dataclass(frozen=True, eq=False)
class RecordedCall:
    """One recorded llm call: the client's messages and tools, output ids [N] int32 and loss
    mask [N] (0 where redaction rewrote tokens), and its trajectory's outcome."""

    trajectory_id: str
    event_index: int
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None
    output_ids: np.ndarray
    loss_mask: np.ndarray
    success: bool | None


# (composite spec, calls) -> per call, log p(output token | prompt under the spec) [N] float32
ContextScorer = Callable[[CompositeSpec, Sequence[RecordedCall]], list[np.ndarray]]


def client_view(
    messages: Sequence[Mapping[str, Any]], served: CompositeSpec | None
) -> list[dict[str, Any]]:
    """The messages as the client sent them, from the messages the model saw under `served`
    (see the module docstring for what cannot be recovered)."""
    out = [
        dict(m)
        for m in messages
        if not (m.get("role") == "system" and str(m.get("content", "")).startswith(MEMORY_HEADER))
    ]
    if served is None or not served.harness.edits_system or not out:
        return out
    if out[0].get("role") not in ("system", "developer"):
        return out
    harness = served.harness
    if harness.system_mode == "replace":
        return out[1:]
    text = str(out[0].get("content") or "")
    if harness.system_prompt and text.startswith(harness.system_prompt):
        text = text[len(harness.system_prompt) :].removeprefix("\n\n")
    tail = "\n\n".join(i for i in harness.instructions if i)
    if tail and text.endswith(tail):
        text = text[: -len(tail)].removesuffix("\n\n")
    if not text:
        return out[1:]  # the harness's own system message: the client sent none
    return [{**out[0], "content": text}, *out[1:]]


def _message(observation: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": observation["role"], "content": observation.get("content")}
    if observation.get("name"):
        message["name"] = observation["name"]
    if observation.get("tool_calls"):
        message["tool_calls"] = [_openai_call(c) for c in observation["tool_calls"]]
    return message


def _openai_call(call: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": call.get("call_id", ""),
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
    }


def _echo(event) -> dict[str, Any]:
    """The assistant message a client sends back for a recorded reply."""
    action = event.action
    message: dict[str, Any] = {"role": "assistant", "content": action.text if action else ""}
    if action is not None and action.kind == ActionKind.TOOL_CALLS:
        message["tool_calls"] = [
            _openai_call({"call_id": c.call_id, "name": c.name, "arguments": dict(c.arguments)})
            for c in action.tool_calls
        ]
    return message


def recorded_calls(trajectory: Trajectory, served: CompositeSpec | None) -> list[RecordedCall]:
    """Every llm call of a gateway-recorded trajectory with its client conversation (empty
    for a trajectory without message events: nothing to rebuild the conversation from)."""
    events = trajectory.events
    if not any(e.kind == EventKind.MESSAGE for e in events):
        return []
    success = trajectory.outcome.success if trajectory.outcome is not None else None
    conversation: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    last_reply: dict[str, Any] | None = None
    out = []
    for index, event in enumerate(events):
        if event.kind == EventKind.MESSAGE and isinstance(event.observation, Mapping):
            pending.append(_message(event.observation))
        elif event.kind == EventKind.TOOL_CALL and event.action and event.action.tool_calls:
            result = event.result if isinstance(event.result, str) else json.dumps(event.result)
            call_id = event.action.tool_calls[0].call_id
            pending.append({"role": "tool", "tool_call_id": call_id, "content": result})
        elif event.kind == EventKind.LLM_CALL:
            if last_reply is None:
                conversation = pending
            elif event.metadata.extra.get("context_rewritten"):
                lead = conversation[:1] if conversation[:1] and conversation[0]["role"] in (
                    "system", "developer") else []  # fmt: skip
                starts_with_system = pending[:1] and pending[0]["role"] in ("system", "developer")
                conversation = pending if starts_with_system else lead + pending
            else:
                conversation = [*conversation, last_reply, *pending]
            pending, last_reply = [], _echo(event)
            llm = event.llm
            out.append(
                RecordedCall(
                    trajectory.trajectory_id,
                    index,
                    tuple(client_view(conversation, served)),
                    tuple(llm.tools) if llm.tools else None,
                    llm.output_ids,
                    llm.loss_mask,
                    success,
                )
            )
    return out


@functools.partial(jax.jit, static_argnums=0)
def _token_logprobs(graphdef, params, tokens, segments):
    """logp [B, T]: log p(tokens[:, t] | tokens[:, :t]) (column 0 is 0)."""
    model = nnx.merge(graphdef, params)
    hidden = model.forward(tokens, segment_ids=segments).hidden
    logp, _ = model.token_logprobs(hidden, jnp.roll(tokens, -1, axis=1))
    return jnp.concatenate([jnp.zeros_like(logp[:, :1]), logp[:, :-1]], axis=1)


def model_scorer(
    tokenizer,
    model_for: Callable[[PolicyRef], nnx.Module],
    *,
    batch_rows: int = 8,
    seq_bucket: int = 128,
) -> ContextScorer:
    """A `ContextScorer` of real models: `model_for(policy)` gives the model of a composite's
    `PolicyRef`; prompts are rendered with `tokenizer.encode_chat` (the proxy's rendering).
    Rows are padded to a multiple of `seq_bucket` so each length bucket compiles once."""

    def score(spec: CompositeSpec, calls: Sequence[RecordedCall]) -> list[np.ndarray]:
        graphdef, params = nnx.split(model_for(spec.policy))
        composite = CompositePolicy(tenant="rescore", version=1, spec=spec)
        rows = []
        for call in calls:
            applied = apply_chat(composite, call.messages, call.tools)
            prompt = tokenizer.encode_chat(applied.messages, tools=applied.tools)
            rows.append((np.asarray(prompt, np.int32), np.asarray(call.output_ids, np.int32)))
        out = []
        for start in range(0, len(rows), batch_rows):
            chunk = rows[start : start + batch_rows]
            longest = max(len(p) + len(o) for p, o in chunk)
            width = math.ceil(longest / seq_bucket) * seq_bucket
            tokens = np.zeros((batch_rows, width), np.int32)
            segments = np.zeros((batch_rows, width), np.int32)
            for r, (prompt, output) in enumerate(chunk):
                n = len(prompt) + len(output)
                tokens[r, :n] = np.concatenate([prompt, output])
                segments[r, :n] = 1
            logp = np.asarray(_token_logprobs(graphdef, params, tokens, segments), np.float32)
            for r, (prompt, output) in enumerate(chunk):
                out.append(logp[r, len(prompt) : len(prompt) + len(output)])
        return out

    return score


def _per_trajectory(calls: Sequence[RecordedCall], logps: Sequence[np.ndarray]) -> dict:
    """trajectory id -> mean log-prob per scored token over its calls."""
    sums: dict[str, list[float]] = {}
    for call, logp in zip(calls, logps, strict=True):
        mask = np.asarray(call.loss_mask) > 0
        entry = sums.setdefault(call.trajectory_id, [0.0, 0.0])
        entry[0] += float(np.asarray(logp)[mask].sum())
        entry[1] += float(mask.sum())
    return {t: s / n for t, (s, n) in sums.items() if n > 0}


def rescore_evidence(
    base: CompositeSpec,
    candidate: CompositeSpec,
    calls: Sequence[RecordedCall],
    scorer: ContextScorer,
    *,
    tolerance: float = 0.05,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Evidence:
    """Known-good actions' mean log-prob per token under `candidate` vs `base` (paired by
    trajectory); "worse" when the difference's interval lies below -`tolerance` nats."""
    metric = "mean_logp_known_good"
    good = [c for c in calls if c.success and int(np.asarray(c.loss_mask).sum()) > 0]
    if not good:
        return skipped("rescore", metric, "no recorded call of a successful trajectory")
    before = _per_trajectory(good, scorer(base, good))
    after = _per_trajectory(good, scorer(candidate, good))
    ids = sorted(before)
    deltas = [after[t] - before[t] for t in ids]
    delta = bootstrap_mean(deltas, confidence, resamples=resamples, seed=seed)
    return Evidence(
        "rescore",
        metric,
        judge(delta, better_above=math.inf, worse_below=-tolerance),
        baseline=bootstrap_mean([before[t] for t in ids], confidence, resamples=resamples),
        candidate=bootstrap_mean([after[t] for t in ids], confidence, resamples=resamples),
        delta=delta,
        detail={"calls": len(good), "trajectories": len(ids), "tolerance": tolerance,
                "deltas": {t: round(after[t] - before[t], 4) for t in ids[:20]}},
    )  # fmt: skip
