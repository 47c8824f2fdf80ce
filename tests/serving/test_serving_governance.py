"""Data rights and cost through the real server: deletion and consent withdrawal (admin and
tenant scope, audited, bad bodies refused without change), per-call cost in the ATDP metadata
and per-tenant / per-session totals, and the scheduled purge of expired trajectories."""

import asyncio
import concurrent.futures
import json
import time

import grain
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving_harness import ADMIN_KEY, ServerThread, api, local_server, read_trajectories

from atdp_io import AtdpStore, ConsentStatus, EventKind, TrajectoryNotFound
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.retention import RETENTION_PRINCIPAL
from serving.common.errors import ApiError
from serving.common.ids import session_of
from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.gateway.audit import AUDIT_FILE
from serving.gateway.client import GatewayClient
from serving.proxy import app as proxy_app
from serving.proxy.client import HttpProxyClient
from serving.proxy.config import ProxyConfig
from serving.proxy.proxy import DataProxy

MODEL = "sao-test"
KEYS = {t: f"sk-{t}-0123456789abcdef" for t in ("acme", "globex", "initech", "brief")}
PROMPT_PRICE, COMPLETION_PRICE = 1000.0, 3000.0  # USD per 1M tokens: large, so costs show
PURGE_EVERY_S = 1.0
BRIEF_RETENTION_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("governance")
    tenants = {t: {"api_keys": [k]} for t, k in KEYS.items()}
    tenants["brief"]["retention_days"] = BRIEF_RETENTION_S / 86400.0
    (root / "tenants.json").write_text(json.dumps({"tenants": tenants}))
    prices = {
        "models": {
            MODEL: {"prompt_usd_per_1m": PROMPT_PRICE, "completion_usd_per_1m": COMPLETION_PRICE}
        }
    }
    (root / "prices.json").write_text(json.dumps(prices))
    with local_server(
        root / "buffer",
        tenants=str(root / "tenants.json"),
        prices=str(root / "prices.json"),
        purge_every_s=PURGE_EVERY_S,
    ) as (thread, _):
        yield thread, root / "buffer"


def start(url, key, **body):
    status, answer = api(url, "/rl/start_session", body, key)
    assert status == 200, answer
    return answer


def chat(url, key, text):
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=3
    )


def session_with(url, tenant, text, **body):
    """A session of `tenant` with one recorded call carrying `text`, ended."""
    session = start(url, KEYS[tenant], **body)
    chat(url, session["api_key"], text)
    status, ended = api(url, "/rl/end_session", {}, session["api_key"])
    assert status == 200, ended
    return session


def disk_bytes(buffer, tenant) -> bytes:
    files = sorted(p for p in (buffer / "tenants" / tenant).rglob("*") if p.is_file())
    return b"\n".join(p.read_bytes() for p in files)


def data_files(buffer, tenant) -> dict:
    """Every file of `tenant`'s partition but its audit log (which the scheduled purge and
    every maintenance pass add to), by path."""
    root = buffer / "tenants" / tenant
    files = (p for p in root.rglob("*") if p.is_file() and "audit" not in p.relative_to(root).parts)
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def loaded(buffer, tenant) -> dict:
    """What a training loader reads from `tenant` now: its stats after one epoch."""
    store = AtdpStore.open(str(buffer), create=False)
    loader = AtdpLoader(store, [tenant], principal=tenant, config=LoaderConfig(rows=4, seq_len=512))
    for _ in loader.epoch(shard=grain.sharding.ShardOptions(0, 1), shuffle=False):
        pass
    return loader.stats.snapshot()


def store_audit(buffer, tenant, action):
    store = AtdpStore.open(str(buffer), create=False)
    return [e for e in store.audit_log(tenant) if e["action"] == action]


def gateway_audit(buffer):
    path = buffer / "gateway_state" / AUDIT_FILE
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_error(status_body, status, fragment):
    got, body = status_body
    assert got == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert fragment in body["error"]["message"], body


# --------------------------------------------------------------------------- deletion


