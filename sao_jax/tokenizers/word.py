"""A word-level tokenizer for the CPU ALFWorld agent, stored as a standard tokenizer.json.

Text is cut into pieces by one regex: a letter run, a single digit, or a single other
character, each optionally carrying the one space before it, and any other whitespace character
alone ("You arrive at cabinet 12." -> "You", " arrive", " at", " cabinet", " 1", "2", ".").
Every word enters the vocabulary with and without its leading space (the words of the chat
template's roles and tools preamble always do), so a sentence costs about
one token per word, and decoding concatenates pieces (a `Fuse` decoder): decode(encode(s)) == s
for any text made of vocabulary words, digits, ASCII punctuation and whitespace. A decoded
`<action>go to cabinet 2</action>` therefore goes straight to the environment. Anything else
becomes `<unk>` and is counted in `unknown_counts`.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from sao_jax.tokenizers.chat_template import template_text
from sao_jax.tokenizers.hf import HFTokenizer

PIECE_PATTERN = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]|\s"
PAD, UNK, END_OF_TEXT = "<pad>", "<unk>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD, UNK, END_OF_TEXT, "<|im_start|>", "<|im_end|>")
# Single tokens (not "special": skip_special_tokens keeps them) for the agent's reply format and
# Qwen-style tool calls.
CONTROL_TOKENS = (
    "<think>",
    "</think>",
    "<action>",
    "</action>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
_BASE_SYMBOLS = tuple(string.digits + string.punctuation)
_BASE_WHITESPACE = (" ", "\n", "\t")


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated")


def _core(piece: str) -> str:
    """A piece without the leading space it may carry (a lone space stays itself)."""
    return piece[1:] if len(piece) > 1 and piece[0] == " " else piece


class WordTokenizer(HFTokenizer):
    """Word-level vocabulary; build with `from_texts` or `from_words`, load with `from_file`."""

    def __init__(self, backend: tokenizers.Tokenizer, **special_tokens: str | None):
        if not isinstance(backend.model, models.WordLevel):
            raise TypeError(
                f"WordTokenizer needs a WordLevel model, got {type(backend.model).__name__}; "
                "load other tokenizers with HFTokenizer.from_file"
            )
        super().__init__(backend, **special_tokens)

    @classmethod
    def _build(
        cls, words: Iterable[str], extra_tokens: Sequence[str], whitespace: Iterable[str] = ()
    ) -> WordTokenizer:
        controls = list(dict.fromkeys([*CONTROL_TOKENS, *extra_tokens]))
        clash = [t for t in controls if t in SPECIAL_TOKENS]
        if clash:
            raise ValueError(f"extra_tokens {clash} are already special tokens")
        vocab: dict[str, int] = {}
        for entry in [*SPECIAL_TOKENS, *controls, *_BASE_WHITESPACE, *whitespace]:
            vocab.setdefault(entry, len(vocab))
        template_words = [_core(p) for p, _ in _pre_tokenizer().pre_tokenize_str(template_text())]
        for core in [*_BASE_SYMBOLS, *words, *template_words]:
            if core.isspace():
                continue
            vocab.setdefault(core, len(vocab))
            vocab.setdefault(" " + core, len(vocab))
        backend = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=UNK))
        backend.pre_tokenizer = _pre_tokenizer()
        backend.decoder = decoders.Fuse()
        backend.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
        )
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in controls])
        return cls(backend, eos_token="<|im_end|>", pad_token=PAD, unk_token=UNK)

    @classmethod
    def from_texts(
        cls,
        texts: Iterable[str],
        *,
        extra_tokens: Sequence[str] = (),
        min_count: int = 1,
        max_words: int | None = None,
    ) -> WordTokenizer:
        """Vocabulary of every word (letter run or other symbol) seen `min_count` times.

        Args:
          texts: corpus (observations, prompts, expert replies).
          extra_tokens: more single control tokens, e.g. `"<obs>"`; they are never split.
          min_count: drop rarer words (they become `<unk>`).
          max_words: keep only the most frequent words (ties broken alphabetically).
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        controls = [*CONTROL_TOKENS, *SPECIAL_TOKENS, *extra_tokens]
        splitter = re.compile("|".join(re.escape(t) for t in sorted(controls, key=len)[::-1]))
        pre_tokenizer = _pre_tokenizer()
        counts: collections.Counter[str] = collections.Counter()
        whitespace: set[str] = set()  # e.g. "\r" or a non-breaking space seen in the corpus
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"from_texts expects strings, got {type(text).__name__}")
            for segment in splitter.split(text):
                for piece, _ in pre_tokenizer.pre_tokenize_str(segment):
                    core = _core(piece)
                    if core.isspace():
                        whitespace.add(core)
                    else:
                        counts[core] += 1
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        words = [word for word, count in ranked if count >= min_count][:max_words]
        return cls._build(words, extra_tokens, sorted(whitespace))

    @classmethod
    def from_words(cls, words: Iterable[str], *, extra_tokens: Sequence[str] = ()) -> WordTokenizer:
        """Vocabulary of the given words (each must be one piece: no spaces, no phrases)."""
        pre_tokenizer = _pre_tokenizer()
        checked = []
        for word in words:
            pieces = [p for p, _ in pre_tokenizer.pre_tokenize_str(word)]
            if pieces != [word] or word.startswith(" "):
                raise ValueError(
                    f"{word!r} is not a single word for this tokenizer (it splits into "
                    f"{pieces}); pass words such as 'cabinet', not phrases"
                )
            checked.append(word)
        return cls._build(checked, extra_tokens)

    @property
    def words(self) -> list[str]:
        """Vocabulary entries without a leading space, excluding control tokens."""
        added = set(self.special_tokens)
        vocab = self.backend.get_vocab(with_added_tokens=False)
        return sorted(w for w in vocab if w not in added and not w.startswith(" "))
