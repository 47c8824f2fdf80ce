"""Every word and punctuation token our ALFWorld texts can contain, for word-level tokenizers.

Texts split into tokens with `WORD_PATTERN` (runs of word characters, or single punctuation
marks; case kept). The vocabulary covers tasks, observations, admissible commands, the harness
prompt and the reply tags, in both phrasings, with numbers 0..max_number.
"""

from __future__ import annotations

import re

import sao_jax.envs.alfworld.classes as classes
import sao_jax.envs.alfworld.prompts as harness
import sao_jax.envs.alfworld.search_expert as search_expert
import sao_jax.envs.alfworld.texts as texts
from sao_jax.envs.alfworld.game import TASK_TEMPLATES

WORD_PATTERN = re.compile(r"\w+|[^\w\s]")
REPLY_TAGS = ("<think>", "</think>", "<action>", "</action>")


def split_words(text: str) -> list[str]:
    """Tokens of `text` under `WORD_PATTERN` ("There's a mug 1." -> There ' s a mug 1 .)."""
    return WORD_PATTERN.findall(text)


def vocabulary(*, max_number: int = 100) -> list[str]:
    """Sorted tokens that cover every text the engine, the expert and the harness produce.

    max_number: the largest number to include (instance numbers, step counts); a prompt of an
      episode longer than `max_number` steps would need more.
    """
    names = sorted(
        classes.display_class(c) for c in classes.RECEPTACLE_CLASSES | classes.OBJECT_CLASSES
    )
    r, o = "cabinet 1", "mug 1"
    samples = [*names, *REPLY_TAGS, texts.WELCOME, texts.HELP, texts.NOTHING_HAPPENS]
    samples += [
        t.format(obj="mug", recep="cabinet") for pair in TASK_TEMPLATES.values() for t in pair
    ]
    for contents in ([], [o], [o, o], [o, o, o]):
        samples += [texts.receptacle_view(r, a, b, contents) for a in (0, 1) for b in (0, 1)]
        samples.append(texts.look_around(contents))
    samples += [texts.look_at(r), texts.opened(r, ""), texts.closed(r), texts.picked_up(o, r)]
    samples += [texts.turned_on(o), texts.inventory(None), texts.inventory(o)]
    for phrasing in texts.PHRASINGS:
        samples += [texts.arrive(r, 1, "", phrasing), texts.put_command(o, r, phrasing)]
        samples.append(texts.put_feedback(o, r, phrasing))
    for verb in ("clean", "heat", "cool"):
        samples += [texts.treat_command(verb, o, r), texts.treated(verb, o, r)]
    flags = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    samples += [texts.examine_item(o, *f) for f in flags]
    samples += [
        "go to",
        "open",
        "close",
        "take from",
        "examine",
        "use",
        "inventory",
        "look",
        "help",
    ]
    # the optional memory line of the prompt
    samples.append(f"{search_expert.MEMORY_PREFIX} nothing, {r} ({o}, {o}), {r}.")
    history = [(o, o)] * 3
    for think in (True, False):
        for step, h in ((0, 2), (3, 2), (3, 0)):
            prompt = harness.render_prompt(
                o, o, [o, o], history=history[:step], step=step, history_length=h, think=think
            )
            samples.append(prompt)
    for step in (0, 3):  # the compact prompt style
        samples.append(
            harness.render_prompt(
                o, o, [o, o], history=history[:step], step=step, history_length=1, style="compact"
            )
        )
    words = {w for text in samples for w in split_words(text)}
    words |= {str(n) for n in range(max_number + 1)}
    return sorted(words)