def test_deleting_a_session_erases_its_bytes_and_no_reader_finds_it(server):
    thread, buffer = server
    gone = session_with(thread.url, "acme", "zebraquartzmarker gone")
    kept = session_with(thread.url, "acme", "zebraquartzmarker kept")
    assert disk_bytes(buffer, "acme").count(b"zebraquartzmarker gone") >= 1
    before = loaded(buffer, "acme")["trajectories_read"]

    status, answer = api(
        thread.url,
        "/rl/delete",
        {"session_id": gone["session_id"], "reason": "user asked"},
        KEYS["acme"],
    )
    assert status == 200, answer
    assert answer == {"tenant": "acme", "deleted": [gone["session_id"]], "count": 1}

    assert b"zebraquartzmarker gone" not in disk_bytes(buffer, "acme")
    assert b"zebraquartzmarker kept" in disk_bytes(buffer, "acme")
    trajectories = read_trajectories(buffer, "acme")
    assert gone["session_id"] not in trajectories and kept["session_id"] in trajectories
    reader = AtdpStore.open(str(buffer), create=False).reader("acme", principal="acme")
    reader.refresh()
    with pytest.raises(TrajectoryNotFound):
        reader.read(gone["session_id"])
    after = loaded(buffer, "acme")
    assert after["trajectories_read"] == before - 1
    # audited in the tenant's log (with who and why) and in the gateway's
    (entry,) = [
        e
        for e in store_audit(buffer, "acme", "delete")
        if gone["session_id"] in e["detail"]["deleted"]
    ]
    assert entry["principal"] == "acme" and entry["detail"]["reason"] == "user asked"
    assert any(
        e["route"] == "/rl/delete"
        and e["status"] == 200
        and e["trajectories"] == [gone["session_id"]]
        for e in gateway_audit(buffer)
    )
    # the session is over: its key can no longer add to it, and deleting again finds nothing
    with pytest.raises(openai.ConflictError):
        chat(thread.url, gone["api_key"], "more")
    status, again = api(thread.url, "/rl/delete", {"session_id": gone["session_id"]}, ADMIN_KEY)
    assert status == 200 and again["deleted"] == []


def test_a_deletion_racing_a_call_answers_no_5xx(server):
    thread, buffer = server
    for _ in range(4):
        session = start(thread.url, KEYS["acme"])
        chat(thread.url, session["api_key"], "before the race")
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            call = pool.submit(
                api,
                thread.url,
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 8},
                session["api_key"],
            )
            deletion = pool.submit(
                api, thread.url, "/rl/delete", {"session_id": session["session_id"]}, KEYS["acme"]
            )
            call_status, _ = call.result()
            delete_status, answer = deletion.result()
        assert delete_status == 200 and answer["deleted"] == [session["session_id"]], answer
        # recorded before the erasure (200), refused at its append (409 ended) or after it
        # (404: the proxy no longer has the session); never a 5xx
        assert call_status in (200, 404, 409), call_status
        assert session["session_id"] not in read_trajectories(buffer, "acme")
    assert api(thread.url, "/health", method="GET", key=None)[0] == 200


def test_admin_deletes_a_users_data_across_sessions(server):
    thread, buffer = server
    first = session_with(thread.url, "acme", "hello", user_id="user-bob")
    second = session_with(thread.url, "acme", "again", user_id="user-bob")
    other = session_with(thread.url, "acme", "hi", user_id="user-carol")
    status, missing_tenant = api(thread.url, "/rl/delete", {"user_id": "user-bob"}, ADMIN_KEY)
    assert_error((status, missing_tenant), 400, "'tenant' is required")

    deleted = GatewayClient(thread.url, ADMIN_KEY).delete("acme", user_id="user-bob")
    assert sorted(deleted) == sorted([first["session_id"], second["session_id"]])
    trajectories = read_trajectories(buffer, "acme")
    assert first["session_id"] not in trajectories and second["session_id"] not in trajectories
    assert trajectories[other["session_id"]].header.task["user_id"] == "user-carol"
    entries = store_audit(buffer, "acme", "delete")
    assert entries[-1]["principal"] == "operator:gateway-admin"


