"""ALFWorld's rule-based hindsight: what an episode revealed, in short regular sentences.

Read off the game's ground truth and a replay of the episode's commands in our engine:

- fact: where each object the task needs was ("The mug 1 is in cabinet 3."), and places the
  agent looked into that held none ("The mug is not in countertop 1.");
- failed_command: the first commands that did nothing, each with the reason read off the
  replayed state ("Nothing happens for 'take mug 1 from countertop 1': go to countertop 1
  first."), or that repeated an earlier one where the expert would not ("You should not
  choose 'look' at step 4, you took it at step 2."), or a reply with no action;
- procedure: the expert's commands from the start ("You should go to cabinet 3, open
  cabinet 3, take mug 1 from cabinet 3, ...").

Every word is in the ALFWorld word vocabulary (`sao_jax.envs.alfworld.vocabulary`), so the
CPU presets' word tokenizer reads every skill without `<unk>` (tested). `action_labels` says
which of an episode's actions were the (oracle) expert's choice in the replayed state.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

from sao_jax.envs.alfworld import make_game
from sao_jax.envs.alfworld.classes import display_class
from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.expert import expert_action, expert_plan
from sao_jax.envs.alfworld.game import APPLIANCE, LOOK, Game
from sao_jax.envs.alfworld.goals import WorldState
from sao_jax.envs.alfworld.texts import NOTHING_HAPPENS

MAX_FAILED, MAX_REVEALED = 2, 2  # sentences of each kind a skill keeps (the block is short)

_TAKE = re.compile(r"^take (.+?) from (.+)$")
_PUT = re.compile(r"^(?:move (.+?) to (.+)|put (.+?) in/on (.+))$")
_TREAT = re.compile(r"^(?:heat|cool|clean) (.+?) with (.+)$")
_AT = re.compile(r"^(go to|open|close|examine|use) (.+)$")
_COMMANDS = (_TAKE, _PUT, _TREAT, _AT)
_VERBS = ("go to", "open", "close", "examine", "use")
_STATE_NEUTRAL = ("look", "inventory", "examine ", "go to ")  # a repeat of these changes nothing


@dataclasses.dataclass
class Replay:
    """An episode's commands replayed in the engine.

    correct: per action, whether it was the oracle expert's command in that state (or won);
    failures: failed_command sentences, in step order; revealed: "not in" facts, in order.
    """

    correct: list[bool]
    failures: list[str]
    revealed: list[str]


class AlfworldHindsight:
    """The `HindsightRules` of ALFWorld (see the module docstring). Needs the episode's game
    spec (`header.task`: split, index, size, phrasing)."""

    env = "alfworld"
    version = "rules-v2"
    kind_patterns: ClassVar[dict[str, str]] = {
        "fact": r"The \S+ (?:\d+ )?is (?:not )?in ",
        "failed_command": r"(?:Nothing happens for '|You should not choose '|Choose an admissible)",
        "procedure": r"You should (?!not choose)",
    }

    def hindsight(
        self, spec: Mapping | None, task: str, actions: Sequence[str], success: bool
    ) -> list[tuple[str, str]]:
        game, phrasing = _game(spec), spec.get("phrasing", "0.4.2")
        replay = replay_episode(game, actions, phrasing=phrasing)
        plan = expert_plan(game, WorldState.initial(game), phrasing=phrasing)
        failed = [("failed_command", s) for s in replay.failures[:MAX_FAILED]]
        # most important first: where the objects were, the first failure, the procedure
        pairs = [("fact", s) for s in location_facts(game)] + failed[:1]
        pairs.append(("procedure", f"You should {', '.join(plan)}."))
        return pairs + [("fact", s) for s in replay.revealed[:MAX_REVEALED]] + failed[1:]

    def action_labels(self, spec: Mapping | None, task: str, actions: Sequence[str]) -> list[bool]:
        replay = replay_episode(_game(spec), actions, phrasing=spec.get("phrasing", "0.4.2"))
        return replay.correct


ALFWORLD_RULES = AlfworldHindsight()


def _game(spec: Mapping | None) -> Game:
    if not spec or "split" not in spec or "index" not in spec:
        raise ValueError(
            "no game spec (split, index): ALFWorld's rules read the game's ground truth"
        )
    return make_game(spec["split"], int(spec["index"]), size=spec.get("size", "full"))


def location_facts(game: Game) -> list[str]:
    """Where the task's objects (two for pick_two, also the lamps for look) started."""
    task = game.task
    wanted = [i for i in game.items if i.cls == task.object_cls][:2]
    if task.task_type == LOOK:
        wanted += [i for i in game.items if i.cls == task.receptacle_cls][:1]
    return [f"The {i.name} is in {game.receptacles[i.start].name}." for i in wanted]


