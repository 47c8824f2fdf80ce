"""The redaction catalogue: every detector kind with a positive case and a near miss, the
pre-filter that keeps clean text cheap, and the docs table kept in step with the code."""

import dataclasses
import json
import pathlib
import re

import pytest
from atdp_factories import ByteTokenizer, agent_trajectory, llm_event, tool_event
from atdp_secrets import CASES, SECRETS, Planted
from hypothesis import given, settings
from hypothesis import strategies as st

from atdp_io import RedactionStatus, Redactor, ToolCall
from atdp_io.redaction import RedactionReport, _builtin_might_match
from atdp_io.secret_catalogue import CATALOGUE, IBAN_LENGTHS, iban_ok, is_secret_key

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "atdp_io.md"


def _redact(text: str) -> tuple[str, RedactionReport]:
    report = RedactionReport()
    return Redactor().redact_text(text, report), report


def test_every_kind_has_cases():
    assert {kind for kind, *_ in CASES} == {d.name for d in CATALOGUE}


@pytest.mark.parametrize(
    ("kind", "text", "cores"), [pytest.param(k, t, c, id=f"{k}-{n}") for k, n, t, c, _ in CASES]
)
def test_positive_case_is_redacted_and_context_kept(kind, text, cores):
    # The pre-filter must let it through: otherwise the writer's fast path would store it.
    assert _builtin_might_match(text)
    out, report = _redact(f"note: {text} -- end")
    for core in cores:
        assert core not in out, core
    assert f"[REDACTED:{kind}]" in out
    assert report.findings[kind] >= 1
    assert out.startswith("note: ") and out.endswith(" -- end")


@pytest.mark.parametrize(
    ("kind", "text", "cores"), [pytest.param(k, t, c, id=f"{k}-{n}") for k, n, t, c, _ in CASES]
)
def test_positive_case_is_redacted_in_token_streams(kind, text, cores):
    tok = ByteTokenizer()
    event = llm_event(tok.encode(f"<|user|>{text}<|assistant|>"), tok.encode(f"ok: {text}"))
    redacted, report = Redactor(tokenizer=tok).redact_event(event)
    prompt, output = tok.decode(redacted.llm.input_ids), tok.decode(redacted.llm.output_ids)
    for core in cores:
        assert core not in prompt and core not in output
    assert f"[REDACTED:{kind}]" in prompt and f"[REDACTED:{kind}]" in output
    assert report.findings[kind] >= 2
    assert not redacted.llm.loss_mask.any()  # rewritten output tokens are never trained on


@pytest.mark.parametrize(
    ("kind", "near_miss"), [pytest.param(k, m, id=f"{k}-{n}") for k, n, _, _, m in CASES]
)
def test_near_miss_is_left_alone(kind, near_miss):
    out, report = _redact(f"note: {near_miss} -- end")
    assert out == f"note: {near_miss} -- end"
    assert not report.findings


FILLER = st.sampled_from(
    ["go to", "cabinet 2", "the", "4111", "-", ":", "=", "\n", '"', "aws", "secret", "SSN"]
)
NEAR_MISSES = st.sampled_from([m for *_, m in CASES])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(SECRETS.map(lambda p: p.text), NEAR_MISSES, FILLER), max_size=12))
def test_detectors_merge_like_one_alternation_in_catalogue_order(parts):
    # The redactor runs one regex per detector (faster) and merges them; the semantics are
    # those of one alternation: leftmost match, ties to the earlier detector, no overlaps.
    text = " ".join(parts)
    alternation = re.compile("|".join(f"(?P<{d.name}>{d.pattern})" for d in CATALOGUE))
    expected = [(m.lastgroup, m.span()) for m in alternation.finditer(text)]
    assert [(n, m.span()) for n, m in Redactor()._matches(text)] == expected


@settings(max_examples=300, deadline=None)
@given(SECRETS)
def test_generated_secrets_of_every_kind_are_redacted(planted: Planted):
    assert _builtin_might_match(planted.text)
    out, report = _redact(f"before {planted.text} after")
    for core in planted.cores:
        assert core not in out
    assert report.findings[planted.kind] >= 1


def test_only_the_secret_goes_its_context_stays():
    out, _ = _redact('{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}')
    assert out == '{"SecretAccessKey": "[REDACTED:aws_secret_key]"}'
    assert json.loads(out)  # JSON inside a string stays parseable
    out, _ = _redact("mysql://root:Passw0rd99@10.0.0.5/db")
    assert out == "mysql://root:[REDACTED:url_credentials]@10.0.0.5/db"


def test_a_private_key_named_in_an_assignment_is_redacted_whole():
    # `"private_key": "-----BEGIN` must not stop at the first word of the block.
    key = "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n"
    out, report = _redact(f'{{"private_key": "{key}", "client_id": "1"}}')
    assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in out
    assert out == '{"private_key": "[REDACTED:private_key]\\n", "client_id": "1"}'
    assert report.findings == {"private_key": 1}


