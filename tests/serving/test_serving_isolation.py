"""Tenants, keys and bad input: a key never reaches another tenant's or session's data, every
bad request is a 4xx in OpenAI's error shape, and the server keeps serving afterwards."""

import hashlib
import json
import time

import httpx
import openai
import pytest
from serving_harness import ADMIN_KEY, api, local_server, read_trajectories

from atdp_io import AccessDenied, AtdpStore, Classification, EventKind, LegalBasis

MODEL = "sao-test"
ACME_KEY = "sk-acme-0123456789abcdef"
GLOBEX_KEY = "sk-globex-0123456789abcdef"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    tenants = root / "tenants.json"
    tenants.write_text(
        json.dumps(
            {
                "tenants": {
                    "acme": {
                        "api_keys": [ACME_KEY],
                        "classification": "confidential",
                        "legal_basis": "contract",
                        "retention_days": 30,
                    },
                    "globex": {
                        "api_key_sha256": [hashlib.sha256(GLOBEX_KEY.encode()).hexdigest()],
                        "training_eligible": False,
                    },
                }
            }
        )
    )
    with local_server(root / "buffer", tenants=str(tenants)) as (thread, _):
        yield thread, root / "buffer"


def start(url, key, tenant=None):
    status, answer = api(
        url, "/rl/start_session", {} if tenant is None else {"tenant": tenant}, key
    )
    assert status == 200, answer
    return answer


def chat(url, key, text="hi"):
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=3
    )


def assert_error(status_body, status, fragment, code=None):
    got_status, body = status_body
    assert got_status == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"]
    if code is not None:
        assert error["code"] == code


def test_tenant_governance_reaches_the_buffer(server):
    thread, buffer = server
    session = start(thread.url, ACME_KEY)  # a tenant key starts sessions of its own tenant
    assert session["tenant"] == "acme"
    before = time.time()
    chat(thread.url, session["api_key"])
    # a tenant key without a session: an implicit trajectory (grouped by conversation prefix)
    sessionless = chat(thread.url, GLOBEX_KEY)
    header = read_trajectories(buffer, "acme")[session["session_id"]].header
    governance = header.governance
    assert governance.classification == Classification.CONFIDENTIAL
    assert governance.legal_basis == LegalBasis.CONTRACT
    assert 29.9 * 86400 < governance.expires_at - before < 30.1 * 86400
    (globex,) = read_trajectories(buffer, "globex").values()
    assert globex.header.task == {"implicit": True}
    assert globex.header.governance.training_eligible is False
    assert [e.metadata.interaction_id for e in globex.events if e.kind == EventKind.LLM_CALL] == [
        sessionless.id
    ]


def test_keys_never_reach_other_sessions_or_tenants(server):
    thread, buffer = server
    acme = start(thread.url, ADMIN_KEY, "acme")
    globex = start(thread.url, GLOBEX_KEY)
    other_acme = start(thread.url, ACME_KEY)
    reply = chat(thread.url, globex["api_key"])
    chat(thread.url, acme["api_key"])
    url = thread.url
    not_found = "no session"
    # session keys: only their own session
    assert_error(
        api(
            url,
            "/rl/set_reward",
            {"reward": 1, "session_id": globex["session_id"]},
            acme["api_key"],
        ),
        404,
        not_found,
    )
    assert_error(
        api(url, "/rl/set_reward", {"reward": 1, "interaction_id": reply.id}, acme["api_key"]),
        404,
        not_found,
    )
    assert_error(
        api(url, "/rl/end_session", {"session_id": other_acme["session_id"]}, acme["api_key"]),
        404,
        not_found,
    )
    assert_error(api(url, "/rl/export", {}, acme["api_key"]), 403, "cannot export")
    assert_error(
        api(url, "/rl/start_session", {"tenant": "acme"}, acme["api_key"]), 403, "cannot start"
    )
    # tenant keys: only their own tenant
    assert_error(api(url, "/rl/start_session", {"tenant": "globex"}, ACME_KEY), 403, "own tenant")
    assert_error(
        api(url, "/rl/set_reward", {"reward": 1, "interaction_id": reply.id}, ACME_KEY),
        404,
        not_found,
    )
    assert_error(
        api(url, "/rl/end_session", {"session_id": globex["session_id"]}, ACME_KEY), 404, not_found
    )
    assert_error(api(url, "/rl/export", {"tenant": "globex"}, ACME_KEY), 403, "own tenant")
    assert_error(api(url, "/rl/pause", {}, ACME_KEY), 403, "admin key", "admin_only")
    # unknown tenants are refused when a tenants file is in force
    assert_error(
        api(url, "/rl/start_session", {"tenant": "initech"}, ADMIN_KEY), 404, "unknown tenant"
    )
    # a tenant key's export holds only its own trajectories
    response = httpx.post(
        url + "/rl/export", json={}, headers={"Authorization": f"Bearer {ACME_KEY}"}, timeout=60
    )
    tenants = {json.loads(line)["tenant"] for line in response.text.splitlines()}
    ids = {
        json.loads(line)["trajectory"]["header"]["trajectory_id"]
        for line in response.text.splitlines()
    }
    assert tenants == {"acme"} and globex["session_id"] not in ids and acme["session_id"] in ids
    # the admin may act on any session
    status, answer = api(
        url, "/rl/set_reward", {"reward": 2.0, "interaction_id": reply.id}, ADMIN_KEY
    )
    assert status == 200 and answer["session_id"] == globex["session_id"]
    # and storage keeps tenants apart: acme's principal cannot read globex's partition
    store = AtdpStore.open(str(buffer), create=False)
    with pytest.raises(AccessDenied):
        store.reader("globex", principal="acme")


