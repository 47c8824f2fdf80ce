"""The two texts SEED adds around the policy: the analysis prompt and the skill block.

The analysis prompt asks the policy (or any LLM) for one hindsight skill about a finished
episode; the skill block ("Episode-Level Skill", OPID's wording) injects a skill into the
context the learner re-scores actions under, or into a served agent's prompt. Both are ChatML
turns rendered by the tokenizer, so an HF tokenizer sees exactly this text. A word-level
tokenizer encodes the few instruction words outside the ALFWorld vocabulary as `<unk>`: a
fixed marker, while task, actions and skills stay readable.
"""

from __future__ import annotations

from sao_jax.seed.records import EpisodeRecord
from sao_jax.tokenizers import Tokenizer

SKILL_BLOCK_TITLE = "Episode-Level Skill"
SKILL_BLOCK_INSTRUCTION = "Refer to this skill when choosing your action."
ANALYSIS_INSTRUCTION = (
    "Review this episode and write one short Episode-Level Skill: a reusable strategy if the "
    "task is finished, a corrective rule that avoids the mistake if it is not."
)
TEMPLATE_VERSION = "seed-analysis-v1"


def analysis_text(record: EpisodeRecord, *, max_actions: int = 12) -> str:
    """The user turn of the analysis prompt: task, the last `max_actions` actions, outcome."""
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    first = max(len(record.actions) - max_actions, 0)
    lines = [f"Your task is to: {record.task}."]
    if first:
        lines.append(f"You took {first} step(s) before the actions below.")
    for k, action in enumerate(record.actions[first:], start=first + 1):
        lines.append(f"Action {k}: '{action}'")
    lines.append("The task is finished." if record.success else "The task is not finished.")
    lines.append(ANALYSIS_INSTRUCTION)
    return "\n".join(lines)


def analysis_prompt_ids(
    tokenizer: Tokenizer, record: EpisodeRecord, *, max_actions: int = 12
) -> list[int]:
    """Token ids of the analysis prompt as a ChatML user turn, ready for generation."""
    messages = [{"role": "user", "content": analysis_text(record, max_actions=max_actions)}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def skill_block_text(skill: str) -> str:
    """The "Episode-Level Skill" block's content (no chat markers)."""
    if not skill.strip():
        raise ValueError("skill_block_text: empty skill")
    return f"{SKILL_BLOCK_TITLE}: {skill.strip()}\n{SKILL_BLOCK_INSTRUCTION}"


def skill_block_ids(tokenizer: Tokenizer, skill: str) -> list[int]:
    """Token ids of the skill block as a ChatML system turn, placed before a prompt."""
    messages = [{"role": "system", "content": skill_block_text(skill)}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=False))
