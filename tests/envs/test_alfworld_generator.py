"""Procedural games: splits, determinism, held-out layouts, and well-formed tasks."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from sao_jax.envs.alfworld import classes
from sao_jax.envs.alfworld.game import APPLIANCE, LOOK, TASK_TYPES, TWO
from sao_jax.envs.alfworld.generator import (
    SIZES,
    SPLITS,
    TASK_COUNTS,
    VALID_ROOMS,
    make_game,
    scene_layouts,
)
from sao_jax.envs.alfworld.goals import TaskTargets, WorldState, is_won
from sao_jax.envs.alfworld.rooms import ROOM_TYPES, scene_numbers
from sao_jax.envs.rng import StableRng, stable_seed


def all_games(size):
    return [make_game(split, i, size=size) for split, n in SPLITS.items() for i in range(n)]


def test_splits_have_alfworlds_sizes_and_task_type_counts():
    assert SPLITS == {"train": 3553, "valid_seen": 140, "valid_unseen": 134}
    for split, counts in TASK_COUNTS.items():
        got = Counter(
            make_game(split, i, size="small").task.task_type for i in range(SPLITS[split])
        )
        assert got == counts


def test_same_split_and_index_give_the_same_game():
    first = [make_game("train", i, size=s) for i in (0, 17, 3552) for s in SIZES]
    make_game.cache_clear()
    assert [make_game("train", i, size=s) for i in (0, 17, 3552) for s in SIZES] == first
    assert make_game("train", 0) != make_game("train", 1)
    assert make_game("train", 0) != make_game("valid_seen", 0)


DIGEST = """
import hashlib
from sao_jax.envs.alfworld.generator import make_game
text = repr([make_game(s, i, size=z) for s, i in (("train", 5), ("valid_unseen", 133)) for z in ("full", "small")])
print(hashlib.sha256(text.encode()).hexdigest())
"""


def test_games_are_identical_across_processes_with_different_hash_seeds():
    games = [
        make_game(s, i, size=z)
        for s, i in (("train", 5), ("valid_unseen", 133))
        for z in ("full", "small")
    ]
    expected = hashlib.sha256(repr(games).encode()).hexdigest()
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", DIGEST],
            env={"PYTHONHASHSEED": hash_seed, "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected


def test_stable_rng_draws_are_deterministic_and_uniform():
    assert stable_seed("game", "train", 0) == stable_seed("game", "train", 0)
    assert stable_seed("a", 1) != stable_seed("a1")
    assert [StableRng("s").below(1000) for _ in range(3)] == [StableRng("s").below(1000)] * 3
    rng = StableRng("uniform")
    counts = Counter(rng.below(6) for _ in range(6000))
    assert set(counts) == set(range(6)) and all(800 < c < 1200 for c in counts.values())
    assert {rng.between(3, 5) for _ in range(200)} == {3, 4, 5}
    assert 1300 < sum(rng.chance(0.25) for _ in range(6000)) < 1700
    assert not any(rng.chance(0.0) for _ in range(100)) and all(rng.chance(1.0) for _ in range(100))
    assert sorted(rng.shuffled(range(10))) == list(range(10))
    with pytest.raises(ValueError, match="empty"):
        rng.choice([])
    with pytest.raises(ValueError, match="sample of 3"):
        rng.sample([1, 2], 3)
    with pytest.raises(ValueError, match="n > 0"):
        rng.below(0)


@pytest.mark.parametrize("size", SIZES)
def test_unseen_games_use_no_train_scene_layout(size):
    def floor_plan(game):
        lamps = tuple((it.name, game.receptacles[it.start].name) for it in game.items if it.is_lamp)
        return game.room, tuple(r.name for r in game.receptacles), lamps

    train_plans = {floor_plan(make_game("train", i, size=size)) for i in range(SPLITS["train"])}
    for i in range(SPLITS["valid_unseen"]):
        game = make_game("valid_unseen", i, size=size)
        assert game.scene in scene_numbers(game.room, unseen=True)
        assert floor_plan(game) not in train_plans, game.game_id
    for room in ROOM_TYPES:
        layouts = scene_layouts(room, size)
        seen = {layouts[s].key for s in scene_numbers(room, unseen=False)}
        assert all(layouts[s].key not in seen for s in scene_numbers(room, unseen=True))
    for i in range(SPLITS["valid_seen"]):
        game = make_game("valid_seen", i, size=size)
        assert game.scene in scene_numbers(game.room, unseen=False)


@pytest.mark.parametrize("size", SIZES)
def test_every_game_is_well_formed_and_not_solved_at_start(size):
    seen_types = Counter()
    for game in all_games(size):
        task = game.task
        seen_types[task.task_type] += 1
        assert game.room in VALID_ROOMS[task.task_type]
        rec_classes = {r.cls for r in game.receptacles}
        targets = [it for it in game.items if it.cls == task.object_cls]
        assert len(targets) >= (2 if task.task_type == TWO else 1)
        if task.task_type == LOOK:
            assert any(it.cls == task.receptacle_cls for it in game.items)
            assert task.receptacle_cls in classes.LAMPS
        else:
            assert task.receptacle_cls in rec_classes
            assert classes.can_contain(task.receptacle_cls, task.object_cls)
        if task.task_type in APPLIANCE:
            assert APPLIANCE[task.task_type] in rec_classes
        for it in game.items:
            home = game.receptacles[it.start]
            assert it.is_lamp or classes.can_contain(home.cls, it.cls), game.game_id
            assert it.start_cool == (home.cls == "Fridge" and it.cls in classes.COOLABLE)
        assert not is_won(TaskTargets.of(game), WorldState.initial(game)), game.game_id
        names = [r.name for r in game.receptacles] + [it.name for it in game.items]
        assert len(names) == len(set(names))
        if size == "small":
            assert 4 <= len(game.receptacles) <= 6
            assert len(targets) == (2 if task.task_type == TWO else 1)
            assert len(game.items) - len(targets) - sum(it.is_lamp for it in game.items) <= 3
    assert set(seen_types) == set(TASK_TYPES)


def test_lists_follow_the_real_engines_id_order():
    game = make_game("train", 1)
    ids = [r.pddl_id.lower() for r in game.receptacles]
    assert ids == sorted(ids)
    # The first id of a class carries its highest number (the demangler pops numbers).
    cabinets = [r.number for r in game.receptacles if r.cls == "Cabinet"]
    assert cabinets == sorted(cabinets, reverse=True)


@pytest.mark.parametrize(
    "args,error,message",
    [
        (("test", 0), ValueError, "unknown split"),
        (("train", 3553), IndexError, r"train has 3553 games \(0..3552\)"),
        (("valid_seen", -1), IndexError, "valid_seen has 140"),
        (("train", "3"), IndexError, "got '3'"),
    ],
)
def test_bad_game_arguments_name_the_problem(args, error, message):
    with pytest.raises(error, match=message):
        make_game(*args)


def test_unknown_size_is_rejected():
    with pytest.raises(ValueError, match="unknown size 'tiny'"):
        make_game("train", 0, size="tiny")
