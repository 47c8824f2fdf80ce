"""What is recorded is exactly what was served: for every recorded call, decoding its output
ids gives the text the client received (the real server on loopback, the real `openai`
client, generated conversations, stop strings, streams), later turns extend the sampled ids,
abandoned streams are recorded, top log-probs are stored."""

import json
import time

import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_harness import TOOL_MESSAGES, WEATHER_TOOL, api, local_server, read_trajectories

from atdp_io import EventKind
from atdp_io.rows import extends_previous
from sao_jax.tokenizers import parse_tool_calls
from serving.common.openai_requests import parse_chat_request
from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.proxy.prefix import SampledTurn, TurnIndex, conversation_keys, render_prompt
from serving.proxy.responses import ReasoningStreamFilter, split_reasoning
from serving.proxy.runner import CallContext

MODEL = "sao-test"
TENANT = "exact"
TOKENIZER = build_tiny_tokenizer()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    buffer = tmp_path_factory.mktemp("buffer")
    with local_server(buffer) as (thread, parts):
        yield thread, parts, buffer


def session(url):
    status, answer = api(url, "/rl/start_session", {"tenant": TENANT})
    assert status == 200, answer
    client = openai.OpenAI(
        base_url=url + "/v1", api_key=answer["api_key"], max_retries=0, timeout=600
    )
    return answer["session_id"], client


def llm_calls(buffer, session_id):
    trajectory = read_trajectories(buffer, TENANT)[session_id]
    return trajectory, [e for e in trajectory.events if e.kind == EventKind.LLM_CALL]


def reply_text(reasoning, content):
    """The reply text a client rebuilds from what it received (responses.py docstring)."""
    if reasoning is None:
        return content or ""
    return "<think>" + reasoning + ("</think>" + content if content is not None else "")


def ask(client, messages, *, stream, **settings):
    """(reasoning or None, content or None, finish reason) as the client received them."""
    if not stream:
        reply = client.chat.completions.create(model=MODEL, messages=messages, **settings)
        message = reply.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        return reasoning, message.content, reply.choices[0].finish_reason
    reasoning, content, finish = None, None, None
    for chunk in client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, **settings
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        extra = (delta.model_extra or {}).get("reasoning_content")
        if extra:
            reasoning = (reasoning or "") + extra
        if delta.content:
            content = (content or "") + delta.content
        finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, finish


def sampled_text(call) -> str:
    ids = call.output_ids.tolist()
    if ids and ids[-1] in TOKENIZER.stop_ids:
        ids = ids[:-1]
    return TOKENIZER.decode(ids)


TURN = st.fixed_dictionaries(
    {
        "user": st.text(max_size=24),
        "stream": st.booleans(),
        "max_tokens": st.integers(1, 24),
        "temperature": st.sampled_from([0.0, 0.7, 1.0, 1.6]),
        "seed": st.integers(0, 2**20),
        "stop": st.lists(st.text(alphabet=' e"<>\n\u00e9a{', min_size=1, max_size=2), max_size=2),
    }
)


@given(
    system=st.one_of(st.none(), st.text(max_size=16)), turns=st.lists(TURN, min_size=1, max_size=3)
)
@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_recorded_ids_decode_to_what_the_client_received(server, system, turns):
    thread, _, buffer = server
    session_id, client = session(thread.url)
    messages = [] if system is None else [{"role": "system", "content": system}]
    received = []
    for turn in turns:
        messages.append({"role": "user", "content": turn["user"]})
        reasoning, content, finish = ask(
            client,
            messages,
            stream=turn["stream"],
            max_tokens=turn["max_tokens"],
            temperature=turn["temperature"],
            seed=turn["seed"],
            stop=turn["stop"] or None,
        )
        assert finish in ("stop", "length")
        received.append((reasoning, content, turn["stream"]))
        # the agent echoes the reply as it got it (reasoning is not sent back)
        messages.append({"role": "assistant", "content": content or ""})
    trajectory, calls = llm_calls(buffer, session_id)
    assert len(calls) == len(turns)
    for event, (reasoning, content, streamed), turn in zip(calls, received, turns, strict=True):
        text = sampled_text(event.llm)
        if streamed and reasoning is not None and content is None:
            # a stream cannot tell "</think>" then nothing from an unclosed think block
            assert text in (reply_text(reasoning, None), reply_text(reasoning, ""))
        else:
            assert text == reply_text(reasoning, content)
        assert not any(s in (content or "") for s in turn["stop"])
    # every later call's prompt is the earlier call's prompt + its sampled ids + new messages
    assert extends_previous(trajectory)
    for event in calls[1:]:
        assert "extends" in event.metadata.extra["prompt"]


