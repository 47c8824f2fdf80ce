"""Token layouts of an episode: what the model is given at each turn, for any env.

The words come from the env's `PromptHarness` (`sao_jax.envs.base`); this module places them
in the chat template:

- `windowed`: every turn is its own chat prompt, the harness's prompt with the last h
  observation/action pairs as history, encoded with the chat template.
- `concat`: the whole episode is one token stream. Turn 0 is the harness prompt; turn k's input
  is exactly turn k-1's input + its output + the new observation turn (`harness.followup`),
  built by appending ids and never by re-tokenising, so the ATDP loader's concat merge (prefix
  property) holds and the KV cache of a real server could be reused.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from sao_jax.envs.base import PromptHarness, PromptOptions
from sao_jax.envs.registry import env_class
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import CHATML_JINJA_TEMPLATE, IM_END, IM_START

LAYOUTS = ("windowed", "concat")


def default_harness() -> PromptHarness:
    """ALFWorld's harness: the prompts of a builder or fingerprint that names no env."""
    return env_class("alfworld").harness


class PromptBuilder:
    """Builds each turn's model input ids for one layout.

    Args:
      tokenizer: any `Tokenizer` with ChatML markers (`<|im_start|>`, `<|im_end|>`).
      layout: "windowed" or "concat".
      history_length: h, past (observation, action) pairs a windowed prompt shows.
      think: ask for `<think>` reasoning before the action.
      memory_line: (windowed only) add the harness's line of what the episode has seen beyond
        the window (ALFWorld: `search_expert.memory_line`, from the history alone).
      prompt_style: "paper" or "compact" (the harness's two wordings).
      harness: the env's `PromptHarness` (None: ALFWorld's).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        layout: str,
        *,
        history_length: int,
        think: bool,
        memory_line: bool = False,
        prompt_style: str = "paper",
        harness: PromptHarness | None = None,
    ):
        options = PromptOptions(history_length, think, memory_line, prompt_style)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if memory_line and layout != "windowed":
            raise ValueError("memory_line needs the windowed layout (concat shows everything)")
        self.harness = harness or default_harness()
        self.harness.check_options(options)
        im_end = tokenizer.token_to_id(IM_END)
        if im_end is None or tokenizer.token_to_id(IM_START) is None:
            raise ValueError("the tokenizer has no single <|im_start|> / <|im_end|> tokens")
        self.tokenizer, self.layout, self.options = tokenizer, layout, options
        self.history_length, self.think = history_length, think
        self.memory_line, self.prompt_style = memory_line, prompt_style
        self.im_end_id = im_end
        self.fingerprint = template_fingerprint(
            layout,
            history_length,
            think,
            memory_line=memory_line,
            prompt_style=prompt_style,
            harness=self.harness,
        )

    @classmethod
    def for_rollout(
        cls, tokenizer: Tokenizer, rollout, harness: PromptHarness | None = None
    ) -> PromptBuilder:
        """The builder of a `RolloutConfig`'s prompts (its layout, h, think, memory line and
        style) in `harness`'s words (None: ALFWorld's)."""
        return cls(
            tokenizer,
            rollout.layout,
            history_length=rollout.history_length,
            think=rollout.think,
            memory_line=rollout.memory_line,
            prompt_style=rollout.prompt_style,
            harness=harness,
        )

    def first(self, task: str, observation: str, admissible: Sequence[str] | None) -> list[int]:
        """Turn 0's input ids (both layouts): the harness prompt as one user turn."""
        return self._chat(self.harness.prompt(task, observation, admissible, (), self.options))

    def next(
        self,
        *,
        previous_input: Sequence[int],
        previous_output: Sequence[int],
        task: str,
        observation: str,
        admissible: Sequence[str] | None,
        history: Sequence[tuple[str, str]],
    ) -> list[int]:
        """The input ids of the turn after `history[-1]` (history: every (observation, command)
        pair so far, oldest first)."""
        if self.layout == "windowed":
            prompt = self.harness.prompt(task, observation, admissible, history, self.options)
            return self._chat(prompt)
        ids = list(previous_input) + list(previous_output)
        # A reply cut by the token limit never closed its turn; ChatML needs the marker.
        if not previous_output or previous_output[-1] != self.im_end_id:
            ids.append(self.im_end_id)
        text = self.harness.followup(
            observation, admissible, step=len(history), options=self.options
        )
        ids += self.tokenizer.encode(f"\n{IM_START}user\n{text}{IM_END}\n{IM_START}assistant\n")
        return ids

    def _chat(self, user_text: str) -> list[int]:
        return self.tokenizer.encode_chat([{"role": "user", "content": user_text}])


def template_fingerprint(
    layout: str,
    history_length: int,
    think: bool,
    *,
    memory_line: bool = False,
    prompt_style: str = "paper",
    harness: PromptHarness | None = None,
) -> str:
    """A short stable hash of everything that shapes a prompt, recorded with every LLM call:
    "<env name>-<16 hex>" (the papers' ALFWorld prompts without the memory line hash as they
    did before either existed)."""
    harness = harness or default_harness()
    options = PromptOptions(history_length, think, memory_line, prompt_style)
    parts = [
        *harness.fingerprint_parts(layout, options),
        f"layout={layout} h={history_length if layout == 'windowed' else 'all'}",
        CHATML_JINJA_TEMPLATE,
    ]
    if memory_line:
        parts.append("memory_line")
    if prompt_style != "paper":
        parts.append(f"style={prompt_style}")
    return f"{harness.name}-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
