"""The tokenizer of `--config tiny`: a byte-level BPE built at startup, deterministically.

Byte-level, so any text a client sends encodes losslessly (no `<unk>`: the recorded token ids
are exactly what the model saw, whatever the language or emoji). The merges are learned from a
fixed corpus (the chat template's own text, OpenAI-style sample chats and the ALFWorld
vocabulary), so every process that builds it gets the same `tokenizer.json` byte for byte;
`vocab_size` ids in total: byte alphabet + merges + ChatML specials + tool / think tags.
"""

from __future__ import annotations

import json

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

from sao_jax.envs.alfworld import vocabulary
from sao_jax.tokenizers import HFTokenizer, render_chatml
from sao_jax.tokenizers.chat_template import template_text

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CONTROL_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
TINY_VOCAB_SIZE = 512  # the `tiny` model preset's vocabulary

_SAMPLE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}


def _corpus() -> list[str]:
    chat = [
        {"role": "system", "content": "You are a helpful assistant that solves the task."},
        {"role": "user", "content": "What is the weather in Paris? Please answer briefly."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            ],
        },
        {"role": "tool", "content": '{"temperature": 18, "unit": "celsius"}'},
        {"role": "assistant", "content": "It is 18 degrees in Paris. <think>done</think>"},
    ]
    rendered = render_chatml(chat, tools=[_SAMPLE_TOOL])
    return [template_text(), rendered, rendered, " ".join(vocabulary())]


def build_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> HFTokenizer:
    """A byte-level BPE with exactly `vocab_size` ids (same result in every process)."""
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(CONTROL_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTROL_TOKENS])
    if backend.get_vocab_size() > vocab_size:
        raise ValueError(
            f"tiny tokenizer has {backend.get_vocab_size()} ids, more than {vocab_size}"
        )
    return HFTokenizer(backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