def test_a_tenant_cannot_touch_another_tenants_data(server):
    thread, buffer = server
    victim = session_with(thread.url, "globex", "globex secret plans")
    victim_id = victim["session_id"]
    for route in ("/rl/delete", "/rl/withdraw_consent"):
        assert_error(
            api(thread.url, route, {"tenant": "globex", "session_id": victim_id}, KEYS["acme"]),
            403,
            "own tenant",
        )
        # naming the session without the tenant: the same 404 as a session that does not exist
        assert_error(
            api(thread.url, route, {"session_id": victim_id}, KEYS["acme"]), 404, "no session"
        )
        # by trajectory id: the call acts on the caller's own tenant only, where there is none
        status, answer = api(thread.url, route, {"trajectory_ids": [victim_id]}, KEYS["acme"])
        assert status == 200 and answer["count"] == 0, answer
        assert_error(
            api(thread.url, route, {"session_id": victim_id}, victim["api_key"]),
            403,
            "session key",
        )
    trajectory = read_trajectories(buffer, "globex")[victim_id]
    assert trajectory.header.governance.consent == ConsentStatus.NOT_APPLICABLE
    assert b"globex secret plans" in disk_bytes(buffer, "globex")
    assert not store_audit(buffer, "globex", "delete")
    refused = [e for e in gateway_audit(buffer) if e.get("status") == 403]
    assert any(e["principal"] == "acme" and e["tenant"] == "globex" for e in refused)
    assert any(e["principal"] == f"session:{victim_id}" for e in refused)


# --------------------------------------------------------------------------- consent


def test_withdrawn_consent_stops_training_reads_but_keeps_the_data(server):
    thread, buffer = server
    withdrawn = session_with(thread.url, "initech", "consent one")
    session_with(thread.url, "initech", "consent two")
    assert loaded(buffer, "initech")["trajectories_read"] == 2

    status, answer = api(
        thread.url, "/rl/withdraw_consent", {"session_id": withdrawn["session_id"]}, KEYS["initech"]
    )
    assert status == 200, answer
    assert answer == {"tenant": "initech", "withdrawn": [withdrawn["session_id"]], "count": 1}

    stats = loaded(buffer, "initech")
    assert stats["trajectories_read"] == 1 and stats["dropped_ineligible_consent"] == 1
    trajectory = read_trajectories(buffer, "initech")[withdrawn["session_id"]]  # still stored
    assert trajectory.header.session_id == withdrawn["session_id"]
    exported = httpx.post(
        thread.url + "/rl/export",
        json={"eligible_only": True},
        headers={"Authorization": f"Bearer {KEYS['initech']}"},
        timeout=60,
    )
    assert exported.status_code == 200, exported.text
    lines = exported.text.splitlines()
    ids = [json.loads(line)["trajectory"]["header"]["trajectory_id"] for line in lines]
    assert withdrawn["session_id"] not in ids and len(ids) == 1
    (entry,) = store_audit(buffer, "initech", "withdraw_consent")
    assert entry["principal"] == "initech" and entry["detail"]["withdrawn"] == [
        withdrawn["session_id"]
    ]


BAD_BODIES = [
    ({}, "exactly one of"),
    ({"session_id": "a", "user_id": "b"}, "exactly one of"),
    ({"user_id": ""}, "'user_id' must be"),
    ({"session_id": 7}, "'session_id' must be"),
    ({"trajectory_ids": "t1"}, "'trajectory_ids' must be"),
    ({"trajectory_ids": []}, "'trajectory_ids' must be"),
    ({"trajectory_ids": ["ok", 3]}, "'trajectory_ids' must be"),
    ({"trajectory_ids": ["x"] * 10_001}, "'trajectory_ids' must be"),
    ({"user_id": "u", "everything": True}, "unknown fields ['everything']"),
    ({"user_id": "u", "tenant": ["acme"]}, "'tenant' must be a string"),
]


@pytest.mark.parametrize("route", ["/rl/delete", "/rl/withdraw_consent"])
def test_bad_bodies_are_400s_and_change_nothing(server, route):
    thread, buffer = server
    session = session_with(thread.url, "acme", "stays put", user_id="user-dave")
    stored_before = data_files(buffer, "acme")
    bodies = [*BAD_BODIES, ({"user_id": "user-dave", "reason": ""}, "")]
    if route == "/rl/delete":
        bodies[-1] = ({"user_id": "user-dave", "reason": " "}, "'reason' must be")
    else:
        bodies[-1] = ({"user_id": "user-dave", "reason": "x"}, "unknown fields ['reason']")
    for body, fragment in bodies:
        assert_error(api(thread.url, route, body, KEYS["acme"]), 400, fragment)
    for raw in (b"", b"not json", b"[1, 2]"):
        response = httpx.post(
            thread.url + route,
            content=raw,
            headers={"Authorization": f"Bearer {KEYS['acme']}"},
            timeout=60,
        )
        assert response.status_code == 400, response.text
    assert_error(api(thread.url, route, {"user_id": "u"}, key=None), 401, "missing API key")
    assert_error(
        api(thread.url, route, {"tenant": "nobody", "user_id": "u"}, ADMIN_KEY), 404, "unknown"
    )
    # nothing changed: every stored byte but the audit log's is as it was
    assert data_files(buffer, "acme") == stored_before
    assert session["session_id"] in read_trajectories(buffer, "acme")
    assert api(thread.url, "/health", method="GET", key=None)[0] == 200


