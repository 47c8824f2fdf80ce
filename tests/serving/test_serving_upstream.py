"""`python -m serving --upstream URL`: gateway, router and data proxy in front of another
OpenAI-compatible server (here a second copy of ours), recording what it returns."""

import json

import openai
import pytest
from serving_harness import (
    ADMIN_KEY,
    ServerThread,
    api,
    free_port,
    local_server,
    read_trajectories,
    start_process,
    stop_process,
    subprocess_env,
    wait_healthy,
)

from atdp_io import AtdpStore, EventKind, EventMetadata, ReplayClass
from serving.common.openai_requests import parse_chat_request
from serving.local import LocalServerConfig, create_local_server
from serving.proxy.config import ProxyConfig
from serving.proxy.upstream import UpstreamClient, UpstreamProxy, UpstreamReply, upstream_body

MODEL = "sao-test"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("upstream")
    with local_server(root / "upstream_buffer") as (upstream, _):
        status, session = api(upstream.url, "/rl/start_session", {"tenant": "backend"})
        assert status == 200
        config = LocalServerConfig(
            buffer=str(root / "front_buffer"),
            admin_key=ADMIN_KEY,
            upstream=upstream.url + "/v1",
            upstream_key=session["api_key"],
        )
        front = ServerThread(create_local_server(config).app)
        try:
            yield front, upstream, root / "front_buffer"
        finally:
            front.stop()


def test_models_and_health_come_from_the_upstream(servers):
    front, _, _ = servers
    status, session = api(front.url, "/rl/start_session", {"tenant": "acme"})
    assert status == 200 and session["model"] == MODEL
    client = openai.OpenAI(base_url=front.url + "/v1", api_key=session["api_key"], max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    status, health = api(front.url, "/health", key=None, method="GET")
    assert status == 200 and health["workers_alive"] == 1


def test_calls_through_an_upstream_are_recorded_as_text(servers):
    front, _, buffer = servers
    status, session = api(front.url, "/rl/start_session", {"tenant": "acme"})
    assert status == 200
    client = openai.OpenAI(base_url=front.url + "/v1", api_key=session["api_key"], max_retries=0)
    messages = [{"role": "user", "content": "open the fridge"}]
    plain = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, seed=4, logprobs=True
    )
    assert plain.id.startswith("chatcmpl-" + session["session_id"])
    served = [(t.token, t.logprob) for t in plain.choices[0].logprobs.content]
    messages += [
        {"role": "assistant", "content": plain.choices[0].message.content or ""},
        {"role": "user", "content": "and then?"},
    ]
    text, chunks = "", []
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=6, seed=5, stream=True
    ):
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)  # not asked for

    trajectory = read_trajectories(buffer, "acme")[session["session_id"]]
    replies = [e for e in trajectory.events if e.metadata.interaction_id]
    assert [e.metadata.interaction_id for e in replies] == [plain.id, chunks[0].id]
    for event, content in zip(replies, [plain.choices[0].message.content, text], strict=True):
        assert event.kind == EventKind.MESSAGE  # no token ids came back: text, not trainable
        assert event.observation["content"] == content
        assert event.metadata.extra["exact_tokens"] is False
        assert event.metadata.extra["upstream"] == front_upstream(servers)
    first = replies[0].metadata.extra["logprobs"]
    assert list(zip(first["tokens"], first["logprobs"], strict=True)) == served
    # the user messages: each recorded once, as the conversation grew
    users = [e.observation["content"] for e in trajectory.events if e.kind == EventKind.MESSAGE]
    assert users.count("open the fridge") == 1 and users.count("and then?") == 1

    status, answer = api(
        front.url, "/rl/set_reward", {"reward": 1.0, "interaction_id": plain.id}, ADMIN_KEY
    )
    assert status == 200, answer


def front_upstream(servers) -> str:
    _, upstream, _ = servers
    return upstream.url + "/v1"


