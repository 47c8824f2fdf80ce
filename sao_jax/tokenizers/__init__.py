"""Tokenizers: one interface (`Tokenizer`), a Hugging Face `tokenizer.json` loader and a
word-level tokenizer for the CPU environment, ChatML chat template and tool-call parsing."""

from __future__ import annotations

import os
from pathlib import Path

from tokenizers import models as _models

from sao_jax.tokenizers.base import Tokenizer
from sao_jax.tokenizers.chat_template import (
    CHATML_JINJA_TEMPLATE,
    IM_END,
    IM_START,
    render_chatml,
)
from sao_jax.tokenizers.hf import HFTokenizer
from sao_jax.tokenizers.tool_calls import ParsedToolCalls, ToolCall, parse_tool_calls
from sao_jax.tokenizers.word import WordTokenizer


def load_tokenizer(path: str | os.PathLike) -> HFTokenizer:
    """Load a saved tokenizer (file or directory); word-level vocabularies come back as
    `WordTokenizer`, anything else as `HFTokenizer`."""
    tokenizer = HFTokenizer.from_file(path)
    if isinstance(tokenizer.backend.model, _models.WordLevel):
        return WordTokenizer.from_file(Path(path))
    return tokenizer


__all__ = [
    "CHATML_JINJA_TEMPLATE",
    "IM_END",
    "IM_START",
    "HFTokenizer",
    "ParsedToolCalls",
    "Tokenizer",
    "ToolCall",
    "WordTokenizer",
    "load_tokenizer",
    "parse_tool_calls",
    "render_chatml",
]
