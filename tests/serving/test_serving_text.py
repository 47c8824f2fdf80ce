"""Pure pieces of serving: the tiny tokenizer, incremental text with stop strings, tool-call
streaming, conversation diffs, and the AReaL staleness capacity."""

import asyncio
import json

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from serving.common.errors import ApiError
from serving.common.tiny_tokenizer import TINY_VOCAB_SIZE, build_tiny_tokenizer
from serving.proxy.conversation import canonical, new_messages
from serving.proxy.responses import ToolCallStreamFilter, parse_reply
from serving.worker.admission import staleness_capacity, validate_request
from serving.worker.generation import GenerationHandle, GenerationRequest, TextTracker, TokenChunk
from serving.worker.slots import Slot

TOKENIZER = build_tiny_tokenizer()
STOP_IDS = frozenset(TOKENIZER.stop_ids)


def test_tiny_tokenizer_is_deterministic_and_lossless():
    again = build_tiny_tokenizer()
    assert again.backend.to_str() == TOKENIZER.backend.to_str()
    assert TOKENIZER.vocab_size == TINY_VOCAB_SIZE
    text = 'Wëird 文字 😀 <tool_call>{"a": 1}</tool_call> tab\there'
    assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(TOKENIZER.encode(marker)) == 1
    assert TOKENIZER.eos_id == TOKENIZER.token_to_id("<|im_end|>")


def feed(tracker: TextTracker, ids: list[int], chunk: int, *, finish: bool = True):
    """Feed `ids` through `tracker` in growing prefixes, `chunk` ids more each time (the last
    one finished when `finish`); returns (emitted, kept ids, stop hit or None)."""
    emitted, out = "", []
    for begin in range(0, len(ids), chunk):
        out = ids[: begin + chunk]
        delta, keep, hit = tracker.update(out, finish and begin + chunk >= len(ids))
        emitted += delta
        if keep is not None:
            return emitted, out[:keep], hit
    return emitted, out, None


def stream(text: str, stop=(), chunk=3, stop_token=False):
    """Feed `text` through a fresh TextTracker; returns (emitted, kept ids, hit, final text)."""
    ids = TOKENIZER.encode(text) + ([TOKENIZER.eos_id] if stop_token else [])
    tracker = TextTracker(TOKENIZER, stop, STOP_IDS)
    emitted, kept, hit = feed(tracker, ids, chunk)
    return emitted, kept, hit, tracker.final_text(kept)


@given(st.text(alphabet="abc xyz.\n", min_size=1, max_size=60))
@settings(max_examples=60, deadline=None)
def test_text_without_stops_is_emitted_exactly(text):
    emitted, _, hit, final = stream(text)
    assert (emitted, hit, final) == (text, None, text)


def test_stop_token_text_is_not_emitted():
    emitted, ids, _, final = stream("hello there", stop_token=True)
    assert emitted == final == "hello there"
    assert ids[-1] == TOKENIZER.eos_id


@pytest.mark.parametrize("chunk", [1, 2, 5, 50])
def test_stop_string_cuts_reply_and_tokens(chunk):
    text = "The answer is 42. END of story, more text"
    emitted, kept, hit, final = stream(text, stop=("END", "zzz"), chunk=chunk)
    assert hit == "END"
    # cut at the last token boundary before the stop string: the client gets exactly the
    # decode of the kept tokens (the " " token before "E" here ends on the boundary)
    assert emitted == final == TOKENIZER.decode(kept) == "The answer is 42. "
    assert "E" not in TOKENIZER.decode(kept)


@pytest.mark.parametrize("chunk", [1, 3, 50])
def test_stop_string_inside_a_token_drops_the_straddling_token(chunk):
    # " is" is one token; the stop "s" starts inside it, so the reply ends before " is"
    emitted, kept, hit, final = stream("The answer is 42", stop=("s",), chunk=chunk)
    assert hit == "s" and emitted == final == TOKENIZER.decode(kept)
    assert final == "The an"


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_the_stop_string_complete_first_ends_the_reply_however_the_tokens_arrive(chunk):
    # ">" is complete after two characters, "a>>" (which starts earlier) after three: a reply
    # streamed a token at a time stops at ">", so every chunking must (found by hypothesis in
    # the worker-failover test below: the continuing worker saw "a>>" in one update)
    emitted, _, hit, final = stream("a>>", stop=(">", "a>>"), chunk=chunk)
    assert (emitted, hit, final) == ("a", ">", "a")
    # at a tie of ends, the stop that starts first cuts: nothing of "a>" is sent
    emitted, _, hit, final = stream("ba>", stop=(">", "a>"), chunk=chunk)
    assert (emitted, hit, final) == ("b", "a>", "b")