def test_upstream_errors_come_back_in_the_openai_shape(servers):
    front, _, _ = servers
    status, session = api(front.url, "/rl/start_session", {"tenant": "acme"})
    assert status == 200
    client = openai.OpenAI(base_url=front.url + "/v1", api_key=session["api_key"], max_retries=0)
    with pytest.raises(openai.BadRequestError, match="completions is not recorded"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    # the upstream's own 400 (its context is 512 tokens) reaches the client unchanged
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "word " * 3000}],
            max_tokens=2,
        )


DOOR = {
    "type": "function",
    "function": {
        "name": "open_door",
        "parameters": {
            "type": "object",
            "properties": {"door": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["door"],
            "additionalProperties": False,
        },
    },
}
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_agent_fields_reach_the_upstream_in_openai_form(servers):
    """A named tool_choice, a json_schema response_format and reasoning_effort are validated
    by the front and sent on in OpenAI's wire form (the upstream, a copy of ours, enforces
    them); n > 1 is refused with a clear error; a Responses call is recorded as such."""
    front, _, buffer = servers
    status, session = api(front.url, "/rl/start_session", {"tenant": "fields"})
    assert status == 200
    client = openai.OpenAI(base_url=front.url + "/v1", api_key=session["api_key"], max_retries=0)
    messages = [{"role": "user", "content": "open a door"}]
    forced = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=[DOOR],
        tool_choice={"type": "function", "function": {"name": "open_door"}},
        max_tokens=120,
        seed=1,
        reasoning_effort="none",
    )
    (call,) = forced.choices[0].message.tool_calls
    assert call.function.name == "open_door"
    assert json.loads(call.function.arguments)["door"] in range(1, 10)
    structured = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
        },
        max_tokens=80,
        seed=2,
    )
    assert isinstance(json.loads(structured.choices[0].message.content)["ok"], bool)
    with pytest.raises(openai.BadRequestError, match="n > 1") as refused:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, n=2)
    assert refused.value.body["param"] == "n"
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=4)
    trajectory = read_trajectories(buffer, "fields")[session["session_id"]]
    replies = {e.metadata.interaction_id: e for e in trajectory.events if e.metadata.interaction_id}
    assert set(replies) == {forced.id, structured.id, response.id}  # the refused call: nothing
    assert replies[forced.id].action.tool_calls[0].name == "open_door"
    assert replies[response.id].metadata.extra["endpoint"] == "responses"
    assert replies[forced.id].metadata.extra["endpoint"] == "chat"


def test_upstream_body_speaks_openai():
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [DOOR],
            "tool_choice": {"type": "function", "function": {"name": "open_door"}},
            "response_format": {"type": "json_object"},
            "reasoning_effort": "low",
        }
    )
    body = upstream_body(request, "m", token_ids=False)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "open_door"}}
    assert body["response_format"] == {"type": "json_object"}
    assert body["reasoning_effort"] == "low" and "n" not in body
    request = parse_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": ANSWER},
            },
        }
    )
    spec = upstream_body(request, "m", token_ids=True)["response_format"]["json_schema"]
    assert spec == {"name": "a", "schema": ANSWER, "strict": False}
    request = parse_chat_request(  # the legacy spelling goes upstream as vLLM's current one
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "guided_choice": ["a", "b"]}
    )
    body = upstream_body(request, "m", token_ids=False)
    assert body["structured_outputs"] == {"choice": ["a", "b"]} and "guided_choice" not in body


# A chat completion as vLLM answers it with `return_token_ids` and `logprobs` (the shape of
# vLLM's OpenAI server: prompt_token_ids at the top, token_ids on the choice).
VLLM_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "qwen",
    "prompt_token_ids": [1, 5, 9, 2],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi!", "reasoning_content": "short"},
            "logprobs": {
                "content": [
                    {"token": "Hi", "logprob": -0.5, "top_logprobs": []},
                    {"token": "!", "logprob": -0.25, "top_logprobs": []},
                ]
            },
            "finish_reason": "stop",
            "token_ids": [17, 3],
        }
    ],
    "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
}


