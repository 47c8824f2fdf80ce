"""Harness prompt renderer and reply parser, and the word vocabulary that covers every text."""

from __future__ import annotations

import random

import pytest

from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.alfworld.harness import (
    AlfworldHarness,
    HarnessConfig,
    observation_text,
    parse_reply,
    render_prompt,
)
from sao_jax.envs.alfworld.prompts import ALFWORLD_PROMPTS
from sao_jax.envs.alfworld.vocabulary import split_words, vocabulary

OPENING = (
    "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly "
    "around you, you see a fridge 1, and a sinkbasin 1.\n\nYour task is to: put a mug in fridge."
)


@pytest.mark.parametrize(
    "reply,action,thought",
    [
        ("<think>the mug is here</think> <action>take mug 1 from countertop 1</action>",
         "take mug 1 from countertop 1", "the mug is here"),
        ("<THINK>x</THINK>\n<Action>  Go  to\nfridge 1. </Action>", "go to fridge 1.", "x"),
        ("<think>x</think><action>'look'</action>", "look", "x"),
    ],
)  # fmt: skip
def test_well_formed_replies_parse(reply, action, thought):
    parsed = parse_reply(reply)
    assert (parsed.valid, parsed.action, parsed.thought, parsed.error) == (
        True,
        action,
        thought,
        None,
    )


@pytest.mark.parametrize(
    "reply,think,error",
    [
        ("go to fridge 1", True, "no <action>"),
        ("<think>a</think><action>look</action><action>look</action>", True, "2 <action> blocks"),
        ("<think>a</think><action>  </action>", True, "empty <action>"),
        ("<action>look</action>", True, "0 <think> blocks"),
        ("<action>look</action><think>a</think>", True, "<think> must come before <action>"),
        ("<think>a</think><think>b</think><action>look</action>", True, "2 <think> blocks"),
        ("<action>look", False, "no <action>"),
        ("", False, "no <action>"),
    ],
)
def test_malformed_replies_are_flagged_with_the_reason(reply, think, error):
    parsed = parse_reply(reply, think=think)
    assert not parsed.valid and error in parsed.error


def test_reply_without_think_is_fine_when_not_asked_for():
    parsed = parse_reply("<action>look</action>", think=False)
    assert parsed.valid and parsed.action == "look" and parsed.thought is None


def test_first_prompt_has_task_observation_and_actions_but_no_history():
    prompt = render_prompt("put a mug in fridge", OPENING, ["go to fridge 1", "look"])
    assert prompt.startswith(
        "You are an expert agent operating in the ALFRED Embodied Environment. "
        "Your task is to: put a mug in fridge.\nYour current observation is: You are in the "
        "middle of a room. Looking quickly around you, you see a fridge 1, and a sinkbasin 1.\n"
    )
    assert "Welcome" not in prompt and "Prior to this step" not in prompt
    assert (
        "Your admissible actions of the current situation are: ['go to fridge 1', 'look']."
        in prompt
    )
    assert "<think> </think>" in prompt and "<action> </action>" in prompt


def test_prompt_shows_the_last_h_pairs_numbered_by_step():
    history = [(OPENING, "go to fridge 1"), ("obs two", "open fridge 1"), ("obs three", "look")]
    prompt = render_prompt("t", "obs four", ["look"], history=history, step=3, history_length=2)
    assert "you have already taken 3 step(s). Below are the most recent 2 observations" in prompt
    assert (
        "[Observation 2: 'obs two', Action 2: 'open fridge 1'] "
        "[Observation 3: 'obs three', Action 3: 'look']"
    ) in prompt
    assert "go to fridge 1" not in prompt
    assert "You are now at step 4 and your current observation is: obs four" in prompt
    longer = render_prompt("t", "o", [], history=history, step=3, history_length=5)
    assert (
        "most recent 3 observations" in longer
        and "[Observation 1: 'You are in the middle" in longer
    )
    none = render_prompt("t", "o", [], history=history, step=3, history_length=0, think=False)
    assert "Observation 1" not in none and "<think>" not in none and "<action> </action>" in none
    with pytest.raises(ValueError, match="history_length"):
        render_prompt("t", "o", [], history_length=-1)


def test_observation_text_strips_banner_and_task_only_from_the_opening():
    assert observation_text(OPENING).startswith("You are in the middle of a room.")
    assert observation_text(OPENING).endswith("a sinkbasin 1.")
    assert observation_text("Nothing happens.") == "Nothing happens."


