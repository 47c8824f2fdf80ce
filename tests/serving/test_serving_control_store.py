"""The composite policy, its on-disk history and how it is applied to a chat request."""

from __future__ import annotations

import json

import pytest

from atdp_io import Redactor
from sao_jax.envs.alfworld.prompts import AlfworldPrompts, render_prompt
from serving.control.apply import MEMORY_HEADER, apply_chat, retrieve
from serving.control.composite import CompositeError, CompositePolicy, CompositeSpec, Memory
from serving.control.store import (
    CompositeStore,
    ControlError,
    InvalidTenant,
    UnknownVersion,
    VersionConflict,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SPEC = {
    "policy": {"version": "7", "checkpoint": "/ckpt/7"},
    "harness": {
        "system_prompt": "You are the acme agent.",
        "instructions": ["Answer briefly."],
        "tool_descriptions": {"get_weather": "Weather by city name, metric units."},
    },
    "memory": {
        "notes": [
            {"id": "n1", "text": "Paris uses Celsius.", "keys": ["paris"]},
            {"id": "n2", "text": "Refunds need an order id.", "keys": ["refund", "order id"]},
            {"id": "n3", "text": "Lyon is in France.", "keys": ["lyon"], "created_from": ["t1"]},
        ],
        "top_k": 2,
    },
    "tools": {
        "schemas": {
            "get_weather": {
                "version": "w2",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                },
            }
        }
    },
}


def test_spec_round_trips_and_fingerprints_follow_content():
    spec = CompositeSpec.from_json(SPEC)
    assert CompositeSpec.from_json(spec.to_json()) == spec
    again = CompositeSpec.from_json(json.loads(json.dumps(SPEC)))
    assert again.fingerprints() == spec.fingerprints()
    edited = json.loads(json.dumps(SPEC))
    edited["harness"]["instructions"] = ["Answer at length."]
    changed = CompositeSpec.from_json(edited).fingerprints()
    assert changed["harness"] != spec.fingerprints()["harness"]
    assert changed["memory"] == spec.fingerprints()["memory"]
    for fp in spec.fingerprints().values():  # recorded in metadata: never taken for a secret
        assert fp.isalpha() and fp.islower() and not Redactor().might_match(fp)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"harnes": {}}, "unknown field"),
        ({"harness": {"system_mode": "append"}}, "system_mode"),
        ({"harness": {"instructions": "one"}}, "instructions"),
        ({"memory": {"notes": [{"id": "a", "text": "x", "keys": []}]}}, "keys"),
        ({"memory": {"notes": [{"id": "bad id!", "text": "x", "keys": ["k"]}]}}, "id"),
        ({"memory": {"top_k": -1}}, "top_k"),
        ({"tools": {"schemas": {"f": {"parameters": {}}}}}, "version"),
        ({"governance": {"allow_cross_tenant": "yes"}}, "allow_cross_tenant"),
        ({"governance": {"scope": "global"}}, "scope"),
        ({"harness": {"reply_choices": {"pattern": "are: .*"}}}, "exactly one group"),
        ({"harness": {"reply_choices": {"pattern": "(["}}}, "reply_choices.pattern"),
        ({"harness": {"reply_choices": {"pattern": "(.*)", "template": "x"}}}, "'{choice}'"),
        ({"harness": {"reply_choices": {"pattern": "(.*)", "separator": ""}}}, "separator"),
        ({"harness": {"reply_choices": {"separator": ","}}}, "pattern is required"),
        ({"harness": {"reply_choices": {"pattern": "(.*)", "sep": ","}}}, "unknown field"),
        ([], "JSON object"),
    ],
)
def test_malformed_specs_name_the_field(bad, words):
    with pytest.raises(CompositeError, match=words):
        CompositeSpec.from_json(bad)


def test_store_history_is_append_only_across_restarts(tmp_path):
    store = CompositeStore(tmp_path)
    assert store.current("acme").version == 0
    v1 = store.put("acme", SPEC, reason="first")
    edited = {**SPEC, "harness": {"system_prompt": "Second prompt."}}
    v2 = store.put("acme", edited, expected_version=1)
    assert (v1.version, v1.parent, v2.version, v2.parent) == (1, 0, 2, 1)
    with pytest.raises(VersionConflict, match="version 2"):
        store.put("acme", SPEC, expected_version=1)
    reopened = CompositeStore(tmp_path)  # a restart
    assert reopened.current("acme").spec == v2.spec
    v3 = reopened.rollback("acme", 1)
    assert (v3.version, v3.parent, v3.rollback_of) == (3, 2, 1)
    assert v3.spec == v1.spec and v3.fingerprints == v1.fingerprints
    history = CompositeStore(tmp_path).history("acme")
    assert [c.version for c in history] == [1, 2, 3]
    assert history[1].spec == v2.spec  # nothing was rewritten
    changed = reopened.diff("acme", 1, 2)["changed"]
    assert set(changed) == {"harness"}
    assert reopened.diff("acme", 1, 3)["changed"] == {}
    assert reopened.tenants() == ["acme"]
    assert CompositeStore(tmp_path).current("other").version == 0  # tenant scope


