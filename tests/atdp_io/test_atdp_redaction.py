"""Redaction: detectors, token-stream redaction, and a scan of every byte the store wrote."""

import dataclasses
import json
import uuid
from collections import Counter

import numpy as np
import pytest
from atdp_factories import (
    NOW,
    ByteTokenizer,
    agent_trajectory,
    llm_event,
    stored_bytes,
    tool_event,
)
from atdp_secrets import SECRETS as PLANTED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atdp_io import (
    AtdpStore,
    Critique,
    Event,
    EventKind,
    EventMetadata,
    RedactionStatus,
    Redactor,
    ReplayClass,
    SchemaError,
    StoreConfig,
)
from atdp_io.redaction import RedactionReport

SECRETS = {
    "email": "alice.smith@example.com",
    "phone": "+1 (415) 555-0133",
    "credit_card": "4111 1111 1111 1111",
    "api_key": "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456",
    "bearer_token": "Bearer eyJhbGciOiJIUzI1NiJ9abcdefgh",
    "secret_assignment": "password=hunter2hunter2",
}


@pytest.mark.parametrize(("detector", "secret"), sorted(SECRETS.items()))
def test_each_detector_replaces_its_secret(detector, secret):
    report = RedactionReport()
    out = Redactor().redact_text(f"before {secret} after", report)
    assert secret not in out
    assert f"[REDACTED:{detector}]" in out
    assert out.startswith("before ") and out.endswith(" after")
    assert sum(report.findings.values()) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "go to cabinet 2 and take mug 1 from countertop 3",
        "order 4111 1111 1111 1112 failed",  # 16 digits failing the Luhn check
        "version 1.2.3, step 17 of 50",
    ],
)
def test_ordinary_text_is_left_alone(text):
    report = RedactionReport()
    assert Redactor().redact_text(text, report) == text
    assert not report.findings


def test_extra_patterns_and_bad_configuration():
    redactor = Redactor(extra_patterns={"employee_id": r"EMP-\d{6}"}, disable=("phone",))
    report = RedactionReport()
    assert redactor.redact_text("EMP-123456 at 415-555-0133", report) == (
        "[REDACTED:employee_id] at 415-555-0133"
    )
    assert report.findings == Counter({"employee_id": 1})
    with pytest.raises(ValueError, match="shadows a built-in"):
        Redactor(extra_patterns={"email": "x"})
    with pytest.raises(ValueError, match=r"extra_patterns\['broken'\]"):
        Redactor(extra_patterns={"broken": "(unclosed"})
    with pytest.raises(ValueError, match="unknown detectors"):
        Redactor(disable=("fax",))


def test_token_streams_are_redacted_with_a_tokenizer():
    tok = ByteTokenizer()
    prompt = tok.encode(f"user: mail me at {SECRETS['email']}\nassistant:")
    output = tok.encode(f"sure, {SECRETS['email']}")
    event = llm_event(prompt, output)
    redacted, report = Redactor(tokenizer=tok).redact_event(event)
    assert report.status == RedactionStatus.REDACTED
    assert redacted.redaction == RedactionStatus.REDACTED
    assert SECRETS["email"] not in tok.decode(redacted.llm.input_ids)
    assert "[REDACTED:email]" in tok.decode(redacted.llm.output_ids)
    # Recorded log-probs belonged to the original tokens: never train on the rewritten output.
    assert not redacted.llm.loss_mask.any() and not redacted.llm.output_logprobs.any()
    clean = llm_event(tok.encode("go to desk 1"), tok.encode("ok"))
    same, report = Redactor(tokenizer=tok).redact_event(clean)
    assert report.status == RedactionStatus.CLEAN
    np.testing.assert_array_equal(same.llm.input_ids, clean.llm.input_ids)
    np.testing.assert_array_equal(same.llm.loss_mask, clean.llm.loss_mask)


