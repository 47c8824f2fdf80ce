"""Composite policies served: applied to each tenant's requests, named by every ATDP event,
changed and rolled back through the gateway's admin routes and `python -m serving.control`."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from flax import nnx
from serving_harness import (
    ADMIN_KEY,
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    local_server,
    module_server,
    read_trajectories,
    session_client,
)

from atdp_io import EventKind, codec
from atdp_io.events import Event, EventMetadata
from atdp_io.schema import ReplayClass
from sao_jax.envs.alfworld.prompts import AlfworldPrompts, render_prompt
from sao_jax.pipeline.evolve_policies import PolicyBook, copied, window_trainer
from sao_jax.train import LearnerConfig
from serving.control.apply import apply_chat
from serving.control.cli import main as control_cli
from serving.control.composite import CompositePolicy, CompositeSpec, PolicyRef
from serving.gateway.app import AUDIT
from serving.proxy.attribution import composite_fields
from serving.proxy.runner import CallContext
from serving.router.router import Route

MODEL = "sao-test"
COMPOSITE = {
    "policy": {"version": "sao-7"},
    "harness": {
        "system_prompt": "You are the ACME weather agent.",
        "instructions": ["Always answer in Celsius."],
        "tool_descriptions": {"get_weather": "Look up today's weather by city name."},
    },
    "memory": {
        "notes": [
            {"id": "paris-units", "text": "Paris reports in Celsius.", "keys": ["paris"]},
            {"id": "tokyo", "text": "Tokyo is UTC+9.", "keys": ["tokyo"]},
        ],
    },
    "tools": {
        "schemas": {
            "get_weather": {
                "version": "weather-v2",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"],
                },
            }
        }
    },
}

server = module_server()


def _prompts(parts, buffer, tenant: str, session_id: str) -> list[tuple[str, Event]]:
    """(decoded prompt, event) of each llm_call of the session, in order."""
    events = read_trajectories(buffer, tenant)[session_id].events
    tokenizer = parts.proxy.tokenizer
    return [
        (tokenizer.decode(e.llm.input_ids.tolist()), e)
        for e in events
        if e.kind == EventKind.LLM_CALL
    ]


def _chat(client: openai.OpenAI, messages=TOOL_MESSAGES, tools=(WEATHER_TOOL,)):
    return client.chat.completions.create(
        model=MODEL, messages=messages, tools=list(tools), temperature=0, max_tokens=6
    )


def _put(url: str, tenant: str, composite, key=ADMIN_KEY, **body):
    return api(url, f"/rl/control/{tenant}", {"composite": composite, **body}, key, method="PUT")


def test_a_tenants_composite_shapes_its_prompts_and_is_recorded(server):
    thread, parts, buffer = server
    status, made = _put(thread.url, "acme", COMPOSITE, reason="first harness")
    assert status == 200, made
    assert made["version"] == 1 and made["parent"] == 0
    fingerprints = CompositeSpec.from_json(COMPOSITE).fingerprints()
    assert made["fingerprints"] == fingerprints

    session_id, client = session_client(thread.url, "acme")
    request = [dict(m) for m in TOOL_MESSAGES]
    reply = _chat(client, request)
    assert (
        request == TOOL_MESSAGES and WEATHER_TOOL["function"]["description"] == "Get the weather."
    )
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    status, _ = api(
        thread.url,
        "/rl/event",
        {"type": "retrieval", "name": "docs", "result": ["d"]},
        key=client.api_key,
    )
    assert status == 200

    ((prompt, llm),) = _prompts(parts, buffer, "acme", session_id)
    assert "You are the ACME weather agent.\n\nAlways answer in Celsius." in prompt
    assert "Relevant notes from memory:\n- Paris reports in Celsius." in prompt
    assert "Tokyo" not in prompt  # not retrieved: its key is not in the conversation
    assert "Look up today's weather by city name." in prompt
    assert "Get the weather." not in prompt
    assert '"unit"' in prompt  # the tool schema override
    assert prompt.index("ACME weather agent") < prompt.index("Paris reports")
    assert prompt.index("Paris reports") < prompt.index("What is the weather in Paris?")
    assert llm.metadata.extra["memory_notes"] == ["paris-units"]
    assert llm.metadata.harness_fingerprint.endswith("+" + fingerprints["harness"])

    events = read_trajectories(buffer, "acme")[session_id].events
    assert {e.kind for e in events} >= {EventKind.MESSAGE, EventKind.LLM_CALL, EventKind.RETRIEVAL}
    for event in events:  # every event names the composite that produced it
        assert event.metadata.composite_version == 1, event.kind
        assert event.metadata.memory_version == fingerprints["memory"]
        assert dict(event.metadata.tool_schema_versions) == {"get_weather": "weather-v2"}
        assert event.metadata.policy_version == "sao-7"

    # another tenant is untouched: composite version 0, nothing added
    other_id, other = session_client(thread.url, "globex")
    _chat(other)
    ((other_prompt, other_llm),) = _prompts(parts, buffer, "globex", other_id)
    assert "ACME" not in other_prompt and "memory" not in other_prompt
    assert "Get the weather." in other_prompt
    assert other_llm.metadata.composite_version == 0
    assert other_llm.metadata.harness_fingerprint == parts.proxy.template_fingerprint


def test_a_session_keeps_token_exact_prefixes_under_its_composite(server):
    thread, parts, buffer = server
    status, _ = _put(thread.url, "hooli", COMPOSITE)
    assert status == 200
    session_id, client = session_client(thread.url, "hooli")
    first = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=4
    )
    messages = [
        {"role": "user", "content": "Hi"},
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "Now Tokyo."},
    ]
    client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=4)
    (_, one), (second_prompt, two) = _prompts(parts, buffer, "hooli", session_id)
    # the second call extends the first one's sampled ids (the composite only added)
    assert two.metadata.extra["prompt"]["extends"] == one.metadata.interaction_id
    assert "context_rewritten" not in two.metadata.extra
    assert second_prompt.count("Tokyo is UTC+9.") == 1
    assert two.metadata.extra["memory_notes"] == ["tokyo"]


def test_responses_api_continues_the_clients_conversation_not_the_models(server):
    """The stored conversation a `previous_response_id` continues is the client's: the harness
    is applied once per call, not again onto text it added before."""
    thread, parts, buffer = server
    assert _put(thread.url, "stark", COMPOSITE)[0] == 200
    session_id, client = session_client(thread.url, "stark")
    first = client.responses.create(model=MODEL, input="Weather in Paris?", max_output_tokens=4)
    client.responses.create(
        model=MODEL, input="And Tokyo?", previous_response_id=first.id, max_output_tokens=4
    )
    (one, _), (two, event) = _prompts(parts, buffer, "stark", session_id)
    for prompt in (one, two):
        assert prompt.count("You are the ACME weather agent.") == 1
        assert prompt.count("Paris reports in Celsius.") == 1
    assert "Tokyo is UTC+9." in two and event.metadata.composite_version == 1


def test_rollback_restores_earlier_content_as_a_new_version(server):
    thread, parts, buffer = server
    assert _put(thread.url, "initech", COMPOSITE)[0] == 200
    second = {"harness": {"system_prompt": "Version two speaking.", "system_mode": "replace"}}
    status, v2 = _put(thread.url, "initech", second, expected_version=1)
    assert status == 200 and v2["version"] == 2

    session_id, client = session_client(thread.url, "initech")
    _chat(client, [{"role": "system", "content": "Client system text."}, *TOOL_MESSAGES])
    status, v3 = api(thread.url, "/rl/control/initech/rollback", {"version": 1, "reason": "bad"})
    assert status == 200, v3
    assert (v3["version"], v3["parent"], v3["rollback_of"]) == (3, 2, 1)
    _chat(client, [{"role": "system", "content": "Client system text."}, *TOOL_MESSAGES])

    (before, e2), (after, e3) = _prompts(parts, buffer, "initech", session_id)
    assert "Version two speaking." in before and "Client system text." not in before  # replace
    assert "Version two speaking." not in after
    assert "You are the ACME weather agent.\n\nClient system text." in after  # prepend
    assert (e2.metadata.composite_version, e3.metadata.composite_version) == (2, 3)

    status, history = api(thread.url, "/rl/control/initech/history", method="GET")
    assert [v["version"] for v in history["versions"]] == [1, 2, 3]
    assert history["versions"][2]["fingerprints"] == history["versions"][0]["fingerprints"]
    status, diff = api(thread.url, "/rl/control/initech/diff?from=1&to=2", method="GET")
    assert status == 200 and set(diff["changed"]) == {"policy", "harness", "memory", "tools"}
    assert diff["changed"]["memory"]["notes_removed"] == ["paris-units", "tokyo"]


def test_bad_input_is_refused_and_changes_nothing(server):
    thread, parts, _ = server
    assert _put(thread.url, "umbrella", COMPOSITE)[0] == 200
    _, session = api(thread.url, "/rl/start_session", {"tenant": "umbrella"})
    cases = [
        (_put(thread.url, "umbrella", {"harness": {"system_mode": "append"}}), 400, "system_mode"),
        (_put(thread.url, "umbrella", {"memory": {"notes": "x"}}), 400, "invalid composite"),
        (_put(thread.url, "umbrella", COMPOSITE, expected_version=7), 409, "version 1"),
        (api(thread.url, "/rl/control/umbrella", None, method="PUT"), 400, "JSON"),
        (api(thread.url, "/rl/control/umbrella/rollback", {"version": 9}), 404, "0 to 1"),
        (api(thread.url, "/rl/control/umbrella/rollback", {"version": "x"}), 400, "version"),
        (api(thread.url, "/rl/control/umbrella/versions/5", method="GET"), 404, "0 to 1"),
        (_put(thread.url, "umbrella", COMPOSITE, key=session["api_key"]), 403, "admin key"),
        (api(thread.url, "/rl/control/umbrella", method="GET", key="sk-nope"), 401, "invalid"),
        (_put(thread.url, "bad tenant!", COMPOSITE), 400, "tenant"),
    ]
    for (status, body), expected, words in cases:
        assert status == expected, body
        assert words in body["error"]["message"], body
    status, current = api(thread.url, "/rl/control/umbrella", method="GET")
    assert status == 200 and current["version"] == 1
    status, history = api(thread.url, "/rl/control/umbrella/history", method="GET")
    assert [v["version"] for v in history["versions"]] == [1]
    entries = [
        e
        for e in parts.app[AUDIT].entries()
        if e.get("tenant") == "umbrella" and e.get("operation") in ("put", "rollback")
    ]  # every write, refused ones included; reads are not audited
    assert [e["status"] for e in entries] == [200, 400, 400, 409, 400, 404, 400, 403]
    assert entries[0]["version"] == 1 and entries[0]["principal"] == "admin"
    assert entries[-1]["principal"] == f"session:{session['session_id']}"


def test_history_is_append_only_across_restarts_and_the_cli(tmp_path, capsys):
    buffer = tmp_path / "buffer"
    with local_server(buffer) as (thread, _):
        assert _put(thread.url, "acme", COMPOSITE)[0] == 200
        args = ["--url", thread.url, "--admin-key", ADMIN_KEY]
        spec = tmp_path / "v2.json"
        spec.write_text(json.dumps({"harness": {"system_prompt": "Two."}}))
        assert control_cli(["promote", "acme", str(spec), "--reason", "cli", *args]) == 0
        assert "composite version 2" in capsys.readouterr().out
        assert control_cli(["diff", "acme", "1", "2", *args]) == 0
        assert "notes removed: paris-units, tokyo" in capsys.readouterr().out
        assert control_cli(["rollback", "acme", "5", *args]) == 1
        assert "no composite version 5" in capsys.readouterr().err
        spec.write_text("{not json")
        assert control_cli(["promote", "acme", str(spec), *args]) == 1
        capsys.readouterr()
    with local_server(buffer) as (thread, _):  # a restart: the history is still there
        status, current = api(thread.url, "/rl/control/acme", method="GET")
        assert (
            status == 200
            and current["version"] == 2
            and current["harness"]["system_prompt"] == "Two."
        )
        args = ["--url", thread.url, "--admin-key", ADMIN_KEY]
        assert control_cli(["rollback", "acme", "1", *args]) == 0
        assert control_cli(["status", "acme", "--json", *args]) == 0
        capsys.readouterr()
    store = str(buffer / "gateway_state" / "composites")  # the gateway stopped: the store itself
    assert control_cli(["history", "acme", "--json", "--store", store]) == 0
    history = json.loads(capsys.readouterr().out)
    assert [(v["version"], v["rollback_of"]) for v in history] == [(1, None), (2, None), (3, 1)]
    assert history[1]["harness"]["system_prompt"] == "Two."
    assert history[2]["fingerprints"] == history[0]["fingerprints"]


def test_metadata_attribution_round_trips_and_old_records_read():
    metadata = EventMetadata(
        session_id="s",
        composite_version=4,
        memory_version="abcdefghijklmnop",
        tool_schema_versions={"get_weather": "weather-v2"},
        policy_version="sao-7",
    )
    event = Event(kind=EventKind.MESSAGE, replay=ReplayClass.DETERMINISTIC, metadata=metadata)
    data = json.loads(json.dumps(codec.event_to_json(event)))
    back = codec.event_from_json(data, None)
    assert back.metadata == metadata
    old = dict(data)
    old["metadata"] = {"session_id": "s"}  # written before these fields existed
    assert codec.event_from_json(old, None).metadata.composite_version is None
    data["metadata"]["composite_version"] = -1
    with pytest.raises(Exception, match="composite_version"):
        codec.event_from_json(data, None)


def test_the_attribution_travels_to_a_separate_proxy_process():
    """Gateway and data proxy in separate processes exchange the call as JSON."""
    composite = CompositePolicy("acme", 2, CompositeSpec.from_json(COMPOSITE))
    call = CallContext(
        "s", "acme", Route("s", "proxy", "worker"), composite=composite.attribution()
    )
    back = CallContext.from_json(json.loads(json.dumps(call.to_json())))
    assert back == call
    fields = composite_fields(back.composite)
    assert fields["composite_version"] == 2 and fields["policy_version"] == "sao-7"
    assert EventMetadata(**fields).tool_schema_versions == {"get_weather": "weather-v2"}


ADMISSIBLE = ["go to desk 1", "look", "open drawer 1", "take mug 1 from desk 1"]


def test_a_harness_keeps_replies_to_the_listed_actions_and_replay_decodes_alike(tmp_path):
    buffer = tmp_path / "buffer"
    with local_server(buffer) as (thread, parts):
        _reply_choices_served_and_replayed(thread, parts, buffer)


def _reply_choices_served_and_replayed(thread, parts, buffer):
    composite = {"harness": {"reply_choices": AlfworldPrompts().reply_choices(
        style="compact", think=False)}}  # fmt: skip
    status, made = _put(thread.url, "initech", composite, reason="admissible replies only")
    assert status == 200, made
    session_id, client = session_client(thread.url, "initech")
    prompt = render_prompt(
        "put a mug in desk", "You are in the middle of a room.", ADMISSIBLE, history=[],
        step=0, history_length=1, think=False, memory=None, style="compact",
    )  # fmt: skip
    messages = [{"role": "user", "content": prompt}]
    allowed = [f"<action>{a}</action>" for a in ADMISSIBLE]
    replies = []
    for seed in range(3):  # sampled at temperature 1: still one of the listed actions
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, seed=seed
        )
        replies.append(reply.choices[0].message.content)
    greedy = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0
    )
    assert set(replies) | {greedy.choices[0].message.content} <= set(allowed), replies
    own = client.chat.completions.create(  # the client's own output constraint wins
        model=MODEL, messages=messages, max_tokens=4, extra_body={"guided_choice": ["done"]}
    )
    assert own.choices[0].message.content == "done"
    chat = client.chat.completions.create(  # a message listing no actions: a free reply
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    *constrained, client_own, free = [e for _, e in _prompts(parts, buffer, "initech", session_id)]
    assert len(constrained) == 4
    for event in constrained:  # recorded with the call: training rebuilds the masks
        assert event.llm.decoding.extra["choice"] == allowed
        assert event.metadata.composite_version == made["version"]
    assert client_own.llm.decoding.extra["choice"] == ["done"]
    assert "choice" not in free.llm.decoding.extra and chat.choices[0].message.content is not None

    # the replay gate's agent decodes the same reply under the same mask
    sampler = parts.worker.sampler
    served = copied(nnx.merge(sampler.graphdef, sampler.params))  # the worker keeps its own
    book = PolicyBook(served, parts.proxy.tokenizer, max_new_tokens=24)
    policy = CompositePolicy("initech", 1, CompositeSpec.from_json(composite))
    applied = apply_chat(policy, messages, None)
    assert applied.reply_choices == tuple(allowed)
    replayed = book.reply(applied.messages, PolicyRef(), applied.reply_choices)
    assert replayed == greedy.choices[0].message.content

    # a policy candidate trains on such calls with their masks rebuilt (the masked ratio)
    trajectory = read_trajectories(buffer, "initech")[session_id]
    trainer = window_trainer(book, LearnerConfig(), rows=8, seq_len=512, steps=1,
                             learning_rate=1e-4, fit_baseline=True)  # fmt: skip
    batch = trainer.batch([trajectory])
    assert {"mask_index", "mask_table"} <= set(batch)
    assert np.all(batch["sample_temperature"] == 1.0)  # greedy calls train as plain samples
    trained = trainer([trajectory], PolicyRef())
    assert trained.version == "sao_window-1" and book.model_for(trained) is not served
    # asked to, its fresh value head was fitted to the window's returns first (least squares with a
    # bias: the fitted values average to the returns' mean), then the policy stepped
    fit = trainer.metrics
    assert fit["critic_fit/tokens"] > 0 and "policy/loss" in fit
    assert fit["critic_fit/value_mean"] == pytest.approx(fit["critic_fit/return_mean"], abs=1e-4)
    unfitted = window_trainer(book, LearnerConfig(), rows=8, seq_len=512, steps=1,
                              learning_rate=1e-4, name="unfitted")  # fmt: skip
    unfitted([trajectory], PolicyRef())
    assert not any(k.startswith("critic_fit/") for k in unfitted.metrics)
