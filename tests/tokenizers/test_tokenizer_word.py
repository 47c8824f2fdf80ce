"""WordTokenizer: exact round trip for in-vocabulary text, unknown-word accounting, save/load."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao_jax.tokenizers import HFTokenizer, WordTokenizer, load_tokenizer

ALFWORLD_TEXTS = [
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
    "around you, you see a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, and a "
    "sinkbasin 1.\n\nYour task is to: put a clean mug in cabinet.",
    "You arrive at cabinet 2. On the cabinet 2, you see a mug 1, and a plate 3.",
    "You open the fridge 1. The fridge 1 is open. In it, you see nothing.",
    "There's nothing special about mug 1. This is a hot and clean mug.",
    "<think>The mug should be in a cabinet.</think><action>go to cabinet 2</action>",
    "Nothing happens.",
]
CONTROL = ["<think>", "</think>", "<action>", "</action>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tokenizer():
    return WordTokenizer.from_texts(ALFWORLD_TEXTS)


def tokens(tokenizer, text):
    return [tokenizer.id_to_token(i) for i in tokenizer.encode(text)]


def test_alfworld_texts_round_trip_exactly_without_unknowns(tokenizer):
    for text in ALFWORLD_TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.unk_id not in ids
        assert tokenizer.decode(ids) == text
    assert not tokenizer.unknown_counts


def test_a_word_and_its_leading_space_cost_one_token(tokenizer):
    assert tokens(tokenizer, "You arrive at cabinet 2.") == [
        "You",
        " arrive",
        " at",
        " cabinet",
        " 2",
        ".",
    ]
    # digits are single tokens, so unseen object numbers still encode
    assert tokens(tokenizer, "cabinet 27") == ["cabinet", " 2", "7"]


def test_control_tokens_are_single_and_survive_skip_special(tokenizer):
    reply = "<think>go</think><action>go to fridge 1</action><|im_end|>"
    pieces = tokens(tokenizer, reply)
    for control in ["<think>", "</think>", "<action>", "</action>", "<|im_end|>"]:
        assert pieces.count(control) == 1
    skipped = tokenizer.decode(tokenizer.encode(reply), skip_special_tokens=True)
    assert skipped == "<think>go</think><action>go to fridge 1</action>"
    assert tokenizer.eos_id == tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.pad_id == tokenizer.token_to_id("<pad>") != tokenizer.eos_id


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_composition_of_vocabulary_round_trips(tokenizer, data):
    words = tokenizer.words
    letters = [w for w in words if w.isalpha()]
    separators = [" ", "  ", "\n", "\t", ", ", ". ", " (", ") ", ": ", "'", "-", *CONTROL]
    parts = data.draw(
        st.lists(
            st.tuples(st.sampled_from(separators), st.sampled_from(letters + list("0123"))),
            max_size=25,
        )
    )
    text = "".join(sep + word for sep, word in parts)
    ids = tokenizer.encode(text)
    assert tokenizer.unk_id not in ids
    assert tokenizer.decode(ids) == text


def test_unknown_words_become_unk_and_are_counted():
    tokenizer = WordTokenizer.from_texts(ALFWORLD_TEXTS)
    text = "go to zebra 3, and 🦓 and zebra!"
    ids = tokenizer.encode(text)
    assert ids.count(tokenizer.unk_id) == 3
    assert tokenizer.unknown_counts == {" zebra": 2, " 🦓": 1}
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == "go to 3, and and!"  # known pieces are kept verbatim


def test_chat_prompt_round_trips_including_roles(tokenizer):
    messages = [
        {"role": "system", "content": "You are in the middle of a room."},
        {"role": "user", "content": ALFWORLD_TEXTS[1]},
        {"role": "assistant", "content": ALFWORLD_TEXTS[4]},
    ]
    ids = tokenizer.encode_chat(messages)
    assert tokenizer.unk_id not in ids
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages)


def test_vocabulary_options():
    frequent = WordTokenizer.from_texts(["mug mug mug plate"], min_count=2)
    assert "mug" in frequent.words and "plate" not in frequent.words
    capped = WordTokenizer.from_texts(["b b a a c"], max_words=2)
    assert {"a", "b"} <= set(capped.words) and "c" not in capped.words
    with_extra = WordTokenizer.from_texts(["x"], extra_tokens=["<obs>"])
    assert tokens(with_extra, "<obs>x") == ["<obs>", "x"]
    from_words = WordTokenizer.from_words(["cabinet", "mug"])
    assert from_words.decode(from_words.encode("a mug, cabinet")) == "a mug, cabinet"
    # ids are deterministic: the same corpus gives the same vocabulary
    again = WordTokenizer.from_texts(ALFWORLD_TEXTS)
    assert again.backend.get_vocab() == WordTokenizer.from_texts(ALFWORLD_TEXTS).backend.get_vocab()


def test_bad_vocabulary_input_is_named():
    with pytest.raises(ValueError, match="'cabinet 2' is not a single word"):
        WordTokenizer.from_words(["cabinet", "cabinet 2"])
    with pytest.raises(ValueError, match="min_count"):
        WordTokenizer.from_texts(["x"], min_count=0)
    with pytest.raises(TypeError, match="expects strings"):
        WordTokenizer.from_texts([b"bytes"])
    with pytest.raises(ValueError, match="already special"):
        WordTokenizer.from_texts(["x"], extra_tokens=["<pad>"])


def test_save_and_load_as_standard_tokenizer_json(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["unk_token"] == "<unk>"
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, WordTokenizer)
    assert loaded.backend.get_vocab() == tokenizer.backend.get_vocab()
    assert (loaded.pad_id, loaded.eos_id, loaded.unk_id) == (
        tokenizer.pad_id,
        tokenizer.eos_id,
        tokenizer.unk_id,
    )
    for text in ALFWORLD_TEXTS:
        assert loaded.encode(text) == tokenizer.encode(text)

    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tmp_path)
    assert reference.encode(ALFWORLD_TEXTS[0], add_special_tokens=False) == tokenizer.encode(
        ALFWORLD_TEXTS[0]
    )
    assert reference.decode(tokenizer.encode(ALFWORLD_TEXTS[4])) == ALFWORLD_TEXTS[4]


def test_word_loader_refuses_other_models(tmp_path):
    from tokenizers import Tokenizer, models

    backend = Tokenizer(models.BPE())
    backend.add_special_tokens(["<|im_end|>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(TypeError, match="needs a WordLevel model, got BPE"):
        WordTokenizer.from_file(tmp_path / "tokenizer.json")
    assert type(load_tokenizer(tmp_path)) is HFTokenizer  # any other model loads generically
