"""The tokenizer interface every part of sao_jax codes against."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from sao_jax.tokenizers.chat_template import IM_END, IM_START, render_chatml


class Tokenizer(abc.ABC):
    """Text <-> token ids, special-token ids, and the ChatML chat template.

    `encode` never adds BOS/EOS by itself: the chat template (or the caller) places every
    special token explicitly, so the ids a sampler sees are exactly the rendered text.
    """

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special-token strings in it become their single ids)."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of a 1-D id sequence (list, numpy or jax array)."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's vocabulary may be padded larger)."""

    @property
    @abc.abstractmethod
    def pad_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def eos_id(self) -> int: ...

    @property
    @abc.abstractmethod
    def bos_id(self) -> int | None: ...

    @property
    @abc.abstractmethod
    def special_tokens(self) -> dict[str, int]:
        """Every added control token (ChatML markers, `<think>`, `<action>`, ...) -> id."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None."""

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: EOS plus `<|im_end|>` / `<|endoftext|>` if present."""
        ids = [self.eos_id]
        for token in (IM_END, "<|endoftext|>"):
            token_id = self.token_to_id(token)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        return tuple(ids)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """ChatML text of OpenAI-style messages (tools rendered Qwen-style); see chat_template."""
        return render_chatml(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of `apply_chat_template(...)`; BOS first when the tokenizer has one."""
        for marker in (IM_START, IM_END):
            if marker not in self.special_tokens:
                raise ValueError(
                    f"this tokenizer has no single token for {marker!r}, so ChatML prompts "
                    "would be split into pieces the model never saw; use a ChatML tokenizer "
                    "(Qwen) or add the ChatML markers as special tokens"
                )
        ids = self.encode(self.apply_chat_template(messages, add_generation_prompt, tools))
        return ids if self.bos_id is None else [self.bos_id, *ids]
