"""Replies kept to the actions a prompt lists (`RolloutConfig.reply_choices`).

Each turn's reply must be one of the env's listed actions (ALFWorld's admissible commands) in
the harness's reply format, spelled with exactly the token ids the tokenizer encodes it to (the
tokenization the policy was cloned on). The turn's grammar names those ids (llguidance's
`<[id]>` terminals: one alternative per action), llguidance follows it, and
`atdp_io.grammar_masks`' rule (the serving worker's) turns its state into the token mask
applied before every sampled token. The grammar is recorded with the call
(`decoding.extra.grammar`, with the stop ids), so training rebuilds the same masks from the
record (`atdp_io.mask_replay.MaskReplay`) and computes the masked ratio the sampler's
behaviour log-probs were drawn under. (A byte-level grammar, the gateway's for a choice list,
would let a word-level tokenizer spell a command from fragments no demonstration uses.)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from atdp_io.grammar_masks import TokenConstraint, guidance_tokenizer, lark_matcher, stop_bitmask
from sao_jax.envs.base import PromptHarness
from sao_jax.tokenizers import Tokenizer


class ChoiceMasks:
    """Builds each turn's grammar and follows it token by token, one `TokenConstraint` per
    reply. `vocab_size`: the model's (the logits' width)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        harness: PromptHarness,
        *,
        style: str,
        think: bool,
    ):
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            raise ValueError(
                "reply_choices needs a tokenizer with a Hugging Face `tokenizers` backend "
                f"(llguidance compiles the grammar against it); {type(tokenizer).__name__} has none"
            )
        spec = harness.reply_choices(style=style, think=think)
        if spec is None:
            raise ValueError(
                f"reply_choices: the {type(harness).__name__} prompts list no actions to choose "
                "from" + (" when the reply reasons first (think)" if think else "")
            )
        self.tokenizer = tokenizer
        self.template = spec["template"]
        self.words = (vocab_size + 31) // 32
        stop_ids = tuple(tokenizer.stop_ids)
        self.stop_mask = stop_bitmask(stop_ids, self.words)
        self.guidance = guidance_tokenizer(backend.to_str(), vocab_size, stop_ids)

    def grammar(self, actions: Sequence[str]) -> str:
        """The grammar of a reply that takes one of `actions` (the recorded form)."""
        if not actions:
            raise ValueError("reply_choices: the env lists no action to choose from this turn")
        alternatives = dict.fromkeys(
            " ".join(
                f"<[{i}]>" for i in self.tokenizer.encode(self.template.replace("{choice}", a))
            )
            for a in actions
        )
        return "start: answer\nanswer: " + " | ".join(f"({a})" for a in alternatives) + "\n"

    def start(self, grammar: str) -> TokenConstraint:
        """The reply's grammar state (`bitmask()` before each token, `consume` after it), as
        the serving worker follows a constrained request."""
        return TokenConstraint(lark_matcher(self.guidance, grammar), self.words, self.stop_mask)

    def unconstrained(self, rows: int) -> np.ndarray:
        """[rows, words] int32 masks allowing every id (slots that are not generating)."""
        return np.full((rows, self.words), -1, np.int32)