def test_harness_counts_malformed_replies_and_shapes_rewards():
    harness = AlfworldHarness(AlfworldEnv("valid_seen", size="small", expert_in_info=True))
    prompt, info = harness.reset(index=0)
    assert "Your task is to: " + info["task"] in prompt
    prompt, reward, done, info = harness.step("I will open it")
    assert (reward, done, info["invalid_replies"], info["steps"]) == (-0.1, False, 1, 1)
    assert info["reply"].error == "no <action>...</action> block"
    assert "current observation is: Nothing happens." in prompt
    total = 0.0
    while not done:
        reply = f"<think>plan</think><action>{info['expert_action']}</action>"
        prompt, reward, done, info = harness.step(reply)
        total += reward
    assert total == 10.0 and info["won"] and info["invalid_replies"] == 1
    assert info["history"][0] == (harness.history[0][0], "")
    harness.reset(index=1)
    assert harness.invalid_replies == 0 and harness.history == []


def test_harness_without_think_takes_bare_actions():
    harness = AlfworldHarness(
        AlfworldEnv(size="small"), HarnessConfig(think=False, history_length=1)
    )
    prompt, _ = harness.reset(index=2)
    assert "<think>" not in prompt
    _, reward, _, info = harness.step("<action>look</action>")
    assert info["reply"].valid and reward == 0.0


def test_vocabulary_covers_every_text_of_random_and_expert_play():
    vocab = set(vocabulary())
    assert {"<", "/", ">", "think", "action", "sinkbasin", "in", "on", "loc", "50"} <= vocab
    rng = random.Random(0)
    for phrasing in ("0.4.2", "0.3"):
        for size in ("small", "full"):
            env = AlfworldEnv("train", size=size, phrasing=phrasing, expert_in_info=True)
            harness = AlfworldHarness(
                env,
                HarnessConfig(
                    history_length=2,
                    memory_line=size == "small",
                    prompt_style="compact" if phrasing == "0.3" else "paper",
                ),
            )
            for _ in range(40):
                prompt, info = harness.reset()
                texts, done = [prompt], False
                while not done:
                    options = info["admissible_commands"] + ["help", "examine nothing"]
                    command = info["expert_action"] if rng.random() < 0.5 else rng.choice(options)
                    prompt, _, done, info = harness.step(
                        f"<think>x</think><action>{command}</action>"
                    )
                    texts += [prompt, *info["admissible_commands"]]
                words = {w for text in texts for w in split_words(text)}
                assert words <= vocab, words - vocab


def test_split_words_separates_punctuation():
    assert split_words("There's a mug 1.") == ["There", "'", "s", "a", "mug", "1", "."]
    assert split_words("<action>go to loc 2</action>") == [
        "<", "action", ">", "go", "to", "loc", "2", "<", "/", "action", ">",
    ]  # fmt: skip
    assert "101" not in vocabulary() and "101" in vocabulary(max_number=101)


def test_the_compact_prompt_keeps_every_fact_in_about_half_the_words():
    history = [
        (OPENING, "go to fridge 1"),
        ("You arrive at fridge 1. The fridge 1 is closed.", "open fridge 1"),
    ]
    observation = "You open the fridge 1. The fridge 1 is open. In it, you see a mug 2."
    admissible = ["close fridge 1", "go to sinkbasin 1", "take mug 2 from fridge 1"]
    kwargs = dict(history=history, step=2, history_length=1, think=False)
    paper = render_prompt("put a mug in fridge", observation, admissible, **kwargs)
    compact = render_prompt(
        "put a mug in fridge", observation, admissible, style="compact", **kwargs
    )
    assert compact.splitlines() == [
        "Your task is to: put a mug in fridge.",
        "Step 3. Observation 2: You arrive at fridge 1. The fridge 1 is closed. Action 2: open "
        "fridge 1.",
        f"Your current observation is: {observation}",
        "Your admissible actions are: close fridge 1, go to sinkbasin 1, take mug 2 from fridge 1.",
    ]
    assert len(split_words(compact)) < 0.65 * len(split_words(paper))
    first = render_prompt("put a mug in fridge", OPENING, admissible, style="compact")
    assert "Step" not in first and "Welcome" not in first and "fridge 1, and a sinkbasin 1" in first
    # SEED reads the task and the observation back from either style (through the harness)
    for prompt in (paper, compact):
        assert ALFWORLD_PROMPTS.read_prompt(prompt) == ("put a mug in fridge", [observation])
    with pytest.raises(ValueError, match="prompt style must be one of"):
        render_prompt("put a mug in fridge", OPENING, admissible, style="terse")
    harness = AlfworldHarness(
        AlfworldEnv("train", size="small"), HarnessConfig(prompt_style="compact")
    )
    prompt, _ = harness.reset(3)
    assert prompt.startswith("Your task is to: ") and "admissible actions are: " in prompt
