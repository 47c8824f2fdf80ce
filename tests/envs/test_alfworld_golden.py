"""Our engine against the hand-written golden transcripts (see alfworld_golden_cases.py)."""

from __future__ import annotations

import pytest
from alfworld_golden_cases import CASES, CLEAN_GAME, build

from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.game import TASK_TYPES


def test_cases_cover_every_task_type():
    assert {case.game.task.task_type for case in CASES} == set(TASK_TYPES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_golden_transcript(case):
    engine = AlfworldEngine(case.game, phrasing=case.phrasing)
    assert engine.reset() == case.opening
    assert not engine.won
    for command, expected, won, *admissible in case.steps:
        assert engine.step(command) == expected, command
        assert engine.won == won, command
        if admissible:
            assert engine.admissible_commands == admissible[0], command


def test_help_is_listed_only_when_asked_but_always_answers():
    quiet = AlfworldEngine(build(**CLEAN_GAME))
    quiet.reset()
    assert "help" not in quiet.admissible_commands
    assert not quiet.is_admissible("help")
    assert quiet.step("help").startswith("Available commands:")
    listed = AlfworldEngine(build(**CLEAN_GAME), include_help=True)
    listed.reset()
    assert "help" in listed.admissible_commands


def test_reset_restores_the_initial_state():
    engine = AlfworldEngine(build(**CLEAN_GAME))
    opening = engine.reset()
    engine.step("go to countertop 1")
    engine.step("take mug 1 from countertop 1")
    assert engine.reset() == opening
    assert engine.step("inventory") == "You are not carrying anything."
    assert engine.step("go to countertop 1").endswith("you see a mug 2, and a mug 1.")


def test_unknown_phrasing_is_rejected():
    with pytest.raises(ValueError, match="phrasing"):
        AlfworldEngine(build(**CLEAN_GAME), phrasing="0.5")