def test_token_ids_from_the_upstream_make_an_exact_llm_call(tmp_path):
    reply = UpstreamReply.from_answer(VLLM_ANSWER)
    assert reply.exact and reply.prompt_ids == [1, 5, 9, 2] and reply.output_ids == [17, 3]
    assert reply.reasoning == "short" and reply.logprobs == [-0.5, -0.25]
    proxy = UpstreamProxy(
        ProxyConfig(buffer=str(tmp_path), purge_every_s=None),
        upstream=UpstreamClient("http://127.0.0.1:9/v1"),
        model_info={"model_id": "qwen", "context_length": 4096, "template_fingerprint": "up"},
        store=AtdpStore.open(str(tmp_path)),
    )
    request = parse_chat_request({"model": "qwen", "messages": [{"role": "user", "content": "x"}]})
    metadata = EventMetadata(extra={"exact_tokens": True})
    event = proxy._reply_event(request, None, reply, metadata)
    assert event.kind == EventKind.LLM_CALL and event.replay == ReplayClass.APPROXIMATE
    assert event.llm.input_ids.tolist() == [1, 5, 9, 2]
    assert event.llm.output_ids.tolist() == [17, 3]
    assert event.llm.output_logprobs.tolist() == [-0.5, -0.25]
    assert event.hidden == {"reasoning": "short"} and event.action.text == "Hi!"
    # without token ids (or with a log-prob missing) it is text only
    text_only = {**VLLM_ANSWER, "prompt_token_ids": None}
    assert not UpstreamReply.from_answer(text_only).exact
    event = proxy._reply_event(request, None, UpstreamReply.from_answer(text_only), metadata)
    assert event.kind == EventKind.MESSAGE and event.observation["content"] == "Hi!"
    assert event.metadata.extra["logprobs"] == {"tokens": ["Hi", "!"], "logprobs": [-0.5, -0.25]}


def test_streamed_chunks_assemble_like_the_whole_answer():
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"reasoning_content": "th"}, "token_ids": [7]}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}
                        ]
                    },
                    "token_ids": [8],
                    "logprobs": {"content": [{"token": "x", "logprob": -1.0}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                    "finish_reason": "tool_calls",
                }
            ]
        },
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    reply = UpstreamReply()
    for chunk in chunks:
        reply.add_chunk(chunk)
    assert reply.reasoning == "th" and reply.content is None
    assert reply.tool_calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert reply.tool_calls[0]["id"] == "c1" and reply.finish_reason == "tool_calls"
    assert reply.prompt_ids == [1, 2] and reply.output_ids == [7, 8]
    assert reply.usage == {"completion_tokens": 2}
    assert not reply.exact  # one log-prob for two tokens: not exact


@pytest.mark.slow
def test_the_command_line_serves_in_front_of_an_upstream(servers, tmp_path):
    """`python -m serving --upstream URL` as an operator runs it (its own process)."""
    _, upstream, _ = servers
    status, backend = api(upstream.url, "/rl/start_session", {"tenant": "backend"})
    assert status == 200
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        "serving", "--upstream", upstream.url + "/v1", "--upstream-key", backend["api_key"],
        "--buffer", str(tmp_path / "buffer"), "--admin-key", ADMIN_KEY, "--port", str(port),
    ]  # fmt: skip
    log = tmp_path / "serving.log"
    process = start_process(args, subprocess_env(tmp_path / "jax_cache"), log)
    try:
        wait_healthy(url, process, log)
        status, session = api(url, "/rl/start_session", {"tenant": "ops"})
        assert status == 200, session
        client = openai.OpenAI(base_url=url + "/v1", api_key=session["api_key"], max_retries=0)
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.id.startswith("chatcmpl-" + session["session_id"])
    finally:
        stop_process(process)
    (trajectory,) = read_trajectories(tmp_path / "buffer", "ops").values()
    (event,) = [e for e in trajectory.events if e.metadata.interaction_id == reply.id]
    assert event.observation["content"] == reply.choices[0].message.content
