"""An expert that acts only on what the agent has seen: the opening text and the transcript.

`search_expert_action(opening, steps)` re-reads the whole episode at every call (the room's
receptacle list and the task from the opening, then each command with the observation it got)
and never looks at the engine's hidden state, so a policy that sees the same texts can imitate
it, from any state a policy reaches (after inadmissible commands, holding a wrong object, with
receptacles left open, ...). Like ALFWorld's handcoded expert it:

- searches receptacles in a fixed order the policy also sees: those whose class can hold the
  target class (ALFRED's receptacle-object table, `classes.can_contain`) first, then the task's
  goal receptacles (targets never start in one), then the rest; within a group in the order of
  the admissible commands (names sorted A-Z); it goes to each one not seen inside yet and opens
  it if closed;
- remembers every object it saw and where (the world only changes through the agent's own
  commands, so what it saw stays true until it moves the object itself);
- takes a matching object (the one at the first receptacle of the search order), puts a wrong
  held object down (at the current receptacle if it takes it, else where it came from), treats
  the object at the task's appliance (the first sinkbasin / microwave / fridge) unless the
  transcript says it already has the state, and delivers it to the first goal receptacle (for
  pick_two: the one that already holds a matching object, if any); for look_at_obj_in_light it
  carries the object to the first lamp of the task's class it knows of (searching lamp holders
  first) and turns it on.

Sub-step success is read from the observations ("Nothing happens." means the command did not
run; any other text means it did). Every command returned is admissible in the current state.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import sao_jax.envs.alfworld.classes as classes
import sao_jax.envs.alfworld.texts as texts
from sao_jax.envs.alfworld.game import APPLIANCE, COOL, HEAT, LOOK, TASK_TEMPLATES, TWO

_DISPLAY_TO_CLASS = {
    classes.display_class(c): c for c in classes.RECEPTACLE_CLASSES | classes.OBJECT_CLASSES
}
_ROOM = re.compile(r"Looking quickly around you, you see (.*?)\.(?:\n|$)")
_TASK = re.compile(r"Your task is to: (.*?)\.?\s*$")
_OPEN_VIEW = re.compile(r"The (\w+ \d+) is open\. In it, you see (.*?)\.(?: |$)")
_SURFACE_VIEW = re.compile(r"On the (\w+ \d+), you see (.*?)\.(?: |$)")
_CLOSED_VIEW = re.compile(r"The (\w+ \d+) is closed\.")
_EXAMINED = re.compile(r"^This is an? (hot and clean|cool and clean|hot|clean|cold) (\w+ \d+)\.$")
_TEMPLATES = [
    (task_type, re.compile("^" + t.format(obj="(?P<obj>\\w+)", recep="(?P<recep>\\w+)") + "$"))
    for task_type, pair in TASK_TEMPLATES.items()
    for t in pair
]
MEMORY_PREFIX = "Checked so far:"
_TREATMENT_STATE = {"clean": "clean", "heat": "hot", "cool": "cool"}


def class_of(name: str) -> str:
    """ALFRED class of a displayed instance name ("butterknife 2" -> "ButterKnife"); a word
    outside our class table stays as it is (it then fits nowhere in the priors)."""
    word = name.rsplit(" ", 1)[0]
    return _DISPLAY_TO_CLASS.get(word, word)


def _fits(receptacle_cls: str, object_cls: str) -> bool:
    return object_cls in classes.CAN_CONTAIN.get(receptacle_cls, ())


def parse_listing(text: str) -> list[str]:
    """Inverse of `texts.listing` ("a mug 1, and a cup 2" -> ["mug 1", "cup 2"])."""
    if text == "nothing":
        return []
    names = []
    for part in text.split(", "):
        part = part.removeprefix("and ").removeprefix("a ")
        names.append(part)
    return names


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What the task sentence asks: type, object class, and goal receptacle (or lamp) class."""

    task_type: str
    object_cls: str
    receptacle_cls: str

    @classmethod
    def parse(cls, sentence: str) -> TaskSpec:
        sentence = sentence.strip().removesuffix(".")
        for task_type, pattern in _TEMPLATES:
            match = pattern.match(sentence)
            if match and match["obj"] in _DISPLAY_TO_CLASS and match["recep"] in _DISPLAY_TO_CLASS:
                return cls(
                    task_type, _DISPLAY_TO_CLASS[match["obj"]], _DISPLAY_TO_CLASS[match["recep"]]
                )
        raise ValueError(f"not an ALFWorld task sentence: {sentence!r}")