def test_bad_input_gets_clear_4xx_and_server_keeps_serving(server):
    thread, _ = server
    url = thread.url
    key = start(url, ACME_KEY)["api_key"]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as http:

        def raw(path, content, headers=headers, method="POST"):
            response = http.request(method, url + path, content=content, headers=headers)
            return response.status_code, response.json()

        assert_error(raw("/v1/chat/completions", b"{not json"), 400, "not valid JSON")
        assert_error(raw("/v1/chat/completions", b"[1, 2]"), 400, "must be a JSON object")
        assert_error(raw("/v1/chat/completions", b""), 400, "empty")
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        for change, status, fragment in [
            ({"messages": None}, 400, "messages"),
            ({"temperature": "hot"}, 400, "temperature"),
            ({"max_tokens": -3}, 400, "max_tokens"),
            ({"n": 30}, 400, "[1, 8]"),
            ({"model": "gpt-4o"}, 404, "does not exist"),
            ({"messages": [{"role": "user", "content": "word " * 2000}]}, 400, "context"),
            ({"max_tokens": 2**40}, 400, "2147483647"),
            ({"messages": [{"role": "tool", "content": "x"}]}, 400, "tool_call_id"),
        ]:
            assert_error(
                raw("/v1/chat/completions", json.dumps({**body, **change}).encode()),
                status,
                fragment,
            )
        assert_error(
            raw("/v1/completions", json.dumps({"model": MODEL, "prompt": [999999]}).encode()),
            400,
            "token ids",
        )
        no_key = {"Content-Type": "application/json"}
        assert_error(
            raw("/v1/chat/completions", json.dumps(body).encode(), no_key), 401, "missing API key"
        )
        wrong = {"Authorization": "Bearer sk-wrong", "Content-Type": "application/json"}
        assert_error(
            raw("/v1/chat/completions", json.dumps(body).encode(), wrong), 401, "invalid API key"
        )
        admin = {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"}
        assert_error(
            raw("/v1/chat/completions", json.dumps(body).encode(), admin), 403, "admin key cannot"
        )
        assert_error(raw("/v1/nope", b"{}"), 404, "unknown endpoint")
        assert_error(raw("/v1/chat/completions", b"", method="GET"), 405, "not allowed")
        assert_error(raw("/v1/chat/completions", b"x" * (9 << 20)), 413, "too large")
        assert_error(raw("/rl/set_reward", json.dumps({"reward": "lots"}).encode()), 400, "reward")
        assert_error(
            raw("/rl/set_reward", json.dumps({"reward": 1, "interaction_id": "bogus"}).encode()),
            404,
            "unknown interaction",
        )
        assert_error(
            raw("/rl/set_reward", json.dumps({"reward": 1}).encode()), 409, "no completion"
        )
    # openai maps the statuses to its exception types
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "x"}]
        )
    assert chat(url, key).choices[0].finish_reason in ("stop", "length")  # still serving