def test_secret_keys_in_json_objects_redact_their_values_whatever_they_look_like():
    value = {
        "password": "x",
        "AWS_SECRET_ACCESS_KEY": "short",
        "clientSecret": "abc",
        "Authorization": "Basic YWJj",
        "nested": [{"api_key": "k"}],
        "max_tokens": "64",  # not secret-like
        "password_hint": "the cat",  # a hint, not the password
        "token": "Hello",  # log-prob entries use this key for text
        "secret": {"type": "string"},  # a JSON schema: only string values are replaced
    }
    report = RedactionReport()
    out = Redactor().redact_json(value, report)
    assert out == {
        "password": "[REDACTED:secret_assignment]",
        "AWS_SECRET_ACCESS_KEY": "[REDACTED:secret_assignment]",
        "clientSecret": "[REDACTED:secret_assignment]",
        "Authorization": "[REDACTED:secret_assignment]",
        "nested": [{"api_key": "[REDACTED:secret_assignment]"}],
        "max_tokens": "64",
        "password_hint": "the cat",
        "token": "Hello",
        "secret": {"type": "string"},
    }
    assert report.findings == {"secret_assignment": 5}
    # Disabled with the text detector of the same name.
    report = RedactionReport()
    assert Redactor(disable=("secret_assignment",)).redact_json({"password": "x"}, report) == {
        "password": "x"
    }


def test_tool_arguments_under_secret_keys_are_redacted_on_the_writer_path():
    # Nothing here matches a text detector: only the key names send it through the exact pass.
    for key in ("password", "pass_word", "x-api-key", "id_token"):
        event = tool_event("login", {"user": "bob", key: "pw"}, "ok")
        redacted, report = Redactor().redact_event(event)
        assert redacted.action.tool_calls[0].arguments == {
            "user": "bob",
            key: "[REDACTED:secret_assignment]",
        }
        assert isinstance(redacted.action.tool_calls[0], ToolCall)
        assert report.findings == {"secret_assignment": 1}


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("aws_secret_access_key", True),
        ("SecretAccessKey", True),
        ("x-api-key", True),
        ("private_key_id", True),
        ("refresh_token", True),
        ("db.password", True),
        ("Pass_Word", True),
        ("secretary", False),
        ("prompt_tokens", False),
        ("keyboard", False),
        ("password_hint", False),
    ],
)
def test_secret_key_names(key, secret):
    assert is_secret_key(key) is secret


def test_iban_rules():
    assert iban_ok("DE89370400440532013000")
    assert iban_ok("DE89 3704 0044 0532 0130 00")  # spacing does not matter
    assert not iban_ok("DE89370400440532013001")  # checksum
    assert not iban_ok("DE8937040044053201300")  # length for DE
    assert not iban_ok("XX89370400440532013000")  # country
    assert len(IBAN_LENGTHS) > 80 and all(15 <= n <= 34 for n in IBAN_LENGTHS.values())


def test_clean_text_is_not_scanned_by_any_regex():
    # The cheap pre-filter holds throughput: ordinary agent text triggers no detector.
    for text in [
        "go to cabinet 2 and take mug 1 from countertop 3",
        "The apple is probably in a fridge; check there first.",
        "You arrive at drawer 4. On it you see a keychain 2 and a pencil 1.",
    ]:
        assert not _builtin_might_match(text), text


def _documented_kinds() -> list[str]:
    section = DOCS.read_text().split("Redaction catalogue (", 1)[1].split("\n\n", 2)[1]
    return re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M)


def test_docs_table_lists_every_detector_in_order():
    assert _documented_kinds() == [d.name for d in CATALOGUE]


def test_secret_keys_in_headers_are_redacted_too():
    traj = agent_trajectory("t-key")
    header = dataclasses.replace(traj.header, task={"env": "web", "login": {"password": "pw1"}})
    redacted = Redactor().redact_header(header)
    assert redacted.task == {"env": "web", "login": {"password": "[REDACTED:secret_assignment]"}}
    assert redacted.governance.redaction == RedactionStatus.REDACTED
    assert Redactor().redact_header(traj.header).governance.redaction == RedactionStatus.CLEAN


def test_user_patterns_run_beside_the_catalogue():
    # Each detector is compiled alone: group names and global flags of user patterns are theirs.
    report = RedactionReport()
    redactor = Redactor(extra_patterns={"a": r"(?i)(?P<n>XQ-\d+)", "b": r"(?P<n>ZW-\d+)"})
    assert redactor.redact_text("xq-1 ZW-2", report) == "[REDACTED:a] [REDACTED:b]"
    # Empty matches replace nothing (and do not loop).
    assert Redactor(extra_patterns={"e": r"x*"}).redact_text("abc", report) == "abc"
    report = RedactionReport()
    redactor = Redactor(extra_patterns={"ticket": r"TCK-\d{4}"})
    assert redactor.redact_text("TCK-1234 password=hunter2hunter2", report) == (
        "[REDACTED:ticket] password=[REDACTED:secret_assignment]"
    )
