"""HFTokenizer on a byte-level BPE trained here (no download), with and without transformers."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from sao_jax.tokenizers import CHATML_JINJA_TEMPLATE, HFTokenizer, load_tokenizer

CORPUS = [
    "You arrive at cabinet 2. On the cabinet 2, you see a mug 1, and a plate 3.",
    "<think>The mug is in cabinet 2.</think><action>take mug 1 from cabinet 2</action>",
    "Your task is to: put a clean mug in cabinet.",
] * 20
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MESSAGES = [
    {"role": "system", "content": "You are an expert agent."},
    {"role": "user", "content": "You arrive at cabinet 2."},
    {"role": "assistant", "content": "<action>open cabinet 2</action>"},
    {"role": "user", "content": "You open the cabinet 2. In it, you see nothing."},
]


def train_bpe(special_tokens=CHATML_SPECIALS) -> RustTokenizer:
    backend = RustTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return backend


SHARED_BPE = train_bpe()


@pytest.fixture(scope="module")
def transformers_dir(tmp_path_factory):
    """A tokenizer directory written by transformers' own save_pretrained."""
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("hf_tokenizer")
    hf = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf.chat_template = CHATML_JINJA_TEMPLATE
    hf.save_pretrained(directory)
    return directory


def test_loads_transformers_directory_with_its_special_tokens(transformers_dir):
    tokenizer = HFTokenizer.from_file(transformers_dir)
    backend = tokenizer.backend
    assert tokenizer.eos_id == backend.token_to_id("<|im_end|>")
    assert tokenizer.pad_id == backend.token_to_id("<|endoftext|>")
    assert tokenizer.bos_id is None
    assert tokenizer.vocab_size == backend.get_vocab_size(with_added_tokens=True)
    assert set(CHATML_SPECIALS) <= set(tokenizer.special_tokens)
    assert set(tokenizer.stop_ids) == {tokenizer.eos_id, tokenizer.pad_id}
    assert tokenizer.chat_template_source is not None  # read from chat_template.jinja
    # the file itself (not its directory) loads the same way
    same = HFTokenizer.from_file(transformers_dir / "tokenizer.json")
    assert same.encode(CORPUS[0]) == tokenizer.encode(CORPUS[0])


def test_encode_and_chat_match_transformers(transformers_dir):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(transformers_dir)
    tokenizer = load_tokenizer(transformers_dir)
    for text in CORPUS[:3]:
        assert tokenizer.encode(text) == reference.encode(text, add_special_tokens=False)
    expected = reference.apply_chat_template(
        MESSAGES, tokenize=True, add_generation_prompt=True, return_dict=True
    )["input_ids"]
    assert tokenizer.encode_chat(MESSAGES) == list(expected)


def test_chatml_markers_are_single_tokens_and_skippable(transformers_dir):
    tokenizer = HFTokenizer.from_file(transformers_dir)
    ids = tokenizer.encode_chat(MESSAGES[:2], add_generation_prompt=False)
    start = tokenizer.token_to_id("<|im_start|>")
    assert ids[0] == start and ids.count(start) == 2
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(MESSAGES[:2], False)
    plain = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in plain and "You are an expert agent." in plain


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=80))
def test_byte_level_round_trip_is_exact_for_any_text(text):
    tokenizer = HFTokenizer(SHARED_BPE)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_decode_accepts_arrays_and_rejects_bad_ids():
    tokenizer = HFTokenizer(SHARED_BPE)
    ids = tokenizer.encode("a mug")
    assert tokenizer.decode(np.asarray(ids, np.int32)) == "a mug"
    assert tokenizer.decode([]) == ""
    with pytest.raises(ValueError, match=f"token id {tokenizer.vocab_size} is outside"):
        tokenizer.decode([*ids, tokenizer.vocab_size])
    with pytest.raises(ValueError, match="token id -1"):
        tokenizer.decode([-1])
    with pytest.raises(ValueError, match="1-D integer"):
        tokenizer.decode(np.zeros((2, 2), np.int32))
    with pytest.raises(TypeError, match="encode expects str"):
        tokenizer.encode(ids)


def test_fallback_special_tokens_without_config(tmp_path):
    SHARED_BPE.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer.from_file(tmp_path)
    assert tokenizer.eos_id == tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.pad_id == tokenizer.token_to_id("<|endoftext|>")


def test_bos_from_config_is_prepended_to_chat(tmp_path):
    train_bpe(["<s>", *CHATML_SPECIALS]).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    tokenizer = HFTokenizer.from_file(tmp_path)
    ids = tokenizer.encode_chat(MESSAGES[:1])
    assert ids[0] == tokenizer.bos_id == tokenizer.token_to_id("<s>")
    assert ids[1:] == tokenizer.encode(tokenizer.apply_chat_template(MESSAGES[:1]))


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        HFTokenizer.from_file(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{truncated")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        HFTokenizer.from_file(tmp_path)
    SHARED_BPE.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</nope>"}))
    with pytest.raises(ValueError, match=r"tokenizer_config.json: eos_token '</nope>' is not"):
        HFTokenizer.from_file(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        HFTokenizer.from_file(tmp_path)


def test_chat_needs_chatml_markers(tmp_path):
    backend = train_bpe(["</s>"])
    tokenizer = HFTokenizer(backend)
    assert tokenizer.eos_id == backend.token_to_id("</s>")
    with pytest.raises(ValueError, match="no single token for '<\\|im_start\\|>'"):
        tokenizer.encode_chat(MESSAGES)
    with pytest.raises(ValueError, match="no eos_token"):
        HFTokenizer(train_bpe([]))