@dataclasses.dataclass
class Belief:
    """What the transcript says about the world (exact for whatever was seen).

    receptacles: every receptacle, in the opening's order.
    location / held: where the agent stands (None: middle of the room) / what it holds.
    held_from: the receptacle the held object was taken from.
    contents: receptacle -> objects in it, for receptacles seen inside (or filled by the agent).
    opened: receptacle -> open, for openable receptacles whose door state is known.
    states: object -> {"clean", "hot", "cool"} the transcript gave it.
    lamps_on: lamps turned on.
    """

    receptacles: list[str]
    location: str | None = None
    held: str | None = None
    held_from: str | None = None
    contents: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    opened: dict[str, bool] = dataclasses.field(default_factory=dict)
    states: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    lamps_on: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def of(cls, opening: str, steps: Sequence[tuple[str, str]]) -> Belief:
        match = _ROOM.search(opening)
        if match is None:
            raise ValueError("the opening observation has no receptacle list")
        belief = cls(parse_listing(match.group(1)))
        for command, observation in steps:
            belief.update(command.strip(), observation.strip())
        return belief

    def accessible(self, receptacle: str) -> bool:
        """Whether objects can be taken from / put into `receptacle` (known to be not closed)."""
        return not _openable(receptacle) or self.opened.get(receptacle, False)

    def where(self, item: str) -> str | None:
        for receptacle, items in self.contents.items():
            if item in items:
                return receptacle
        return None

    def _see(self, observation: str) -> None:
        for match in _OPEN_VIEW.finditer(observation):
            self.opened[match.group(1)] = True
            self.contents[match.group(1)] = parse_listing(match.group(2))
        for match in _SURFACE_VIEW.finditer(observation):
            self.contents[match.group(1)] = parse_listing(match.group(2))
        for match in _CLOSED_VIEW.finditer(observation):
            self.opened[match.group(1)] = False

    def update(self, command: str, observation: str) -> None:
        """Apply one step: the command ran unless the engine said "Nothing happens."."""
        if observation == texts.NOTHING_HAPPENS:
            return
        words = command.split(" ")
        if command.startswith("go to "):
            self.location = command[len("go to ") :]
            self._see(observation)
        elif words[0] == "open":
            self.opened[command[len("open ") :]] = True
            self._see(observation)
        elif words[0] == "close":
            self.opened[command[len("close ") :]] = False
        elif words[0] == "take" and " from " in command:
            item, receptacle = command[len("take ") :].split(" from ", 1)
            if item in self.contents.get(receptacle, []):
                self.contents[receptacle].remove(item)
            self.held, self.held_from = item, receptacle
        elif words[0] in ("move", "put") and self.held is not None:
            receptacle = _put_target(command)
            self.contents.setdefault(receptacle, []).append(self.held)
            self.held, self.held_from = None, None
        elif words[0] in _TREATMENT_STATE and " with " in command:
            item = command[len(words[0]) + 1 :].split(" with ", 1)[0]
            state = _TREATMENT_STATE[words[0]]
            states = self.states.setdefault(item, set())
            if state == "hot":
                states.discard("cool")
            if state == "cool":
                states.discard("hot")
            states.add(state)
        elif words[0] == "use":
            self.lamps_on.add(command[len("use ") :])
        elif words[0] == "examine":
            match = _EXAMINED.match(observation)
            if match:
                kinds = match.group(1).replace("cold", "cool").split(" and ")
                self.states[match.group(2)] = set(kinds)
            elif observation.startswith("There's nothing special about "):
                self.states[command[len("examine ") :]] = set()
            else:
                self._see(observation)


