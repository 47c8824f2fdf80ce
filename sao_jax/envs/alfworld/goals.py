"""Task success: the goal of each task type, evaluated on the engine's state.

Same semantics as alfworld's PDDL goal library: any object of the named class in any
receptacle of the named class with the required state; two distinct objects in one receptacle;
or, for look_at_obj_in_light, the object held while standing at a lamp that was turned on.
"""

from __future__ import annotations

import dataclasses

from sao_jax.envs.alfworld.game import CLEAN, COOL, HEAT, LOOK, TWO, Game


@dataclasses.dataclass
class WorldState:
    """Mutable world state. Indices refer to `Game.receptacles` / `Game.items`.

    location: receptacle the agent stands at, -1 in the middle of the room.
    held: item in hand, -1 when empty-handed.
    where: [I] receptacle holding each item, -1 for the held one.
    contents: [R] items in each receptacle, ascending (= the real engine's list order).
    opened: [R]; clean, hot, cool, toggled: [I].
    """

    location: int
    held: int
    where: list[int]
    contents: list[list[int]]
    opened: list[bool]
    clean: list[bool]
    hot: list[bool]
    cool: list[bool]
    toggled: list[bool]

    @classmethod
    def initial(cls, game: Game) -> WorldState:
        contents: list[list[int]] = [[] for _ in game.receptacles]
        for i, item in enumerate(game.items):
            contents[item.start].append(i)
        n = len(game.items)
        return cls(
            location=-1,
            held=-1,
            where=[item.start for item in game.items],
            contents=contents,
            opened=[False] * len(game.receptacles),
            clean=[False] * n,
            hot=[False] * n,
            cool=[item.start_cool for item in game.items],
            toggled=[False] * n,
        )

    def copy(self) -> WorldState:
        return WorldState(
            self.location,
            self.held,
            list(self.where),
            [list(c) for c in self.contents],
            list(self.opened),
            list(self.clean),
            list(self.hot),
            list(self.cool),
            list(self.toggled),
        )


@dataclasses.dataclass(frozen=True)
class TaskTargets:
    """Indices the goal talks about, precomputed once per game."""

    task_type: str
    objects: tuple[int, ...]  # items of the task's object class
    receptacles: tuple[int, ...]  # receptacles of the target class (empty for look)
    lamps: tuple[int, ...]  # items of the lamp class (look only)

    @classmethod
    def of(cls, game: Game) -> TaskTargets:
        task = game.task
        objects = tuple(i for i, it in enumerate(game.items) if it.cls == task.object_cls)
        if task.task_type == LOOK:
            lamps = tuple(i for i, it in enumerate(game.items) if it.cls == task.receptacle_cls)
            return cls(task.task_type, objects, (), lamps)
        receptacles = tuple(
            r for r, rec in enumerate(game.receptacles) if rec.cls == task.receptacle_cls
        )
        return cls(task.task_type, objects, receptacles, ())

    def has_state(self, state: WorldState, item: int) -> bool:
        """Whether `item` has the state the task asks for (always true without one)."""
        if self.task_type == CLEAN:
            return state.clean[item]
        if self.task_type == HEAT:
            return state.hot[item]
        if self.task_type == COOL:
            return state.cool[item]
        return True


def is_won(targets: TaskTargets, state: WorldState) -> bool:
    """Whether the task's goal holds in `state`."""
    if targets.task_type == LOOK:
        if state.held not in targets.objects or state.location < 0:
            return False
        return any(
            state.toggled[lamp] and state.where[lamp] == state.location for lamp in targets.lamps
        )
    if targets.task_type == TWO:
        return any(
            sum(state.where[i] == r for i in targets.objects) >= 2 for r in targets.receptacles
        )
    return any(
        state.where[i] in targets.receptacles and targets.has_state(state, i)
        for i in targets.objects
    )