def test_prefix_rendering_equals_the_template_when_the_ids_agree():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"},
        {"role": "user", "content": "and now?"},
    ]
    first = TOKENIZER.encode_chat(messages[:2])
    sampled = [*TOKENIZER.encode("hello there"), TOKENIZER.token_to_id("<|im_end|>")]
    turns = TurnIndex()
    key = conversation_keys(messages[:3], None)[-1]
    turns.add(SampledTurn(key, np.asarray(first + sampled, np.int32), "chatcmpl-x-y"))
    keys = conversation_keys(messages, None)
    matched = turns.match(keys)
    assert matched is not None and matched[1] == 3
    assert render_prompt(TOKENIZER, messages, None, matched) == TOKENIZER.encode_chat(messages)
    # other tools, or an edited reply, do not match: rendered from scratch
    assert turns.match(conversation_keys(messages, [{"function": {"name": "f"}}])) is None
    edited = [*messages[:2], {"role": "assistant", "content": "hello"}, messages[3]]
    assert turns.match(conversation_keys(edited, None)) is None
    # a reply cut by a stop string (no stop token sampled) is closed by the template's end
    cut = TOKENIZER.encode("hello there")
    turns.add(SampledTurn(key, np.asarray(first + cut, np.int32), "chatcmpl-x-z"))
    assert render_prompt(TOKENIZER, messages, None, turns.match(keys)) == TOKENIZER.encode_chat(
        messages
    )


PIECES = ["<think>", "</think>", "<", "</", "th", "ink>", "a", " "]


@given(st.lists(st.sampled_from(PIECES), max_size=12).map("".join), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_streamed_reasoning_splits_like_the_whole_text(text, chunk):
    reasoning, content = split_reasoning(text)
    assert reply_text(reasoning, content) == text
    stream = ReasoningStreamFilter()
    got_r, got_c = "", ""
    for begin in range(0, len(text), chunk):
        r, c = stream.feed(text[begin : begin + chunk])
        got_r, got_c = got_r + r, got_c + c
    r, c = stream.flush()
    got_r, got_c = got_r + r, got_c + c
    assert got_r == (reasoning or "") and got_c == (content or "")
    assert stream.reasoning == reasoning and stream.closed == (content is not None)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_abandoned_stream_is_recorded_as_cancelled(server, endpoint):
    thread, parts, buffer = server
    session_id, client = session(thread.url)
    settings = dict(model=MODEL, stream=True, max_tokens=400, temperature=1.0, stop=["\0never"])
    if endpoint == "chat":
        messages = [{"role": "user", "content": "tell me a long story"}]
        stream = client.chat.completions.create(messages=messages, **settings)
    else:
        stream = client.completions.create(prompt="Once upon a time", **settings)
    seen = ""
    for chunk in stream:
        if chunk.choices:
            choice = chunk.choices[0]
            seen += (choice.delta.content or "") if endpoint == "chat" else choice.text
        if len(seen) >= 4:
            break
    stream.close()
    deadline = time.monotonic() + 60
    calls = []
    while time.monotonic() < deadline and not calls:
        time.sleep(0.2)
        calls = llm_calls(buffer, session_id)[1]
    assert len(calls) == 1, "the abandoned stream was not recorded"
    call = calls[0]
    assert call.llm.finish_reason == "cancelled"
    assert call.error_class == "generation_cancelled"
    assert sampled_text(call.llm).startswith(seen)
    assert 0 < call.llm.output_ids.shape[0] < 400  # the generation was stopped, not finished
    # the worker freed the slot
    deadline = time.monotonic() + 30
    while parts.worker.engine.status()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert parts.worker.engine.status()["running"] == 0


def test_top_logprobs_are_recorded(server):
    thread, _, buffer = server
    session_id, client = session(thread.url)
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        seed=1,
    )
    (call,) = llm_calls(buffer, session_id)[1]
    top = call.metadata.extra["top_logprobs"]
    served = reply.choices[0].logprobs.content
    assert len(top["ids"]) == len(served) == call.llm.output_ids.shape[0]
    for ids, values, position in zip(top["ids"], top["logprobs"], served, strict=True):
        assert [TOKENIZER.decode([i]) for i in ids] == [t.token for t in position.top_logprobs]
        np.testing.assert_allclose(values, [t.logprob for t in position.top_logprobs], atol=1e-6)


