"""Write a generated game as an ALFWorld `game.tw-pddl` the real engine can play.

The file is alfworld's own format: JSON with the PDDL domain and text grammar shipped in the
`alfworld` wheel (the grammar's "UNKNOWN GOAL" replaced by the task sentence, as
`alfworld-generate` does), our PDDL problem, and `solvable`. The problem's `:goal` comes from
alfworld's goal library. A `traj_data.json` next to it carries the task parameters alfworld's
loaders and experts read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import sao_jax.envs.alfworld.classes as classes
from sao_jax.envs.alfworld.game import LOOK, Game

ALFWORLD_EXTRA_HINT = 'the real ALFWorld engine is optional: pip install "sao_jax[alfworld]"'


def alfworld_logic() -> tuple[str, str]:
    """(PDDL domain, text grammar) shipped in the installed `alfworld` wheel."""
    try:
        from importlib import resources

        data = resources.files("alfworld") / "data"
        return (data / "alfred.pddl").read_text(), (data / "alfred.twl2").read_text()
    except ModuleNotFoundError as error:
        raise ImportError(f"alfworld is not installed; {ALFWORLD_EXTRA_HINT}") from error


def goal_pddl(game: Game) -> str:
    """The task's `(:goal ...)` from alfworld's goal library, filled with the game's classes."""
    try:
        from alfworld.gen import goal_library
    except ModuleNotFoundError as error:
        raise ImportError(f"alfworld is not installed; {ALFWORLD_EXTRA_HINT}") from error
    task = game.task
    template = goal_library.gdict[task.task_type]["pddl"]
    filled = template.format(
        obj=task.object_cls, recep=task.receptacle_cls, toggle=task.receptacle_cls
    )
    # The library writes types as "?x # type" and closes the enclosing (define ...) too.
    return _first_balanced(filled.replace("#", "-"), "(:goal")


def pddl_problem(game: Game, goal: str) -> str:
    """The PDDL problem of `game`'s initial state with the given `(:goal ...)` block."""
    recs, items = game.receptacles, game.items
    n = len(recs)
    # Location ids sort so that the demangler names each one "loc <location_number>".
    start = "loc_bar_00"
    loc = [f"loc_bar_{n + 1 - rec.location_number:02d}" for rec in recs]
    objects = ["agent1 - agent"]
    objects += [f"{it.pddl_id} - object" for it in items]
    objects += [f"{rec.pddl_id} - receptacle" for rec in recs]
    objects += [f"{name} - location" for name in (start, *loc)]
    objects += [f"{cls}Type - otype" for cls in sorted(classes.OBJECT_CLASSES)]
    objects += [f"{cls}Type - rtype" for cls in sorted(classes.RECEPTACLE_CLASSES)]

    init = [f"(atLocation agent1 {start})"]
    for r, rec in enumerate(recs):
        init.append(f"(receptacleType {rec.pddl_id} {rec.cls}Type)")
        init.append(f"(receptacleAtLocation {rec.pddl_id} {loc[r]})")
        if rec.openable:
            init.append(f"(openable {rec.pddl_id})")
    for it in items:
        home = recs[it.start]
        init.append(f"(objectType {it.pddl_id} {it.cls}Type)")
        init.append(f"(inReceptacle {it.pddl_id} {home.pddl_id})")
        init.append(f"(objectAtLocation {it.pddl_id} {loc[it.start]})")
        if it.is_lamp:
            init.append(f"(toggleable {it.pddl_id})")
        else:
            init.append(f"(pickupable {it.pddl_id})")
        for predicate, members in (
            ("cleanable", classes.CLEANABLE),
            ("heatable", classes.HEATABLE),
            ("coolable", classes.COOLABLE),
        ):
            if it.cls in members:
                init.append(f"({predicate} {it.pddl_id})")
        if it.start_cool:
            init.append(f"(isCool {it.pddl_id})")
    item_classes = sorted({it.cls for it in items})
    for rc in sorted({rec.cls for rec in recs}):
        init += [
            f"(canContain {rc}Type {oc}Type)" for oc in item_classes if classes.can_contain(rc, oc)
        ]

    name = game.game_id.replace("/", "_")
    lines = [f"(define (problem sao_jax_{name})", "(:domain alfred)", "(:objects"]
    lines += [f"    {o}" for o in objects] + [")", "(:init"] + [f"    {f}" for f in init] + [")"]
    return "\n".join([*lines, goal, ")", ""])


def export_tw_pddl(game: Game, directory: str | os.PathLike) -> Path:
    """Write `directory/game.tw-pddl` (+ `traj_data.json`) for the real engine; returns its path.

    Needs the `alfworld` extra (its domain, grammar and goal library).
    """
    domain, grammar = alfworld_logic()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    task = game.task
    game_file = out / "game.tw-pddl"
    game_file.write_text(
        json.dumps(
            {
                "pddl_domain": domain,
                "grammar": grammar.replace("UNKNOWN GOAL", task.sentence),
                "pddl_problem": pddl_problem(game, goal_pddl(game)),
                "solvable": True,
            }
        )
    )
    is_look = task.task_type == LOOK
    traj = {
        "task_type": task.task_type,
        "task_id": game.game_id,
        "scene": {"scene_num": game.scene},
        "pddl_params": {
            "object_target": task.object_cls,
            "parent_target": "" if is_look else task.receptacle_cls,
            "toggle_target": task.receptacle_cls if is_look else "",
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": task.sentence}]},
    }
    (out / "traj_data.json").write_text(json.dumps(traj, indent=1))
    return game_file


def _first_balanced(text: str, opening: str) -> str:
    """The parenthesised block of `text` that starts at `opening`."""
    start = text.index(opening)
    depth = 0
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
    raise ValueError(f"unbalanced parentheses after {opening!r}")
