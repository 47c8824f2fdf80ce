"""The expert: a planner that reads the true world state and returns a short plan from it.

Works from any state, not only the start (for behaviour-cloning data and DAgger-style
relabelling): it first puts down an object that does not serve the task, then fetches the
cheapest target object (counting the steps to walk, open, treat and deliver), treats it with
the task's appliance, and delivers it; for look_at_obj_in_light it carries the object to a lamp
and turns the lamp on. Every command it returns is admissible when it is issued.
"""

from __future__ import annotations

from collections.abc import Callable

import sao_jax.envs.alfworld.classes as classes
import sao_jax.envs.alfworld.texts as texts
from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.game import APPLIANCE, LOOK, TWO, Game
from sao_jax.envs.alfworld.goals import TaskTargets, WorldState, is_won

_VERB = {classes.SINK: "clean", classes.MICROWAVE: "heat", classes.FRIDGE: "cool"}


def expert_action(engine: AlfworldEngine) -> str | None:
    """The expert's next command for the engine's current state (None once the task is won)."""
    plan = expert_plan(engine.game, engine.state, phrasing=engine.phrasing, targets=engine.targets)
    return plan[0] if plan else None


def expert_plan(
    game: Game,
    state: WorldState,
    *,
    phrasing: str = "0.4.2",
    targets: TaskTargets | None = None,
) -> list[str]:
    """Commands that win the game from `state` (empty if it is already won)."""
    targets = targets if targets is not None else TaskTargets.of(game)
    if is_won(targets, state):
        return []
    plan = _Plan(game, state, phrasing)
    if plan.held >= 0 and plan.held not in targets.objects:
        plan.put_away()
    if targets.task_type == LOOK:
        _look(plan, targets)
    elif targets.task_type == TWO:
        _two(plan, targets)
    else:
        _single(plan, targets, state)
    return plan.commands


class _Plan:
    """A virtual agent that records commands while tracking where it is and what it holds."""

    def __init__(self, game: Game, state: WorldState, phrasing: str):
        self.game, self.phrasing = game, phrasing
        self.loc, self.held = state.location, state.held
        self.where = list(state.where)
        self.opened = {r for r, is_open in enumerate(state.opened) if is_open}
        self.toggled = list(state.toggled)
        self.commands: list[str] = []

    def access_cost(self, r: int) -> int:
        """Steps to stand at `r` with it open."""
        closed = self.game.receptacles[r].openable and r not in self.opened
        return int(self.loc != r) + int(closed)

    def go(self, r: int) -> None:
        if self.loc != r:
            self.commands.append(f"go to {self.game.receptacles[r].name}")
            self.loc = r

    def access(self, r: int) -> None:
        self.go(r)
        if self.game.receptacles[r].openable and r not in self.opened:
            self.commands.append(f"open {self.game.receptacles[r].name}")
            self.opened.add(r)

    def take(self, i: int) -> None:
        r = self.where[i]
        self.access(r)
        self.commands.append(f"take {self.game.items[i].name} from {self.game.receptacles[r].name}")
        self.held, self.where[i] = i, -1

    def put(self, r: int) -> None:
        self.access(r)
        item, rec = self.game.items[self.held].name, self.game.receptacles[r].name
        self.commands.append(texts.put_command(item, rec, self.phrasing))
        self.where[self.held] = r
        self.held = -1

    def treat(self, r: int) -> None:
        self.go(r)
        rec = self.game.receptacles[r]
        item = self.game.items[self.held].name
        self.commands.append(texts.treat_command(_VERB[rec.cls], item, rec.name))

    def use(self, lamp: int) -> None:
        self.go(self.where[lamp])
        self.commands.append(f"use {self.game.items[lamp].name}")
        self.toggled[lamp] = True

    def put_away(self) -> None:
        """Put the held object into the nearest receptacle that takes it."""
        cls = self.game.items[self.held].cls
        fitting = [
            r for r, rec in enumerate(self.game.receptacles) if classes.can_contain(rec.cls, cls)
        ]
        self.put(min(fitting, key=lambda r: (self.access_cost(r), r)))

    def cheapest(self, options: list[int], cost: Callable[[int], int]) -> int:
        """The option of least cost (ties: lowest index, i.e. first in the engine's order)."""
        return min(options, key=lambda option: (cost(option), option))


def _single(plan: _Plan, targets: TaskTargets, state: WorldState) -> None:
    """pick / clean / heat / cool: fetch, treat if needed, deliver."""
    appliance_cls = APPLIANCE.get(targets.task_type)
    appliances = [r for r, rec in enumerate(plan.game.receptacles) if rec.cls == appliance_cls]

    def needs_treatment(i: int) -> bool:
        return not targets.has_state(state, i)

    if plan.held < 0:
        available = [i for i in targets.objects if plan.where[i] >= 0]
        plan.take(
            plan.cheapest(
                available, lambda i: plan.access_cost(plan.where[i]) + 2 * needs_treatment(i)
            )
        )
    if needs_treatment(plan.held):
        plan.treat(plan.cheapest(appliances, lambda r: int(plan.loc != r)))
    plan.put(plan.cheapest(list(targets.receptacles), plan.access_cost))


def _two(plan: _Plan, targets: TaskTargets) -> None:
    """pick_two: gather two objects of the class in one receptacle of the goal class."""

    def count(r: int) -> int:
        return sum(plan.where[i] == r for i in targets.objects)

    filled = [r for r in targets.receptacles if count(r) > 0]
    anchor = plan.cheapest(filled, lambda r: -count(r)) if filled else None
    if plan.held < 0 and anchor is None:
        plan.take(plan.cheapest(list(targets.objects), lambda i: plan.access_cost(plan.where[i])))
    if plan.held >= 0:
        if anchor is None:
            anchor = plan.cheapest(list(targets.receptacles), plan.access_cost)
        plan.put(anchor)
        if count(anchor) >= 2:
            return
    others = [i for i in targets.objects if plan.where[i] not in (anchor, -1)]
    plan.take(plan.cheapest(others, lambda i: plan.access_cost(plan.where[i])))
    plan.put(anchor)


def _look(plan: _Plan, targets: TaskTargets) -> None:
    """look_at_obj_in_light: hold the object at a lamp that is on."""

    def lamp_cost(lamp: int, at: int) -> int:
        return int(at != plan.where[lamp]) + int(not plan.toggled[lamp])

    if plan.held < 0:

        def fetch_cost(i: int) -> int:
            at = plan.where[i]
            return plan.access_cost(at) + min(lamp_cost(lamp, at) for lamp in targets.lamps)

        plan.take(plan.cheapest([i for i in targets.objects if plan.where[i] >= 0], fetch_cost))
    lamp = plan.cheapest(list(targets.lamps), lambda lamp: lamp_cost(lamp, plan.loc))
    plan.go(plan.where[lamp])
    if not plan.toggled[lamp]:
        plan.use(lamp)
