"""A Hugging Face `tokenizer.json` (Rust `tokenizers` library) behind the Tokenizer interface."""

from __future__ import annotations

import collections
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from sao_jax.tokenizers.base import Tokenizer
from sao_jax.tokenizers.chat_template import CHATML_JINJA_TEMPLATE, IM_START

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 4.5x saves the template

# Fallbacks, in order, when tokenizer_config.json does not name the token.
_EOS_CANDIDATES = ("<|im_end|>", "<|endoftext|>", "</s>", "<eos>")
_PAD_CANDIDATES = ("<|endoftext|>", "<pad>", "[PAD]")


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores a token as a string or as an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"unreadable special-token entry {value!r}")


class HFTokenizer(Tokenizer):
    """Wraps a `tokenizers.Tokenizer`; special tokens come from tokenizer_config.json.

    Ids that map to the unknown token (word-level vocabularies) are counted per source text
    piece in `unknown_counts`, so a run can report which words its vocabulary lacks.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token: str | None = None,
        pad_token: str | None = None,
        bos_token: str | None = None,
        unk_token: str | None = None,
        chat_template_source: str | None = None,
    ):
        self.backend = backend
        self.chat_template_source = chat_template_source
        self._special = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self._eos_id = self._resolve("eos_token", eos_token, _EOS_CANDIDATES)
        self._pad_id = self._resolve("pad_token", pad_token, _PAD_CANDIDATES, self._eos_id)
        self._bos_id = self._resolve("bos_token", bos_token, ())
        model_unk = getattr(backend.model, "unk_token", None)
        self._unk_id = self._resolve("unk_token", unk_token or model_unk, ())
        self.unknown_counts: collections.Counter[str] = collections.Counter()

    def _resolve(
        self, field: str, token: str | None, candidates: Sequence[str], default: int | None = None
    ) -> int | None:
        if token is not None:
            token_id = self.backend.token_to_id(token)
            if token_id is None:
                raise ValueError(f"{field} {token!r} is not in the vocabulary")
            return token_id
        for candidate in candidates:
            token_id = self.backend.token_to_id(candidate)
            if token_id is not None:
                return token_id
        if candidates and default is None:
            raise ValueError(
                f"no {field}: the config names none and the vocabulary has none of {candidates}"
            )
        return default

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HFTokenizer:
        """Load `tokenizer.json` (a file or a directory holding it) and, next to it,
        `tokenizer_config.json` for the special tokens and chat template."""
        path = Path(path)
        file = path / TOKENIZER_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer file at {file}")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as error:
            raise ValueError(f"{file} is not a valid tokenizer.json: {error}") from error
        config: dict[str, Any] = {}
        config_file = file.parent / CONFIG_FILE
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text())
            except json.JSONDecodeError as error:
                raise ValueError(f"{config_file} is not valid JSON: {error}") from error
        template = config.get("chat_template")
        if (file.parent / CHAT_TEMPLATE_FILE).is_file():
            template = (file.parent / CHAT_TEMPLATE_FILE).read_text()
        if isinstance(template, str) and IM_START not in template:
            logger.warning("%s ships a non-ChatML chat template; sao_jax renders ChatML", file)
        try:
            tokens = {
                field: _token_content(config.get(field))
                for field in ("eos_token", "pad_token", "bos_token", "unk_token")
            }
            return cls(backend, chat_template_source=template, **tokens)
        except ValueError as error:
            raise ValueError(f"{config_file}: {error}") from error

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `tokenizer.json` and `tokenizer_config.json` (loadable by transformers too)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(directory / TOKENIZER_FILE))
        token = self.backend.id_to_token
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": token(self.eos_id),
            "pad_token": token(self.pad_id),
            "bos_token": None if self.bos_id is None else token(self.bos_id),
            "unk_token": None if self._unk_id is None else token(self._unk_id),
            "add_bos_token": False,
            "add_eos_token": False,
            "chat_template": CHATML_JINJA_TEMPLATE,
        }
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return directory

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        encoding = self.backend.encode(text, add_special_tokens=False)
        ids = encoding.ids
        if self._unk_id is not None and self._unk_id in ids:
            for token_id, (start, end) in zip(ids, encoding.offsets, strict=True):
                if token_id == self._unk_id:
                    self.unknown_counts[text[start:end]] += 1
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts, run in parallel by the Rust library."""
        if self._unk_id is not None:  # unknown-word accounting needs the per-text path
            return [self.encode(text) for text in texts]
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        array = np.asarray(ids)
        if array.ndim != 1 or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"decode expects a 1-D integer sequence, got shape {array.shape}")
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            bad = array[(array < 0) | (array >= self.vocab_size)][0]
            raise ValueError(
                f"token id {int(bad)} is outside the vocabulary [0, {self.vocab_size})"
            )
        return self.backend.decode(array.tolist(), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def unk_id(self) -> int | None:
        return self._unk_id

    @property
    def special_tokens(self) -> dict[str, int]:
        return dict(self._special)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)
