"""The text engine: admissible commands of a state, and what each command does and prints.

Reproduces alfworld 0.4.2 on the TextWorld PDDL engine (checked command by command against it
by tests/envs/test_alfworld_differential.py). Like the real engine, a command is executed only
if it is exactly (after stripping) one of the admissible commands; anything else prints
"Nothing happens." and changes nothing.
"""

from __future__ import annotations

import bisect

import sao_jax.envs.alfworld.classes as classes
import sao_jax.envs.alfworld.texts as texts
from sao_jax.envs.alfworld.game import Game
from sao_jax.envs.alfworld.goals import TaskTargets, WorldState, is_won

# Action kinds; an action is (kind, item index, receptacle index), -1 where unused.
GOTO, OPEN, CLOSE, TAKE, PUT, CLEAN, HEAT, COOL, USE = range(9)
INVENTORY, LOOK, EXAMINE_RECEPTACLE, EXAMINE_ITEM, HELP = range(9, 14)
Action = tuple[int, int, int]

_VERBS = ("clean", "heat", "cool")
_APPLIANCE_ACTION = {classes.SINK: CLEAN, classes.MICROWAVE: HEAT, classes.FRIDGE: COOL}


class AlfworldEngine:
    """Plays one `Game`. `reset()` returns the opening text, `step(command)` the feedback.

    include_help: list `help` among the admissible commands (the real engine does; agent
      papers drop it). `help` works either way, as in the real engine.
    """

    def __init__(self, game: Game, *, phrasing: str = "0.4.2", include_help: bool = False):
        self.game = game
        self.phrasing = texts.check_phrasing(phrasing)
        self.include_help = include_help
        self.targets = TaskTargets.of(game)
        recs, items = game.receptacles, game.items
        self._rec_names = [r.name for r in recs]
        self._item_names = [i.name for i in items]
        self._openable = [r.openable for r in recs]
        self._appliance_action = [_APPLIANCE_ACTION.get(r.cls, -1) for r in recs]
        self._fits = [
            frozenset(i for i, it in enumerate(items) if classes.can_contain(r.cls, it.cls))
            for r in recs
        ]
        self._treatable = {
            CLEAN: frozenset(i for i, it in enumerate(items) if it.cls in classes.CLEANABLE),
            HEAT: frozenset(i for i, it in enumerate(items) if it.cls in classes.HEATABLE),
            COOL: frozenset(i for i, it in enumerate(items) if it.cls in classes.COOLABLE),
        }
        self._is_lamp = [it.is_lamp for it in items]
        self._goto = {f"go to {name}": (GOTO, -1, r) for r, name in enumerate(self._rec_names)}
        self.state = WorldState.initial(game)
        self._actions: dict[str, Action] | None = None
        self._commands: list[str] | None = None
        self.won = False

    def reset(self) -> str:
        """Put the world back in its initial state; returns the opening observation."""
        self.state = WorldState.initial(self.game)
        self._actions, self._commands = None, None
        self.won = False
        return texts.intro(self._rec_names, self.game.task.sentence)

    @property
    def admissible_commands(self) -> list[str]:
        """The commands that do something now, sorted A-Z (the real engine's order)."""
        if self._commands is None:
            commands = sorted(self._admissible())
            if not self.include_help:
                commands.remove("help")
            self._commands = commands
        return list(self._commands)

    def is_admissible(self, command: str) -> bool:
        """Whether `command` is in `admissible_commands` (surrounding blanks ignored)."""
        command = command.strip()
        return command in self._admissible() and (self.include_help or command != "help")

    def step(self, command: str) -> str:
        """Execute `command` if admissible; returns its feedback (or "Nothing happens.")."""
        action = self._admissible().get(command.strip())
        if action is None:
            return texts.NOTHING_HAPPENS
        self._actions, self._commands = None, None
        feedback = self._apply(action)
        self.won = is_won(self.targets, self.state)
        return feedback

    def _admissible(self) -> dict[str, Action]:
        if self._actions is not None:
            return self._actions
        s = self.state
        actions: dict[str, Action] = dict(self._goto)
        actions.update(inventory=(INVENTORY, -1, -1), look=(LOOK, -1, -1), help=(HELP, -1, -1))
        held = s.held
        if s.location >= 0:
            r, name = s.location, self._rec_names[s.location]
            del actions[f"go to {name}"]
            actions[f"examine {name}"] = (EXAMINE_RECEPTACLE, -1, r)
            accessible = True
            if self._openable[r]:
                accessible = s.opened[r]
                actions[f"{'close' if accessible else 'open'} {name}"] = (
                    CLOSE if accessible else OPEN,
                    -1,
                    r,
                )
            for i in s.contents[r]:
                if self._is_lamp[i]:
                    actions[f"use {self._item_names[i]}"] = (USE, i, -1)
                elif held < 0 and accessible:
                    actions[f"take {self._item_names[i]} from {name}"] = (TAKE, i, r)
            if held >= 0:
                held_name = self._item_names[held]
                if accessible and held in self._fits[r]:
                    command = texts.put_command(held_name, name, self.phrasing)
                    actions[command] = (PUT, held, r)
                kind = self._appliance_action[r]
                if kind >= 0 and held in self._treatable[kind]:
                    command = texts.treat_command(_VERBS[kind - CLEAN], held_name, name)
                    actions[command] = (kind, held, r)
        if held >= 0:
            actions[f"examine {self._item_names[held]}"] = (EXAMINE_ITEM, held, -1)
        self._actions = actions
        return actions

    def _apply(self, action: Action) -> str:
        kind, i, r = action
        s = self.state
        if kind == GOTO:
            s.location = r
            view = self._view(r)
            number = self.game.receptacles[r].location_number
            return texts.arrive(self._rec_names[r], number, view, self.phrasing)
        if kind == OPEN:
            s.opened[r] = True
            return texts.opened(self._rec_names[r], self._view(r))
        if kind == CLOSE:
            s.opened[r] = False
            return texts.closed(self._rec_names[r])
        if kind == TAKE:
            s.contents[r].remove(i)
            s.where[i], s.held = -1, i
            return texts.picked_up(self._item_names[i], self._rec_names[r])
        if kind == PUT:
            bisect.insort(s.contents[r], i)
            s.where[i], s.held = r, -1
            return texts.put_feedback(self._item_names[i], self._rec_names[r], self.phrasing)
        if kind in (CLEAN, HEAT, COOL):
            if kind == CLEAN:
                s.clean[i] = True
            elif kind == HEAT:
                s.hot[i], s.cool[i] = True, False
            else:
                s.cool[i], s.hot[i] = True, False
            return texts.treated(_VERBS[kind - CLEAN], self._item_names[i], self._rec_names[r])
        if kind == USE:
            s.toggled[i] = True
            return texts.turned_on(self._item_names[i])
        if kind == INVENTORY:
            return texts.inventory(None if s.held < 0 else self._item_names[s.held])
        if kind == LOOK:
            if s.location < 0:
                # The opening lists the room; `look` binds the agent's spot, where none stand.
                return texts.look_around([])
            return texts.look_at(self._rec_names[s.location])
        if kind == EXAMINE_RECEPTACLE:
            return self._view(r)
        if kind == EXAMINE_ITEM:
            return texts.examine_item(self._item_names[i], s.clean[i], s.hot[i], s.cool[i])
        return texts.HELP

    def _view(self, r: int) -> str:
        s = self.state
        contents = [self._item_names[i] for i in s.contents[r]]
        return texts.receptacle_view(self._rec_names[r], self._openable[r], s.opened[r], contents)
