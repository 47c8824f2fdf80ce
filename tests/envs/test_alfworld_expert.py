"""The expert solves every generated game, from the start and from perturbed states."""

from __future__ import annotations

import random

import pytest

from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.expert import expert_action, expert_plan
from sao_jax.envs.alfworld.generator import SIZES, SPLITS, make_game

MAX_STEPS = 50


def solve(engine: AlfworldEngine) -> int:
    """Follow the expert to the win; every command must be admissible. Returns steps taken."""
    steps = 0
    while not engine.won:
        command = expert_action(engine)
        assert command is not None and engine.is_admissible(command), (engine.game.game_id, command)
        engine.step(command)
        steps += 1
        assert steps <= MAX_STEPS, engine.game.game_id
    return steps


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("split", list(SPLITS))
def test_expert_solves_every_game_of_the_split(split, size):
    # train: 1,000 games spread over the split; the valid splits: all of them.
    indices = range(SPLITS[split]) if split != "train" else range(0, SPLITS[split], 3)[:1000]
    lengths = []
    for index in indices:
        engine = AlfworldEngine(make_game(split, index, size=size))
        engine.reset()
        plan = expert_plan(engine.game, engine.state, targets=engine.targets)
        lengths.append(solve(engine))
        assert lengths[-1] == len(plan), engine.game.game_id  # the plan is followed as made
    assert len(lengths) == len(indices)
    assert max(lengths) <= 12


@pytest.mark.parametrize("phrasing", ["0.4.2", "0.3"])
def test_expert_recovers_from_random_detours(phrasing):
    rng = random.Random(0)
    for index in range(0, SPLITS["train"], 11):
        engine = AlfworldEngine(make_game("train", index, size="full"), phrasing=phrasing)
        engine.reset()
        for _ in range(rng.randrange(1, 15)):  # may pick up, move or treat the wrong things
            if engine.won:
                break
            engine.step(rng.choice(engine.admissible_commands))
        solve(engine)


def test_expert_has_nothing_to_do_once_won():
    engine = AlfworldEngine(make_game("valid_seen", 3, size="small"))
    engine.reset()
    solve(engine)
    assert expert_action(engine) is None
    assert expert_plan(engine.game, engine.state) == []