@given(
    st.text(alphabet="ab c\n\u00e9\u6587\U0001f600<>|", min_size=1, max_size=40),
    st.lists(st.text(alphabet="ab c\u00e9>", min_size=1, max_size=3), max_size=3),
    st.integers(1, 4),
    st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_emitted_text_is_always_the_decode_of_kept_tokens(text, stops, chunk, stop_token):
    emitted, kept, _, final = stream(text, stop=tuple(stops), chunk=chunk, stop_token=stop_token)
    if kept and kept[-1] in STOP_IDS:
        kept = kept[:-1]
    assert emitted == final == TOKENIZER.decode(kept)
    assert not any(s in final for s in stops)


@given(
    st.lists(st.integers(3, TINY_VOCAB_SIZE - 1), min_size=1, max_size=60),
    st.lists(st.text(alphabet="ab e\ufffd<", min_size=1, max_size=2), max_size=2),
    st.integers(1, 5),
)
@settings(max_examples=300, deadline=None)
def test_random_token_ids_emit_exactly_their_decode(ids, stops, chunk):
    """What a random model samples: byte tokens that need not form valid UTF-8."""
    tracker = TextTracker(TOKENIZER, tuple(stops), STOP_IDS)
    emitted, kept, _ = feed(tracker, ids, chunk)
    assert emitted == tracker.final_text(kept) == TOKENIZER.decode(kept)


@given(
    st.text(alphabet="ab c\n\u00e9<>|", min_size=2, max_size=40),
    st.lists(st.text(alphabet="ab c\u00e9>", min_size=1, max_size=3), max_size=2),
    st.integers(1, 4),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_a_reply_continued_on_another_worker_emits_what_one_worker_would(text, stops, chunk, data):
    """A worker dies after `cut` tokens; the next one continues with the reply so far as the
    tracker's prefix and what the proxy had received as `sent`: the client's text is the same,
    held-back characters (a partial stop string, a split character) included."""
    ids = TOKENIZER.encode(text)
    assume(len(ids) >= 2)
    whole, _, _, final = stream(text, stop=tuple(stops), chunk=chunk)
    cut = data.draw(st.integers(1, len(ids) - 1))
    first = TextTracker(TOKENIZER, tuple(stops), STOP_IDS)
    emitted, _, hit = feed(first, ids[:cut], chunk, finish=False)  # the first worker dies
    if hit is not None:  # it stopped on a stop string before it died: nothing to continue
        assert emitted == whole
        return
    second = TextTracker(TOKENIZER, tuple(stops), STOP_IDS, prefix=ids[:cut], sent=len(emitted))
    rest_text, kept, _ = feed(second, ids[cut:], chunk)
    assert emitted + rest_text == whole == final
    assert second.final_text(kept) == final


def test_special_tokens_in_a_reply_are_returned_as_text():
    ids = [TOKENIZER.token_to_id("<|im_start|>"), *TOKENIZER.encode("hi")]
    emitted, kept, _, final = stream(TOKENIZER.decode(ids), stop_token=True)
    assert emitted == final == "<|im_start|>hi" and kept[0] == ids[0]


def test_partial_stop_string_is_held_back_then_released():
    tracker = TextTracker(TOKENIZER, ("STOP",), STOP_IDS)
    ids = TOKENIZER.encode("abc ST")
    delta, keep, _ = tracker.update(ids, finished=False)
    assert keep is None and delta == "abc " and "ST" not in delta
    delta, keep, _ = tracker.update(ids, finished=True)  # ended by length: release the tail
    assert delta == "ST"


@given(
    st.lists(st.integers(3, TINY_VOCAB_SIZE - 1), min_size=1, max_size=30),
    st.lists(st.text(alphabet="ab e>\n<", min_size=1, max_size=2), max_size=2),
    st.integers(1, 4),
)
@example(  # the case the exact-record test found: "<tool_call>" then "\n", stop ">\n"
    ids=[*TOKENIZER.encode("ab"), TOKENIZER.token_to_id("<tool_call>"), *TOKENIZER.encode("\n")],
    stops=[">\n"],
    chunk=1,
)
@settings(max_examples=200, deadline=None)
def test_a_slot_delivers_ids_only_with_their_text(ids, stops, chunk):
    """Ids go to the data proxy with their text: a token whose text is held back (it may start
    a stop string) is held back too, so when a stop string then starts inside it, the recorded
    ids never hold a token the client's text lacks (found by the exact-record test: a reply
    ending `<tool_call>` cut by the stop `>\n`)."""
    request = GenerationRequest(tuple(TOKENIZER.encode("hi")), max_tokens=len(ids),
                                stop=tuple(stops))  # fmt: skip
    tracker = TextTracker(TOKENIZER, tuple(stops), STOP_IDS)
    slot = Slot(GenerationHandle(request, asyncio.new_event_loop()), STOP_IDS, tracker, 0.0)
    delivered, text = [], ""
    for begin in range(0, len(ids), chunk):
        step = ids[begin : begin + chunk]
        slot.extend(step, [0.0] * len(step), 0, [0.0] * len(step))
        events, _ = slot.next_events()
        for event in events:
            if isinstance(event, TokenChunk):
                delivered += event.token_ids
                text += event.text
        # every delivery: the ids so far decode to (at least) the text so far, no further
        assert TOKENIZER.decode(delivered).startswith(text)
        if slot.finish is not None:  # a stop string, or max_tokens at the last id
            break
    assert slot.finish in ("stop", "length")
    assert TOKENIZER.decode(delivered) == text == tracker.final_text(slot.output)


def test_incomplete_utf8_is_held_back():
    ids = TOKENIZER.encode("é")  # byte-level: one or two tokens
    partial = ids[:1] if len(ids) > 1 else ids
    tracker = TextTracker(TOKENIZER, (), STOP_IDS)
    delta, _, _ = tracker.update(partial, finished=False)
    assert "\ufffd" not in delta


def test_tool_call_stream_filter_holds_calls_and_tag_prefixes():
    f = ToolCallStreamFilter(enabled=True)
    sent = f.feed("Let me check <tool") + f.feed("_ca")
    assert sent == "Let me check "  # "<tool_ca" could still become "<tool_call>"
    sent += f.feed('ll>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert sent == "Let me check "
    reply = parse_reply(f.held, "stop", tools_enabled=True)
    assert reply.finish_reason == "tool_calls"
    call = reply.tool_calls[0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("call_")
    plain = ToolCallStreamFilter(enabled=True)
    assert plain.feed("a < b") + plain.feed(" done") == "a < b done"


def test_parse_reply_keeps_malformed_calls_visible():
    text = '<tool_call>\n{"name": "f", "arguments": {bad json}\n</tool_call>'
    reply = parse_reply(text, "stop", tools_enabled=True)
    assert reply.content == text and not reply.tool_calls and reply.tool_call_errors
    assert reply.finish_reason == "stop"
    assert parse_reply(text, "stop", tools_enabled=False).tool_call_errors == []


def test_conversation_diff_ignores_wire_details():
    recorded = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": {"x": 1}}}],
        },
    ]
    echoed = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "other", "function": {"name": "f", "arguments": '{"x":1}'}}],
        },
        {"role": "tool", "content": "ok", "tool_call_id": "call_1"},
    ]
    known = [canonical(m) for m in recorded]
    assert new_messages(known, echoed) == (2, False)
    edited = [{"role": "user", "content": "hello"}, *echoed[1:]]
    assert new_messages(known, edited) == (0, True)


