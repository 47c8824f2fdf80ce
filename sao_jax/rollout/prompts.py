"""Token layouts of an ALFWorld episode: what the model is given at each turn.

- `windowed`: every turn is its own chat prompt, the harness prompt with the last h
  observation/action pairs as history (`render_prompt`), encoded with the chat template.
- `concat`: the whole episode is one token stream. Turn 0 is the harness prompt; turn k's input
  is exactly turn k-1's input + its output + the new observation turn, built by appending ids
  and never by re-tokenising, so the ATDP loader's concat merge (prefix property) holds and the
  KV cache of a real server could be reused.

The concat observation turn carries what changed (observation, step count, admissible actions)
in the harness's own wording; the task and the history are already in the context.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

from sao_jax.envs.alfworld.harness import (
    ACTION_INSTRUCTIONS,
    SYSTEM_LINE,
    THINK_INSTRUCTIONS,
    check_prompt_style,
    compact_actions_line,
    observation_text,
    render_prompt,
)
from sao_jax.envs.alfworld.search_expert import memory_line as episode_memory
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import CHATML_JINJA_TEMPLATE, IM_END, IM_START

LAYOUTS = ("windowed", "concat")


def followup_text(
    observation: str,
    admissible: Sequence[str],
    *,
    step: int,
    think: bool,
    style: str = "paper",
) -> str:
    """The user turn a concat episode appends after each step (the task is already above)."""
    if style == "compact":
        return "\n".join(
            [
                f"Step {step + 1}. Your current observation is: {observation_text(observation)}",
                compact_actions_line(admissible),
            ]
        )
    actions = ", ".join(f"'{command}'" for command in admissible)
    return "\n".join(
        [
            f"You are now at step {step + 1} and your current observation is: "
            f"{observation_text(observation)}",
            f"Your admissible actions of the current situation are: [{actions}].",
            "",
            "Now it's your turn to take an action.",
            THINK_INSTRUCTIONS if think else ACTION_INSTRUCTIONS,
        ]
    )


class PromptBuilder:
    """Builds each turn's model input ids for one layout.

    Args:
      tokenizer: any `Tokenizer` with ChatML markers (`<|im_start|>`, `<|im_end|>`).
      layout: "windowed" or "concat".
      history_length: h, past (observation, action) pairs a windowed prompt shows.
      think: ask for `<think>` reasoning before the action.
      memory_line: (windowed only) add the line of what the episode has seen beyond the window
        (`search_expert.memory_line`, from the history alone) under the task.
      prompt_style: "paper" (the papers' wording) or "compact" (`render_prompt`).
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
    ):
        check_prompt_style(prompt_style)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if memory_line and layout != "windowed":
            raise ValueError("memory_line needs the windowed layout (concat shows everything)")
        im_end = tokenizer.token_to_id(IM_END)
        if im_end is None or tokenizer.token_to_id(IM_START) is None:
            raise ValueError("the tokenizer has no single <|im_start|> / <|im_end|> tokens")
        self.tokenizer, self.layout = tokenizer, layout
        self.history_length, self.think = history_length, think
        self.memory_line, self.prompt_style = memory_line, prompt_style
        self.im_end_id = im_end
        self.fingerprint = template_fingerprint(
            layout, history_length, think, memory_line=memory_line, prompt_style=prompt_style
        )

    @classmethod
    def for_rollout(cls, tokenizer: Tokenizer, rollout) -> PromptBuilder:
        """The builder of a `RolloutConfig`'s prompts (its layout, h, think, memory line and
        style)."""
        return cls(
            tokenizer,
            rollout.layout,
            history_length=rollout.history_length,
            think=rollout.think,
            memory_line=rollout.memory_line,
            prompt_style=rollout.prompt_style,
        )

    def first(self, task: str, observation: str, admissible: Sequence[str]) -> list[int]:
        """Turn 0's input ids (both layouts): the harness prompt as one user turn."""
        memory = episode_memory(observation, [], task=task) if self.memory_line else None
        return self._chat(
            render_prompt(
                task,
                observation,
                admissible,
                think=self.think,
                memory=memory,
                style=self.prompt_style,
            )
        )

    def next(
        self,
        *,
        previous_input: Sequence[int],
        previous_output: Sequence[int],
        task: str,
        observation: str,
        admissible: Sequence[str],
        history: Sequence[tuple[str, str]],
    ) -> list[int]:
        """The input ids of the turn after `history[-1]` (history: every (observation, command)
        pair so far, oldest first)."""
        if self.layout == "windowed":
            memory = None
            if self.memory_line:
                # the transcript: the opening, then each command with the observation it got
                steps = [
                    (command, next_observation)
                    for (_, command), (next_observation, _) in itertools.pairwise(history)
                ]
                steps.append((history[-1][1], observation))
                memory = episode_memory(history[0][0], steps, task=task)
            prompt = render_prompt(
                task,
                observation,
                admissible,
                history=history,
                step=len(history),
                history_length=self.history_length,
                think=self.think,
                memory=memory,
                style=self.prompt_style,
            )
            return self._chat(prompt)
        ids = list(previous_input) + list(previous_output)
        # A reply cut by the token limit never closed its turn; ChatML needs the marker.
        if not previous_output or previous_output[-1] != self.im_end_id:
            ids.append(self.im_end_id)
        text = followup_text(
            observation, admissible, step=len(history), think=self.think, style=self.prompt_style
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
) -> str:
    """A short stable hash of everything that shapes a prompt, recorded with every LLM call
    (the papers' prompts without the memory line hash as they did before either existed)."""
    parts = [
        SYSTEM_LINE,
        THINK_INSTRUCTIONS if think else ACTION_INSTRUCTIONS,
        followup_text("", [], step=0, think=think) if layout == "concat" else "",
        f"layout={layout} h={history_length if layout == 'windowed' else 'all'}",
        CHATML_JINJA_TEMPLATE,
    ]
    if memory_line:
        parts.append("memory_line")
    if prompt_style != "paper":
        parts.append(f"style={prompt_style}")
    return "alfworld-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]