# --------------------------------------------------------------------------- cost


def _cost_total(url) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    totals = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sao_proxy_cost_usd_total":
                totals[sample.labels["tenant"]] = sample.value
                assert sample.labels["model"] == MODEL
    return totals


def test_each_call_is_priced_in_its_metadata_and_summed_per_session_and_tenant(server):
    thread, buffer = server
    before = _cost_total(thread.url)
    session = start(thread.url, KEYS["globex"])
    for text in ("what is the price", "and another question"):
        chat(thread.url, session["api_key"], text)
    status, so_far = api(thread.url, "/rl/session_cost", {}, session["api_key"])
    assert status == 200, so_far
    client_cost = GatewayClient(thread.url, KEYS["globex"]).session_cost(session["session_id"])
    status, ended = api(thread.url, "/rl/end_session", {}, session["api_key"])
    assert status == 200, ended

    events = read_trajectories(buffer, "globex")[session["session_id"]].events
    calls = [e for e in events if e.kind == EventKind.LLM_CALL]
    assert len(calls) == 2
    for call in calls:
        m = call.metadata
        expected = (m.prompt_tokens * PROMPT_PRICE + m.completion_tokens * COMPLETION_PRICE) / 1e6
        assert m.prompt_tokens > 0 and m.cost_usd == pytest.approx(expected, rel=1e-12)
    total = sum(c.metadata.cost_usd for c in calls)
    assert so_far["cost_usd"] == pytest.approx(total) and ended["cost_usd"] == pytest.approx(total)
    assert client_cost == so_far["cost_usd"]
    assert so_far["session_id"] == session["session_id"]
    # another tenant's key cannot read this session's cost
    assert_error(
        api(thread.url, "/rl/session_cost", {"session_id": session["session_id"]}, KEYS["acme"]),
        404,
        "no session",
    )
    # a one-call trajectory (tenant key, no session) is priced too
    one_call = chat(thread.url, KEYS["globex"], "one call")
    single = read_trajectories(buffer, "globex")[session_of(one_call.id)]
    total += single.events[-1].metadata.cost_usd
    after = _cost_total(thread.url)
    assert after["globex"] - before.get("globex", 0.0) == pytest.approx(total)


# --------------------------------------------------------------------------- retention


def test_the_serving_process_purges_expired_trajectories_on_its_schedule(server):
    thread, buffer = server
    answer = chat(thread.url, KEYS["brief"], "shortlived marker text")
    trajectory_id = session_of(answer.id)
    deadline = time.monotonic() + BRIEF_RETENTION_S + 20 * PURGE_EVERY_S
    # readers refuse expired data at once (read time); wait for the schedule to erase its bytes
    while time.monotonic() < deadline:
        if b"shortlived marker text" not in disk_bytes(buffer, "brief"):
            break
        time.sleep(0.2)
    assert trajectory_id not in read_trajectories(buffer, "brief")
    assert b"shortlived marker text" not in disk_bytes(buffer, "brief")
    purges = [e for e in store_audit(buffer, "brief", "purge") if e["detail"]["purged"]]
    assert purges and all(e["principal"] == RETENTION_PRINCIPAL for e in purges)


# --------------------------------------------------------------------------- proxy over HTTP

GOVERNANCE = {
    "classification": "internal",
    "legal_basis": "legitimate_interest",
    "consent": "not_applicable",
    "training_eligible": True,
    "human_review": "not_required",
    "expires_at": None,
}


