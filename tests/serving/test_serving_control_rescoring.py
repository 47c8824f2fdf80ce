"""Deterministic re-scoring with a real model: trajectories recorded through the real gateway
(under a composite) are rebuilt into the client's conversation, re-rendered token-exactly, and
a policy update trained on corrupted rewards is refused by the gate while a sound one is not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from serving_harness import (
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    module_server,
    session_client,
    tool_model,
)

from atdp_io import AtdpStore, EventKind
from serving.control.apply import apply_chat
from serving.control.composite import CompositePolicy, PolicyRef
from serving.control.plane import ControlPlane
from serving.control.proposers import propose_policy
from serving.control.rescoring import model_scorer, recorded_calls
from serving.control.window import WindowSpec
from serving.gateway.app import GATEWAY

MODEL = "sao-test"
TENANT = "acme"
COMPOSITE = {
    "harness": {
        "system_prompt": "You are the ACME weather agent.",
        "instructions": ["Always answer in Celsius."],
        "tool_descriptions": {"get_weather": "Look up today's weather by city name."},
    },
    "memory": {"notes": [{"id": "paris", "text": "Paris reports in Celsius.", "keys": ["paris"]}]},
}
server = module_server()


@pytest.fixture(scope="module")
def recorded(server):
    """Four successful sessions of TENANT under COMPOSITE (two with a second user turn), read
    back from the store; and a control plane over the gateway's stores."""
    thread, parts, buffer = server
    status, _ = api(thread.url, f"/rl/control/{TENANT}", {"composite": COMPOSITE}, method="PUT")
    assert status == 200
    for i in range(4):
        _, client = session_client(thread.url, TENANT)
        messages = [dict(m) for m in TOOL_MESSAGES]
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=24
        )
        if i % 2:  # the conversation goes on: the reply echoed, a new user turn
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "user", "content": "And tomorrow?"})
            client.chat.completions.create(
                model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=8
            )
        assert api(thread.url, "/rl/end_session", {"success": True}, key=client.api_key)[0] == 200
    gateway = parts.app[GATEWAY]
    plane = ControlPlane(gateway.composites, AtdpStore.open(str(buffer)), canaries=gateway.canaries)
    analysis, trajectories = plane.analyse(TENANT, [WindowSpec(TENANT)])
    return plane, analysis, trajectories


def test_the_client_conversation_is_rebuilt_and_re_rendered_token_exactly(recorded):
    plane, analysis, trajectories = recorded
    assert analysis.n == 4 and analysis.successes == 4 and analysis.by_version[1].n == 4
    served = plane.store.get(TENANT, 1)
    served_model = tool_model()
    scorer = model_scorer(served_model.tokenizer, lambda policy: served_model.model)
    n_calls = 0
    for trajectory in trajectories:
        calls = recorded_calls(trajectory, served.spec)
        llm_events = [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]
        assert len(calls) == len(llm_events) in (1, 2)
        first = calls[0]
        # the served composite's system text and memory note are gone: the client's messages
        assert list(first.messages) == TOOL_MESSAGES
        shown = apply_chat(served, first.messages, first.tools)
        ids = served_model.tokenizer.encode_chat(shown.messages, tools=shown.tools)
        assert ids == llm_events[0].llm.input_ids.tolist()  # the very prompt the model saw
        if len(calls) == 2:
            assert [m["role"] for m in calls[1].messages] == ["user", "assistant", "user"]
            assert calls[1].messages[1]["content"] == llm_events[0].action.text
        logps = scorer(served.spec, calls)
        for call, logp, event in zip(calls, logps, llm_events, strict=True):
            assert logp.shape == call.output_ids.shape and np.all(logp <= 1e-4)
            if call is first:  # the same tokens after the same prompt: the recorded log-probs
                np.testing.assert_allclose(logp, event.llm.output_logprobs, atol=0.05)
        n_calls += len(calls)
    assert n_calls == 6


def _reinforce(model, trajectories, reward: float, *, steps: int = 40, lr: float = 3e-3):
    """A copy of `model` after `steps` of REINFORCE on the recorded replies, every trajectory
    rewarded `reward` (-1 for a success: the corrupted signal)."""
    rows = []
    for t in trajectories:
        for e in t.events:
            if e.kind == EventKind.LLM_CALL:
                rows.append((e.llm.input_ids, e.llm.output_ids))
    width = max(len(p) + len(o) for p, o in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    mask = np.zeros((len(rows), width), np.float32)
    for r, (prompt, output) in enumerate(rows):
        tokens[r, : len(prompt) + len(output)] = np.concatenate([prompt, output])
        mask[r, len(prompt) - 1 : len(prompt) + len(output) - 1] = 1.0  # predicts the output
    graphdef, params = nnx.split(model)
    optimizer = optax.adam(lr)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state):
        def loss(p):
            m = nnx.merge(graphdef, p)
            logp, _ = m.token_logprobs(m.forward(tokens).hidden, jnp.roll(tokens, -1, axis=1))
            return -reward * jnp.sum(logp * mask) / jnp.sum(mask)

        grads = jax.grad(loss)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for _ in range(steps):
        params, state = step(params, state)
    return nnx.merge(graphdef, params)


def test_a_policy_update_on_corrupted_rewards_is_refused(recorded):
    plane, analysis, trajectories = recorded
    served_model = tool_model()
    models = {"": served_model.model}

    def trained(reward: float, version: str):
        def train_fn(window, policy: PolicyRef) -> PolicyRef:
            assert policy == PolicyRef() and len(window) == 4
            models[version] = _reinforce(served_model.model, window, reward)
            return PolicyRef(version, f"/ckpt/{version}")

        train_fn.__name__ = f"reinforce_{version}"
        return train_fn

    current: CompositePolicy = plane.store.current(TENANT)
    corrupted = propose_policy(analysis, current, trajectories, trained(-1.0, "corrupt-1"))
    sound = propose_policy(analysis, current, trajectories, trained(+1.0, "sound-1"))
    assert corrupted.provenance.analyzer == "train:reinforce_corrupt-1"
    scorer = model_scorer(served_model.tokenizer, lambda policy: models[policy.version])
    bad, good = plane.gate(TENANT, [corrupted, sound], trajectories, scorer=scorer)
    (evidence,) = bad.evidence
    assert bad.verdict == "refuse" and evidence.verdict == "worse"
    assert evidence.delta.high < -plane.gate_config.rescore_tolerance
    assert evidence.detail["trajectories"] == 4 and evidence.detail["calls"] == 6
    (evidence,) = good.evidence
    assert evidence.verdict != "worse" and evidence.delta.value > 0
    assert good.verdict == "inconclusive"  # re-scoring vetoes; it cannot show a gain
    logged = plane.audit.entries(TENANT, "gate")
    assert [e["verdict"] for e in logged[-2:]] == ["refuse", "inconclusive"]
