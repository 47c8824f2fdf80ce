"""The PDDL problem we write for the real engine (its play is checked in the differential test)."""

from __future__ import annotations

import re
import sys

import pytest

from sao_jax.envs.alfworld.game import export_id
from sao_jax.envs.alfworld.generator import make_game
from sao_jax.envs.alfworld.pddl_export import _first_balanced, export_tw_pddl, pddl_problem
from sao_jax.envs.alfworld.real_env import RealAlfworldEnv

GOAL = "(:goal (and (holdsAny agent1)))"


def test_problem_declares_each_entity_once_and_states_the_initial_world():
    game = make_game("train", 2, size="full")
    problem = pddl_problem(game, GOAL)
    assert problem.count("(") == problem.count(")")
    declared = re.findall(r"^\s+(\S+) - (\w+)$", problem, re.MULTILINE)
    names = [name for name, _ in declared]
    assert len(names) == len(set(names))
    assert {r.pddl_id for r in game.receptacles} | {i.pddl_id for i in game.items} <= set(names)
    for item in game.items:
        home = game.receptacles[item.start].pddl_id
        assert f"(inReceptacle {item.pddl_id} {home})" in problem
        assert (f"(isCool {item.pddl_id})" in problem) == item.start_cool
        assert (f"(pickupable {item.pddl_id})" in problem) != item.is_lamp
    for rec in game.receptacles:
        assert (f"(openable {rec.pddl_id})" in problem) == rec.openable
    assert problem.count("(atLocation agent1 ") == 1
    assert GOAL in problem and "canContain" in problem


def test_ids_spell_basins_so_the_demangler_names_them():
    assert export_id("SinkBasin", 1, 2) == "Sink_bar_02_bar_SinkBasin"
    assert export_id("BathtubBasin", 1, 1) == "Bathtub_bar_01_bar_BathtubBasin"
    assert export_id("Cabinet", 3, 12) == "Cabinet_bar_10"


def test_first_balanced_block_is_cut_from_the_goal_library_text():
    assert _first_balanced("x (:goal (a (b)) ) )", "(:goal") == "(:goal (a (b)) )"
    with pytest.raises(ValueError, match="unbalanced"):
        _first_balanced("(:goal (a", "(:goal")


def test_real_engine_bridge_names_the_missing_extra(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m.split(".")[0] == "alfworld"] + ["alfworld"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if alfworld were not installed
    with pytest.raises(ImportError, match=r"sao_jax\[alfworld\]"):
        export_tw_pddl(make_game("train", 0), tmp_path)
    with pytest.raises(ImportError, match=r"sao_jax\[alfworld\]"):
        RealAlfworldEnv(tmp_path)