def test_the_proxy_routes_over_http_and_its_purge_runs_with_its_app(tmp_path):
    """The gateway of a separate-process deployment reaches a proxy's deletion, consent and
    cost routes through HttpProxyClient; the proxy app starts and stops its purge schedule."""
    config = ProxyConfig(buffer=str(tmp_path / "buffer"), purge_every_s=0.05)
    proxy = DataProxy(
        config,
        tokenizer=build_tiny_tokenizer(),
        model_info={"model_id": MODEL, "context_length": 64, "template_fingerprint": "fp"},
        store=AtdpStore.open(config.buffer),
        router=None,
        worker_client=None,
    )
    thread = ServerThread(proxy_app.create_app(config, proxy=proxy))

    async def calls():
        client = HttpProxyClient(thread.url)
        try:
            for sid, user in (("s1", "u1"), ("s2", "u1"), ("s3", "u2")):
                await client.open_session(sid, "acme", GOVERNANCE, {"user_id": user})
            cost = await client.session_cost("s1", "acme")
            withdrawn = await client.withdraw_consent("acme", requested_by="acme", user_id="u1")
            deleted = await client.delete(
                "acme", requested_by="operator:ops", reason="test", trajectory_ids=["s3", "zz"]
            )
            with pytest.raises(ApiError) as refused:
                await client.delete(
                    "acme", requested_by="acme", reason="x", user_id="u1", session_id="s1"
                )
            return cost, withdrawn, deleted, refused.value
        finally:
            await client.close()

    try:
        cost, withdrawn, deleted, refused = asyncio.run(calls())
        runs = proxy.purge_schedule.stats["runs"]
    finally:
        thread.stop()
    assert cost == {"trajectory_id": "s1", "cost_usd": 0.0}
    assert sorted(withdrawn) == ["s1", "s2"] and deleted == ["s3"]
    assert refused.status == 400 and "exactly one" in refused.message
    assert runs >= 1
    stopped = proxy.purge_schedule.stats["runs"]
    time.sleep(0.3)
    assert proxy.purge_schedule.stats["runs"] == stopped  # stopped with the app
    trajectories = read_trajectories(tmp_path / "buffer", "acme")
    assert sorted(trajectories) == ["s1", "s2"]
    reader = AtdpStore.open(str(tmp_path / "buffer")).reader("acme", principal="acme")
    reader.refresh()
    for trajectory_id in ("s1", "s2"):
        assert reader.entry(trajectory_id).governance().consent == ConsentStatus.WITHDRAWN


# --------------------------------------------------------------------------- redaction


def test_secrets_planted_through_the_gateway_never_reach_disk(server):
    """The four kinds the store used to keep in the clear, sent the way an agent sends them:
    in the system prompt, the user's text, a tool call's arguments and a tool's result. (A
    bare 40-character AWS key with no `aws` / `secret` near it is a documented limit of the
    catalogue, docs/atdp_io.md, and is not planted here.)"""
    thread, buffer = server
    pem_lines = ["MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu"]
    private_key = "\n".join(
        ["-----BEGIN RSA PRIVATE KEY-----", *pem_lines, "-----END RSA PRIVATE KEY-----"]
    )
    aws_secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    iban, ssn = "GB82 WEST 1234 5698 7654 32", "078-05-1120"
    cores = [*pem_lines, aws_secret, iban, iban.replace(" ", ""), ssn]
    session = start(thread.url, KEYS["acme"])
    client = openai.OpenAI(
        base_url=thread.url + "/v1", api_key=session["api_key"], max_retries=0, timeout=120
    )
    messages = [
        {"role": "system", "content": f"aws_secret_access_key = {aws_secret}"},
        {"role": "user", "content": f"Pay to {iban}; my SSN is {ssn}."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "deploy", "arguments": json.dumps({"key": private_key})},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": f"$ env\nAWS_SECRET_ACCESS_KEY={aws_secret}",
        },
    ]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    status, ended = api(thread.url, "/rl/end_session", {}, session["api_key"])
    assert status == 200, ended

    on_disk = disk_bytes(buffer, "acme")
    escaped = [json.dumps(core)[1:-1].encode() for core in cores]
    assert not [core for core in cores if core.encode() in on_disk]
    assert not [core for core in escaped if core in on_disk]
    trajectory = read_trajectories(buffer, "acme")[session["session_id"]]
    assert b"[REDACTED:" in on_disk
    tokenizer = build_tiny_tokenizer()
    for event in trajectory.events:
        if event.kind == EventKind.LLM_CALL:  # the token streams were redacted too
            text = tokenizer.decode(event.llm.input_ids.tolist())
            assert not [core for core in cores if core in text], text