def test_staleness_capacity_follows_areal_formula():
    # eta=1, batch 4, version 0: at most (1 + 0 + 1) * 4 = 8 samples ahead of the learner.
    args = dict(max_concurrent=100, max_staleness=1, batch_size=4)
    assert staleness_capacity(running=3, accepted=4, versions_since_start=0, **args) == (
        1,
        "staleness",
    )
    assert staleness_capacity(running=0, accepted=8, versions_since_start=0, **args)[0] == 0
    # one learner step later the budget grows by one batch
    assert staleness_capacity(running=0, accepted=8, versions_since_start=1, **args)[0] == 4
    # the queue bound wins when it is tighter
    assert staleness_capacity(
        running=99,
        accepted=0,
        versions_since_start=0,
        max_concurrent=100,
        max_staleness=5,
        batch_size=100,
    ) == (1, "queue")
    assert staleness_capacity(
        running=10,
        accepted=10**6,
        versions_since_start=0,
        max_concurrent=12,
        max_staleness=None,
        batch_size=1,
    ) == (2, "queue")


@pytest.mark.parametrize(
    ("request_fields", "param"),
    [
        ({"input_ids": ()}, "input_ids"),
        ({"input_ids": (1, 600)}, "input_ids"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 30}, "max_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_validate_request_names_the_problem(request_fields, param):
    fields = {"input_ids": (1, 2, 3), "max_tokens": 5, **request_fields}
    with pytest.raises(ApiError) as info:
        validate_request(
            GenerationRequest(**fields),
            vocab_size=512,
            context_length=32,
            stop_ids=(2,),
            max_stop_tokens=8,
        )
    assert (info.value.status, info.value.param) == (400, param)
