"""Redaction: detectors, token-stream redaction, and a scan of every byte the store wrote."""

import dataclasses
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