def test_without_a_tokenizer_llm_events_are_text_only():
    _, report = Redactor().redact_event(llm_event([3, 4], [5]))
    assert report.status == RedactionStatus.TEXT_ONLY
    _, report = Redactor().redact_event(tool_event("f", {"x": "y"}, "z"))
    assert report.status == RedactionStatus.CLEAN


def test_a_trajectory_id_holding_personal_data_is_refused():
    traj = agent_trajectory("t")
    header = dataclasses.replace(traj.header, trajectory_id=f"session-{SECRETS['email']}")
    with pytest.raises(SchemaError, match=r"header\.trajectory_id: contains sensitive data"):
        Redactor().redact_header(header)


def test_no_planted_secret_reaches_disk(tmp_path):
    tok = ByteTokenizer()
    # Uncompressed chunks, so a plaintext secret would be visible to a byte scan.
    store = AtdpStore.open(tmp_path, config=StoreConfig(compression=None))
    canary = "CANARY-plain-observation-text"
    text = " ".join(SECRETS.values())
    base = agent_trajectory("t-secret", turns=1, prompt_len=4)
    user_message = Event(
        kind=EventKind.MESSAGE,
        replay=ReplayClass.NON_REPLAYABLE,
        observation=f"{canary} {text}",
        hidden={"scratchpad": text, text: "key holds it too"},
        metadata=EventMetadata(session_id=SECRETS["email"], extra={"auth": SECRETS["api_key"]}),
    )
    tool = tool_event("send_mail", {"to": SECRETS["email"], "card": SECRETS["credit_card"]}, text)
    llm = llm_event(tok.encode(f"system: {text}\nuser:"), tok.encode(f"calling {SECRETS['phone']}"))
    header = dataclasses.replace(
        base.header, session_id=SECRETS["phone"], task={"note": SECRETS["bearer_token"]}
    )
    traj = dataclasses.replace(base, header=header, events=(user_message, tool, llm))
    with store.writer("acme", redactor=Redactor(tokenizer=tok)) as writer:
        writer.append([traj])
        writer.annotate(Critique("t-secret", 0, f"leaked {SECRETS['api_key']}", "reviewer", NOW))
        session = writer.open_trajectory(dataclasses.replace(header, trajectory_id="t-live"))
        session.append_event(user_message)
    raw = stored_bytes(tmp_path)
    assert canary.encode() in raw  # the scan sees plaintext payloads
    for secret in SECRETS.values():
        assert secret.encode() not in raw, secret
        # Also as token ids: int32 little-endian of the byte tokenizer's ids.
        as_tokens = np.asarray(tok.encode(secret), "<i4").tobytes()
        assert as_tokens not in raw, secret
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    stored = reader.read("t-secret")
    assert stored.header.governance.redaction == RedactionStatus.REDACTED
    assert [e.redaction for e in stored.events] == [RedactionStatus.REDACTED] * 3
    assert "[REDACTED:email]" in stored.events[0].observation


# Every place a gateway or rollout puts text: system prompt, user text, tool arguments (as an
# object and as the JSON string the OpenAI API sends), tool results, observations, hidden state,
# retrieval snippets, metadata, header task, annotations, LLM tool schemas and token streams.
PLACES = (
    "system_prompt",
    "user_text",
    "tool_arguments",
    "tool_arguments_json",
    "tool_result",
    "env_observation",
    "hidden",
    "retrieval",
    "metadata",
    "header_task",
    "critique",
    "llm_tools",
    "llm_tokens",
)