def _openable(receptacle: str) -> bool:
    return class_of(receptacle) in classes.OPENABLE


def _put_target(command: str) -> str:
    if command.startswith("move "):
        return command.split(" to ", 1)[1]
    return command.split(" in/on ", 1)[1]


def search_order(receptacles: Sequence[str], task: TaskSpec) -> list[str]:
    """The order receptacles are searched for the task's object: those whose class can hold it
    (not of the goal class), then the goal class, then the rest; A-Z within each group."""

    def group(name: str) -> int:
        cls = class_of(name)
        if cls == task.receptacle_cls:
            return 1
        return 0 if _fits(cls, task.object_cls) else 2

    return sorted(receptacles, key=lambda name: (group(name), name))


def lamp_order(receptacles: Sequence[str]) -> list[str]:
    """The order receptacles are searched for a lamp: lamp holders first, A-Z within a group."""
    return sorted(receptacles, key=lambda r: (class_of(r) not in classes.LAMP_HOLDERS, r))


class _Decide:
    """The next command from a belief (each helper returns the first command of a sub-plan)."""

    def __init__(self, task: TaskSpec, belief: Belief, phrasing: str):
        self.task, self.belief, self.phrasing = task, belief, phrasing

    def first_of(self, cls: str) -> str | None:
        return next(
            (r for r in sorted(self.belief.receptacles) if class_of(r) == cls),
            None,
        )

    def go(self, receptacle: str) -> str | None:
        """`go to` unless already there."""
        return None if self.belief.location == receptacle else f"go to {receptacle}"

    def access(self, receptacle: str) -> str | None:
        """Stand at `receptacle` with it open (None: already so)."""
        step = self.go(receptacle)
        if step is None and not self.belief.accessible(receptacle):
            step = f"open {receptacle}"
        return step

    def put(self, receptacle: str) -> str:
        step = self.access(receptacle)
        return step or texts.put_command(self.belief.held, receptacle, self.phrasing)

    def take(self, item: str) -> str:
        receptacle = self.belief.where(item)
        return self.access(receptacle) or f"take {item} from {receptacle}"

    def search(self, order: Sequence[str]) -> str:
        """Go to / open the next receptacle of `order` not yet seen inside."""
        belief = self.belief
        for receptacle in order:
            if receptacle not in belief.contents:
                return self.access(receptacle) or "look"
        return "look"  # everything seen: nothing left to find (does not happen in our games)

    def put_away(self) -> str:
        """Put the held (wrong) object down: here if this receptacle takes it, else where it
        came from."""
        belief, held_cls = self.belief, class_of(self.belief.held)
        here = belief.location
        if here is not None and belief.accessible(here) and _fits(class_of(here), held_cls):
            return texts.put_command(belief.held, here, self.phrasing)
        # where it came from takes it (it lay there); without a record, the first that fits
        home = belief.held_from or next(
            (r for r in sorted(belief.receptacles) if _fits(class_of(r), held_cls)), None
        )
        return "inventory" if home is None else self.put(home)

    def is_target(self, item: str) -> bool:
        return class_of(item) == self.task.object_cls

    def known_targets(self, exclude: str | None = None) -> list[str]:
        """Target objects seen lying somewhere (not in `exclude`), by the search order."""
        found = []
        for receptacle in self.current_first(search_order(self.belief.receptacles, self.task)):
            if receptacle == exclude:
                continue
            found += [i for i in self.belief.contents.get(receptacle, []) if self.is_target(i)]
        return found

    def current_first(self, order: list[str]) -> list[str]:
        here = self.belief.location
        return ([here] if here in order else []) + [r for r in order if r != here]

    def fetch(self, exclude: str | None = None) -> str:
        """Take a target object: a known one, else search for one."""
        known = self.known_targets(exclude)
        if known:
            return self.take(known[0])
        order = [r for r in search_order(self.belief.receptacles, self.task) if r != exclude]
        return self.search(order)

    def needs_treatment(self, item: str) -> str | None:
        """The treatment verb `item` still needs, if any."""
        task_type = self.task.task_type
        if task_type not in APPLIANCE:
            return None
        state = {HEAT: "hot", COOL: "cool"}.get(task_type, "clean")
        if state in self.belief.states.get(item, set()):
            return None
        return {"hot": "heat", "cool": "cool", "clean": "clean"}[state]

    def single(self) -> str:
        belief = self.belief
        if belief.held is None:
            return self.fetch()
        verb = self.needs_treatment(belief.held)
        if verb is not None:
            appliance = self.first_of(APPLIANCE[self.task.task_type])
            return self.go(appliance) or texts.treat_command(verb, belief.held, appliance)
        return self.put(self.first_of(self.task.receptacle_cls))

    def two(self) -> str:
        belief = self.belief
        goals = [r for r in sorted(belief.receptacles) if class_of(r) == self.task.receptacle_cls]
        filled = [r for r in goals if any(self.is_target(i) for i in belief.contents.get(r, []))]
        anchor = filled[0] if filled else goals[0]
        if belief.held is not None:
            return self.put(anchor)
        return self.fetch(exclude=anchor)

    def look(self) -> str:
        belief = self.belief
        if belief.held is None:
            return self.fetch()
        lamps = [
            (r, i)
            for r in self.current_first(lamp_order(belief.receptacles))
            for i in belief.contents.get(r, [])
            if class_of(i) == self.task.receptacle_cls
        ]
        if not lamps:
            return self.search(lamp_order(belief.receptacles))
        receptacle, lamp = lamps[0]
        return self.go(receptacle) or f"use {lamp}"

    def action(self) -> str:
        belief = self.belief
        if belief.held is not None and not self.is_target(belief.held):
            return self.put_away()
        if self.task.task_type == LOOK:
            return self.look()
        if self.task.task_type == TWO:
            return self.two()
        return self.single()