def test_store_errors_are_clear(tmp_path):
    store = CompositeStore(tmp_path)
    store.put("acme", SPEC)
    with pytest.raises(UnknownVersion, match="versions are 0 to 1"):
        store.get("acme", 5)
    with pytest.raises(UnknownVersion, match="earlier version"):
        store.rollback("acme", 1)
    with pytest.raises(InvalidTenant):
        store.current("../etc")
    with pytest.raises(CompositeError):
        store.put("acme", {"memory": {"top_k": "3"}})
    assert [c.version for c in store.history("acme")] == [1]  # refused puts left no trace
    (tmp_path / "acme" / "v000001.json").write_text("{truncated")
    with pytest.raises(ControlError, match=r"v000001\.json: unreadable"):
        CompositeStore(tmp_path).current("acme")


def test_apply_harness_memory_and_tools():
    policy = CompositePolicy("acme", 1, CompositeSpec.from_json(SPEC))
    messages = [
        {"role": "system", "content": "Client system."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    applied = apply_chat(policy, messages, [WEATHER])
    system = applied.messages[0]["content"]
    assert system == "You are the acme agent.\n\nClient system.\n\nAnswer briefly."
    assert applied.messages[1] == {
        "role": "system",
        "content": f"{MEMORY_HEADER}\n- Paris uses Celsius.",
    }
    assert applied.messages[2] == messages[1]
    assert applied.memory_notes == ("n1",)
    function = applied.tools[0]["function"]
    assert function["description"] == "Weather by city name, metric units."
    assert "unit" in function["parameters"]["properties"]
    assert WEATHER["function"]["description"] == "Get the weather."  # the client's untouched
    assert messages[0]["content"] == "Client system."

    # a longer conversation only adds: the earlier call's messages are a prefix
    longer = [
        *messages,
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And Lyon? I also want a refund, order id 4."},
    ]
    applied_longer = apply_chat(policy, longer, [WEATHER])
    assert applied_longer.messages[:3] == applied.messages
    # top_k 2 in the whole conversation: n2 scores 2 keys, n3 one
    assert applied_longer.memory_notes == ("n1", "n2")


@pytest.mark.parametrize("style", ["compact", "paper"])
def test_reply_choices_keep_replies_to_the_actions_the_last_prompt_lists(style):
    admissible = ["go to desk 1", "look", "take mug 1 from desk 1", "look"]
    prompt = lambda actions: render_prompt(  # noqa: E731
        "put a mug in desk", "You see a desk 1.", actions, history=[], step=0,
        history_length=1, think=False, memory=None, style=style,
    )  # fmt: skip
    choices = AlfworldPrompts().reply_choices(style=style, think=False)
    spec = CompositeSpec.from_json({**SPEC, "harness": {"reply_choices": choices}})
    policy = CompositePolicy("acme", 1, spec)
    messages = [
        {"role": "user", "content": prompt(["open drawer 1"])},
        {"role": "assistant", "content": "<action>open drawer 1</action>"},
        {"role": "user", "content": prompt(admissible)},
    ]
    applied = apply_chat(policy, messages, None)
    assert applied.reply_choices == (  # the last user message's list, once each, in order
        "<action>go to desk 1</action>",
        "<action>look</action>",
        "<action>take mug 1 from desk 1</action>",
    )
    assert applied.messages == messages  # the text the model sees is unchanged
    free = apply_chat(policy, [{"role": "user", "content": "hello"}], None)
    assert free.reply_choices is None  # a message listing nothing leaves the reply free
    assert AlfworldPrompts().reply_choices(style=style, think=True) is None  # free reasoning

    # the harness fingerprint follows the choices; harnesses without them keep theirs
    plain = CompositeSpec.from_json(SPEC)
    assert "reply_choices" not in plain.harness.to_json()
    assert CompositeSpec.from_json(spec.to_json()) == spec
    assert (
        spec.fingerprints()["harness"]
        != CompositeSpec.from_json(
            {**SPEC, "harness": {"reply_choices": {**choices, "template": "{choice}"}}}
        ).fingerprints()["harness"]
    )


def test_retrieval_is_whole_word_and_deterministic():
    memory = Memory.from_json(SPEC["memory"])
    assert retrieve([{"role": "user", "content": "Parisian refunds"}], memory) == []
    hits = retrieve([{"role": "user", "content": "PARIS and Lyon"}], memory)
    assert [[n.id for n in notes] for _, notes in hits] == [["n1", "n3"]]  # ties: memory order
