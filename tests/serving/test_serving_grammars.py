"""Output grammars (forced tool calls, JSON) compiled by llguidance against the tiny
tokenizer: random walks through the masks always end in a parseable, schema-valid reply."""

import json

import numpy as np
import pytest
from serving_harness import LAMP, NOTE

from sao_jax.tokenizers import parse_tool_calls
from sao_jax.tokenizers.word import WordTokenizer
from serving.common.errors import ApiError
from serving.common.openai_requests import parse_chat_request
from serving.common.tiny_tokenizer import build_tiny_tokenizer
from serving.proxy.grammars import output_grammar
from serving.worker.constraints import GrammarCompiler

TOKENIZER = build_tiny_tokenizer()
COMPILER = GrammarCompiler(TOKENIZER.backend.to_str(), TOKENIZER.vocab_size, TOKENIZER.stop_ids)
MESSAGES = [{"role": "user", "content": "hi"}]


def walk(grammar: str, seed: int, limit: int = 200) -> str:
    """Sample uniformly among the allowed ids until a stop token: the text produced."""
    constraint, rng, out = COMPILER.compile(grammar), np.random.default_rng(seed), []
    for _ in range(limit):
        bits = np.unpackbits(constraint.bitmask().view(np.uint8), bitorder="little")
        token = int(rng.choice(np.flatnonzero(bits[: TOKENIZER.vocab_size])))
        if token in TOKENIZER.stop_ids:
            return TOKENIZER.decode(out)
        out.append(token)
        constraint.consume(token)
    raise AssertionError(f"no stop token after {limit}: {TOKENIZER.decode(out)!r}")


def grammar_of(**fields):
    request = parse_chat_request({"model": "m", "messages": MESSAGES, **fields})
    return output_grammar(request, request.tools, TOKENIZER)


@pytest.mark.parametrize("seed", range(5))
def test_forced_calls_parse_and_match_the_schema(seed):
    text = walk(grammar_of(tools=[LAMP, NOTE], tool_choice="required"), seed)
    (call,) = parse_tool_calls(text).tool_calls
    assert call.name in ("set_lamp", "note")
    if call.name == "set_lamp":
        assert isinstance(call.arguments["on"], bool) and call.arguments["room"] in ("hall", "den")
    named = walk(
        grammar_of(
            tools=[LAMP, NOTE], tool_choice={"type": "function", "function": {"name": "note"}}
        ),
        seed,
    )
    assert [c.name for c in parse_tool_calls(named).tool_calls] == ["note"]


@pytest.mark.parametrize("seed", range(5))
def test_json_outputs(seed):
    schema = {
        "type": "object",
        "properties": {"n": {"enum": [1, 2]}},
        "required": ["n"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert json.loads(walk(grammar_of(response_format=fmt), seed))["n"] in (1, 2)
    either = walk(grammar_of(response_format=fmt, tools=[LAMP]), seed)
    assert parse_tool_calls(either).tool_calls or json.loads(either)["n"] in (1, 2)


def test_free_text_has_no_grammar_and_bad_grammars_are_a_400():
    assert grammar_of() is None and grammar_of(tools=[LAMP]) is None
    with pytest.raises(ApiError) as info:
        COMPILER.compile("start: nowhere")
    assert info.value.status == 400 and "constraint" in info.value.message


ACTIONS = [
    "<action>go to desk 1</action>",
    "<action>go to desk 12</action>",
    "<action>look</action>",
]


@pytest.mark.parametrize("seed", range(5))
def test_a_choice_list_on_the_word_level_tokenizer_spells_added_tokens_as_one_token(seed):
    # the ALFWorld tokenizer: a Fuse decoder llguidance cannot read from its JSON alone
    words = WordTokenizer.from_texts(["go to desk look 1 2"])
    compiler = GrammarCompiler(words.backend.to_str(), words.vocab_size, tuple(words.stop_ids))
    request = parse_chat_request(
        {"model": "m", "messages": MESSAGES, "structured_outputs": {"choice": ACTIONS}}
    )
    constraint, out = compiler.compile(output_grammar(request, None, words)), []
    rng = np.random.default_rng(seed)
    while True:
        bits = np.unpackbits(constraint.bitmask().view(np.uint8), bitorder="little")
        allowed = np.flatnonzero(bits[: words.vocab_size])
        if not out:  # the reply opens with the <action> token the model was trained on
            assert allowed.tolist() == [words.backend.token_to_id("<action>")]
        token = int(rng.choice(allowed))
        if token in words.stop_ids:
            break
        out.append(token)
        constraint.consume(token)
    assert words.decode(out, skip_special_tokens=False) in ACTIONS
    assert words.backend.token_to_id("</action>") == out[-1]