def _events_for(place: str, text: str, tok) -> tuple[list[Event], dict, str]:
    """(events, header task, critique text) carrying `text` at `place`."""
    task, critique = {"env": "alfworld"}, "fine"
    if place in ("system_prompt", "user_text"):
        role = "system" if place == "system_prompt" else "user"
        events = [
            Event(
                kind=EventKind.MESSAGE,
                replay=ReplayClass.NON_REPLAYABLE,
                observation={"role": role, "content": f"hello {text} bye"},
            )
        ]
    elif place == "tool_arguments":
        events = [tool_event("search", {"query": text, "limit": 3}, "ok")]
    elif place == "tool_arguments_json":
        events = [tool_event("search", {"raw": json.dumps({"query": text})}, "ok")]
    elif place == "tool_result":
        events = [tool_event("read_file", {"path": "notes.txt"}, {"content": text})]
    elif place == "env_observation":
        events = [
            Event(EventKind.ENV_STEP, ReplayClass.APPROXIMATE, observation=f"You see {text}.")
        ]
    elif place == "hidden":
        events = [Event(EventKind.ENV_STEP, ReplayClass.APPROXIMATE, hidden={"thought": text})]
    elif place == "retrieval":
        events = [
            Event(EventKind.RETRIEVAL, ReplayClass.APPROXIMATE, observation=[{"snippet": text}])
        ]
    elif place == "metadata":
        meta = EventMetadata(session_id="s1", extra={"note": text, "headers": [text]})
        events = [Event(EventKind.MESSAGE, ReplayClass.NON_REPLAYABLE, metadata=meta)]
    elif place == "header_task":
        events, task = [], {"env": "alfworld", "instructions": text}
    elif place == "critique":
        events, critique = [], f"the agent leaked {text}"
    elif place == "llm_tools":
        call = llm_event(tok.encode("<|user|>hi"), tok.encode("ok"), text=f"call {text}")
        tools = ({"type": "function", "function": {"name": "f", "description": text}},)
        events = [dataclasses.replace(call, llm=dataclasses.replace(call.llm, tools=tools))]
    else:
        events = [llm_event(tok.encode(f"<|system|>{text}<|user|>hi"), tok.encode(f"ok {text}"))]
    return events, task, critique


def _forms(core: str, tok) -> list[bytes]:
    """The byte forms a leaked `core` would take on disk: plain, JSON-escaped once and twice
    (tool arguments sent as a JSON string), and as int32 token ids."""
    once = json.dumps(core)[1:-1]
    twice = json.dumps(once)[1:-1]
    return [
        *{core.encode(), once.encode(), twice.encode()},
        np.asarray(tok.encode(core), "<i4").tobytes(),
    ]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plants=st.lists(st.tuples(PLANTED, st.sampled_from(PLACES)), min_size=1, max_size=4))
def test_no_planted_secret_from_the_catalogue_reaches_disk(tmp_path, plants):
    tok = ByteTokenizer()
    root = tmp_path / uuid.uuid4().hex  # one store per example: tmp_path is shared
    store = AtdpStore.open(root, config=StoreConfig(compression=None))
    canary = "CANARY-plain-observation-text"
    events = [Event(EventKind.ENV_STEP, ReplayClass.APPROXIMATE, observation=canary)]
    task: dict = {}
    critiques = []
    for i, (planted, place) in enumerate(plants):
        more, more_task, critique = _events_for(place, planted.text, tok)
        events += more
        task.update({f"{k}{i}": v for k, v in more_task.items()})
        critiques.append(Critique("t-prop", 0, critique, "reviewer", NOW))
    base = agent_trajectory("t-prop", turns=1)
    traj = dataclasses.replace(
        base, header=dataclasses.replace(base.header, task=task), events=tuple(events)
    )
    with store.writer("acme", redactor=Redactor(tokenizer=tok)) as writer:
        writer.append([traj])
        for critique in critiques:
            writer.annotate(critique)
    raw = stored_bytes(root)
    assert canary.encode() in raw  # the scan sees plaintext payloads
    for planted, place in plants:
        for core in planted.cores:
            for form in _forms(core, tok):
                assert form not in raw, (planted.kind, place, core)
    assert any(form in raw for form in _forms("[REDACTED:", tok))  # as text or as token ids
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    assert len(reader.read("t-prop").events) == len(events)  # redacted, still readable