def replay_episode(game: Game, actions: Sequence[str], *, phrasing: str = "0.4.2") -> Replay:
    """Replay `actions` from the game's start (stops once won)."""
    engine = AlfworldEngine(game, phrasing=phrasing)
    engine.reset()
    task = game.task
    skip = {task.receptacle_cls, APPLIANCE.get(task.task_type)}  # visited for other reasons
    objects = {i for i, item in enumerate(game.items) if item.cls == task.object_cls}
    correct, failures, revealed = [], [], []
    seen: dict[str, int] = {}
    for step, action in enumerate(actions, start=1):
        if engine.won:
            break
        expected = expert_action(engine)
        correct.append(bool(action) and action == expected)
        if not action:
            failures.append(f"Choose an admissible action at step {step}.")
            continue
        if not engine.is_admissible(action):
            why = _why_nothing_happens(engine, action)
            failures.append(f"Nothing happens for '{action}': {why}.")
            engine.step(action)
            continue
        earlier = seen.get(action)
        if earlier is not None and action != expected and action.startswith(_STATE_NEUTRAL):
            failures.append(
                f"You should not choose '{action}' at step {step}, you took it at step {earlier}."
            )
        seen[action] = step
        feedback = engine.step(action)
        correct[-1] = correct[-1] or engine.won
        state = engine.state
        r = state.location
        if feedback == NOTHING_HAPPENS or r < 0 or not action.startswith(("go to ", "open ")):
            continue
        receptacle = game.receptacles[r]
        visible = not receptacle.openable or state.opened[r]
        holding_target = state.held in objects
        empty = not objects & set(state.contents[r])
        if visible and empty and not holding_target and receptacle.cls not in skip:
            fact = f"The {display_class(task.object_cls)} is not in {receptacle.name}."
            if fact not in revealed:
                revealed.append(fact)
    return Replay(correct, _unique(failures), revealed)


def _unique(sentences: list[str]) -> list[str]:
    return list(dict.fromkeys(sentences))


def _why_nothing_happens(engine: AlfworldEngine, command: str) -> str:
    """Why an inadmissible `command` did nothing in the engine's current state: the fix."""
    game, state = engine.game, engine.state
    recs = {r.name: k for k, r in enumerate(game.receptacles)}
    items = {i.name: k for k, i in enumerate(game.items)}
    here = state.location
    held = game.items[state.held].name if state.held >= 0 else None

    def access(name: str) -> str | None:
        r = recs[name]
        if here != r:
            return f"go to {name} first"
        if game.receptacles[r].openable and not state.opened[r]:
            return f"open {name} first"
        return None

    match = next((m for m in (regex.match(command) for regex in _COMMANDS) if m), None)
    names = [n for n in (match.groups() if match else ()) if n and n not in _VERBS]
    missing = [n for n in names if n not in recs and n not in items]
    if missing:
        return f"{missing[0]} is not in the room"
    if match := _TAKE.match(command):
        obj, rec = match.groups()
        if obj in items and rec in recs:
            if game.items[items[obj]].is_lamp:
                return f"you should use {obj}"
            if held is not None:
                return f"you are carrying {held}"
            if items[obj] not in state.contents[recs[rec]]:
                return f"{obj} is not in {rec}"
            return access(rec) or "choose an admissible action"
    elif match := _PUT.match(command):
        obj, rec = (g for g in match.groups() if g is not None)
        if obj in items and rec in recs:
            if held != obj:
                return f"you are not carrying {obj}"
            return access(rec) or "choose an admissible action"
    elif match := _TREAT.match(command):
        obj, rec = match.groups()
        if obj in items and rec in recs:
            if held != obj:
                return f"you are not carrying {obj}"
            if here != recs[rec]:
                return f"go to {rec} first"
    elif match := _AT.match(command):
        verb, name = match.groups()
        if verb == "use" and name in items:
            where = state.where[items[name]]
            if where >= 0 and here != where:
                return f"go to {game.receptacles[where].name} first"
        elif name in recs:
            r = recs[name]
            if verb == "go to":
                return f"you are at {name}"
            if here != r:
                return f"go to {name} first"
            if verb in ("open", "close") and game.receptacles[r].openable:
                return f"{name} is {'open' if state.opened[r] else 'closed'}"
    return "choose an admissible action"