def memory_line(opening: str, steps: Sequence[tuple[str, str]], *, task: str | None = None) -> str:
    """A compact reminder of the episode for a windowed prompt, from the transcript alone:
    the receptacles seen inside so far, in the search order, each with the task's objects
    (and, for look_at_obj_in_light, its lamps) seen in it now, e.g.
    "Checked so far: drawer 1, shelf 2 (mug 1), cabinet 1." ("nothing" before any)."""
    spec = TaskSpec.parse(_task_of(opening, task))
    belief = Belief.of(opening, steps)
    wanted = {spec.object_cls} | ({spec.receptacle_cls} if spec.task_type == LOOK else set())
    parts = []
    for receptacle in search_order(belief.receptacles, spec):
        if receptacle not in belief.contents:
            continue
        found = [i for i in belief.contents[receptacle] if class_of(i) in wanted]
        parts.append(f"{receptacle} ({', '.join(found)})" if found else receptacle)
    return f"{MEMORY_PREFIX} {', '.join(parts) if parts else 'nothing'}."


def _task_of(opening: str, task: str | None) -> str:
    if task is not None:
        return task
    match = _TASK.search(opening)
    if match is None:
        raise ValueError("the opening observation has no task line: pass task=")
    return match.group(1)


def search_expert_action(
    opening: str,
    steps: Sequence[tuple[str, str]],
    *,
    task: str | None = None,
    phrasing: str = "0.4.2",
    won: bool = False,
) -> str | None:
    """The observation-only expert's next command.

    Args:
      opening: the opening observation (the room's receptacle list and, unless `task` is given,
        the "Your task is to: ..." line).
      steps: every (command, observation) pair of the episode so far, oldest first.
      task: the task sentence, when the opening does not carry it.
      phrasing: the engine's phrasing ("0.4.2": `move O to R`; "0.3": `put O in/on R`).
      won: the episode is won (returns None).
    """
    texts.check_phrasing(phrasing)
    if won:
        return None
    spec = TaskSpec.parse(_task_of(opening, task))
    return _Decide(spec, Belief.of(opening, steps), phrasing).action()