def test_a_tool_call_reply_is_the_parse_of_its_ids_and_the_next_turn_extends_them(server):
    thread, _, buffer = server
    session_id, client = session(thread.url)
    reply = client.chat.completions.create(
        model=MODEL, messages=TOOL_MESSAGES, tools=[WEATHER_TOOL], temperature=0, max_tokens=40
    )
    message = reply.choices[0].message
    (call,) = message.tool_calls
    messages = [
        *TOOL_MESSAGES,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], temperature=0, max_tokens=4
    )
    trajectory, (first, second) = llm_calls(buffer, session_id)
    parsed = parse_tool_calls(sampled_text(first.llm))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        (call.function.name, json.loads(call.function.arguments))
    ]
    assert (parsed.content or None) == message.content
    assert extends_previous(trajectory)
    assert second.metadata.extra["prompt"]["extends"] == reply.id


def test_abandoned_n_sample_stream_records_every_sample(server):
    """A stream of `n` = 2 choices closed during choice 0 (here on the data proxy itself, so
    the moment is exact) cancels both generations; both samples are recorded as cancelled with
    the tokens the proxy had read, the messages once."""
    thread, parts, buffer = server
    session_id, _ = session(thread.url)
    request = parse_chat_request(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me two long stories"}],
            "n": 2,
            "stream": True,
            "max_tokens": 400,
            "seed": 3,
        }
    )

    async def leave_early() -> list[dict]:
        call = CallContext(session_id, TENANT, parts.router.route(session_id))
        stream = await parts.proxy.chat(request, call)
        received = []
        async for data in stream:
            received.append(json.loads(data.removeprefix(b"data: ")))
            if len(received) == 2:  # the role chunk and choice 0's first text
                break
        await stream.aclose()
        return received

    received = thread.call(leave_early())
    assert [c["choices"][0]["index"] for c in received] == [0, 0]
    deadline = time.monotonic() + 60
    calls = []
    while time.monotonic() < deadline and len(calls) < 2:
        time.sleep(0.2)
        calls = llm_calls(buffer, session_id)[1]
    assert [c.llm.decoding.extra["sample_index"] for c in calls] == [0, 1]
    for call in calls:
        assert call.llm.finish_reason == "cancelled"
        assert call.error_class == "generation_cancelled"
        assert 0 < call.llm.output_ids.shape[0] < 400
    delta = received[1]["choices"][0]["delta"]
    seen = delta.get("content") or ""
    assert sampled_text(calls[0].llm).startswith(seen)
    trajectory = read_trajectories(buffer, TENANT)[session_id]
    assert [e.kind for e in trajectory.events].count(EventKind.MESSAGE) == 1  # messages once
    deadline = time.monotonic() + 30
    while parts.worker.engine.status()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert parts.worker.engine.status()["running"] == 0
