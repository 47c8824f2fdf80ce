"""Token-level constraints for the worker: a grammar (llguidance) per constrained request,
turned into the bitmask of ids the sampler may draw next.

llguidance (Microsoft's low-level guidance engine, also behind vLLM's and llama.cpp's
structured outputs) compiles Lark grammars with inline JSON Schemas (`%json {...}`) against the
served tokenizer and answers, after each token, which ids keep the output inside the grammar.
Once the grammar is complete only the stop tokens are allowed, so the reply ends there.

The data proxy writes the grammars (`serving/proxy/grammars.py`: it knows the chat format,
e.g. Qwen's `<tool_call>` blocks) and records them with the call; the worker only compiles and
follows them. The rule from grammar state to bitmask is `atdp_io.grammar_masks`'s, which
training replays over the recorded tokens to rebuild these exact masks.
"""

from __future__ import annotations

from collections.abc import Sequence

from atdp_io.grammar_masks import TokenConstraint, guidance_tokenizer, lark_matcher, stop_bitmask
from serving.common.errors import bad_request


class GrammarCompiler:
    """The served tokenizer as llguidance sees it; compiles grammars into `TokenConstraint`s."""

    def __init__(self, tokenizer_json: str, vocab_size: int, stop_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.stop_mask = stop_bitmask(stop_ids, self.words)
        self.tokenizer = guidance_tokenizer(tokenizer_json, vocab_size, stop_ids)

    def compile(self, grammar: str) -> TokenConstraint:
        """400 naming the problem when the grammar (or a schema inside it) is invalid."""
        try:
            matcher = lark_matcher(self.tokenizer, grammar)
        except ValueError as error:
            raise bad_request(f"cannot compile the output constraint: {error}") from None
        return TokenConstraint(matcher, self.words, self.stop_mask)
