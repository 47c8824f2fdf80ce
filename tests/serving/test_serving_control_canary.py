"""A canary through the real gateway on loopback with the real `openai` client: every event of
a session is attributed to the composite version that served it (the canary's candidate for
the sessions its hash split picks, the baseline for the others), and the canary is started,
read and stopped through the admin routes."""

from __future__ import annotations

from serving_harness import (
    ADMIN_KEY,
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    module_server,
    read_trajectories,
    session_client,
)

from atdp_io import EventKind
from serving.control.canary import Canary, serves_candidate
from serving.gateway.app import AUDIT

MODEL = "sao-test"
TENANT = "canary-co"
server = module_server()


def _put(url: str, composite: dict):
    path = f"/rl/control/{TENANT}"
    return api(url, path, {"composite": composite}, ADMIN_KEY, method="PUT")


def _session(url: str) -> str:
    """One session: a chat call, a reported tool call, its end; returns its id."""
    session_id, client = session_client(url, TENANT)
    client.chat.completions.create(
        model=MODEL, messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], temperature=0, max_tokens=4
    )
    body = {"type": "tool", "name": "get_weather", "call_id": "call-1", "result": "12 C"}
    assert api(url, "/rl/event", body, key=client.api_key)[0] == 200
    assert api(url, "/rl/end_session", {"success": True}, key=client.api_key)[0] == 200
    return session_id


def _prompt(parts, events) -> str:
    (llm,) = [e for e in events if e.kind == EventKind.LLM_CALL]
    return parts.proxy.tokenizer.decode(llm.llm.input_ids.tolist())


def test_every_event_of_a_canary_names_the_version_that_served_it(server):
    thread, parts, buffer = server
    assert _put(thread.url, {"harness": {"system_prompt": "Stable agent."}})[0] == 200
    assert _put(thread.url, {"harness": {"system_prompt": "Candidate agent."}})[0] == 200
    path = f"/rl/control/{TENANT}/canary"
    status, started = api(thread.url, path, {"share": 0.5, "reason": "try v2"}, method="PUT")
    assert status == 200, started
    assert (started["version"], started["baseline"], started["share"]) == (2, 1, 0.5)
    assert api(thread.url, path, method="GET")[1]["canary"] == started
    canary = Canary.from_json(started)

    arms: dict[int, list[str]] = {1: [], 2: []}
    for _ in range(40):  # until each arm has two sessions (a fair coin per session)
        session_id = _session(thread.url)
        arms[2 if serves_candidate(canary, session_id) else 1].append(session_id)
        if min(len(a) for a in arms.values()) >= 2:
            break
    assert min(len(a) for a in arms.values()) >= 2, arms
    trajectories = read_trajectories(buffer, TENANT)
    for version, sessions in arms.items():
        for session_id in sessions:
            events = trajectories[session_id].events
            kinds = {e.kind for e in events}
            assert {EventKind.MESSAGE, EventKind.LLM_CALL, EventKind.TOOL_CALL} <= kinds
            assert all(e.metadata.composite_version == version for e in events)
            prompt = _prompt(parts, events)
            assert ("Candidate agent." in prompt) == (version == 2)
            assert ("Stable agent." in prompt) == (version == 1)

    # dropping the canary rolls back to the baseline for everyone
    status, stopped = api(thread.url, path + "/stop", {"keep": False, "reason": "drop"})
    assert status == 200, stopped
    assert (stopped["version"], stopped["rollback_of"]) == (3, 1)
    assert api(thread.url, path, method="GET")[1] == {"canary": None}
    after = _session(thread.url)
    events = read_trajectories(buffer, TENANT)[after].events
    assert all(e.metadata.composite_version == 3 for e in events)
    assert "Stable agent." in _prompt(parts, events)


def test_bad_canary_requests_are_refused_and_audited(server):
    thread, parts, _ = server
    tenant = "canary-bad"
    path = f"/rl/control/{tenant}/canary"
    _, session = api(thread.url, "/rl/start_session", {"tenant": tenant})
    cases = [
        (api(thread.url, path, {"share": 0.5}, method="PUT"), 409, "newest version (0)"),
        (api(thread.url, path, {"share": 1.5}, method="PUT"), 400, "'share'"),
        (api(thread.url, path, {"share": 0.5, "salt": ""}, method="PUT"), 400, "'salt'"),
        (api(thread.url, path + "/stop", {"keep": True}), 409, "no canary running"),
        (api(thread.url, path + "/stop", {"keep": "yes"}), 400, "'keep'"),
        (api(thread.url, path, {"share": 0.5}, session["api_key"], "PUT"), 403, "admin key"),
    ]
    for (status, body), expected, words in cases:
        assert status == expected, body
        assert words in body["error"]["message"], body
    entries = [
        e
        for e in parts.app[AUDIT].entries()
        if e.get("tenant") == tenant and e.get("operation", "").startswith("canary")
    ]
    assert [e["status"] for e in entries] == [409, 400, 400, 409, 400, 403]
