"""A game: the room's receptacles, the objects in them, and the task (immutable data).

Entities carry the id they get in the exported PDDL problem. The real engine lower-cases ids,
numbers the instances of a class from the sorted ids (the first id gets the highest number) and
prints every list in sorted-id order; keeping receptacles and items sorted by that same id lets
our engine print lists in exactly the real engine's order.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import sao_jax.envs.alfworld.classes as classes

PICK, LOOK, CLEAN, HEAT, COOL, TWO = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
TASK_TYPES = (PICK, LOOK, CLEAN, HEAT, COOL, TWO)  # ALFWorld's numbering 1..6

# The two task sentences of each type (alfworld's goal library); {recep} is the lamp for LOOK.
TASK_TEMPLATES: dict[str, tuple[str, str]] = {
    PICK: ("put a {obj} in {recep}", "put some {obj} on {recep}"),
    LOOK: ("look at {obj} under the {recep}", "examine the {obj} with the {recep}"),
    CLEAN: ("put a clean {obj} in {recep}", "clean some {obj} and put it in {recep}"),
    HEAT: ("put a hot {obj} in {recep}", "heat some {obj} and put it in {recep}"),
    COOL: ("put a cool {obj} in {recep}", "cool some {obj} and put it in {recep}"),
    TWO: ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
}

# Which appliance each state-changing task needs.
APPLIANCE = {CLEAN: classes.SINK, HEAT: classes.MICROWAVE, COOL: classes.FRIDGE}


def export_id(cls: str, number: int, count: int) -> str:
    """PDDL id of instance `number` of `count` instances of `cls` (the demangler's inverse).

    The demangler names an id containing "basin" `<prefix>basin`, so sinks and bathtubs are
    spelled `Sink_bar_NN_bar_SinkBasin` to read "sinkbasin N".
    """
    rank = count - number + 1
    if cls == "SinkBasin":
        return f"Sink_bar_{rank:02d}_bar_SinkBasin"
    if cls == "BathtubBasin":
        return f"Bathtub_bar_{rank:02d}_bar_BathtubBasin"
    return f"{cls}_bar_{rank:02d}"


@dataclasses.dataclass(frozen=True)
class Receptacle:
    """A fixed receptacle ("cabinet 3"); `location_number` names its spot in 0.3.x texts."""

    cls: str
    number: int
    pddl_id: str
    location_number: int

    @property
    def name(self) -> str:
        return f"{classes.display_class(self.cls)} {self.number}"

    @property
    def openable(self) -> bool:
        return self.cls in classes.OPENABLE


@dataclasses.dataclass(frozen=True)
class Item:
    """An object instance ("mug 2") and where it starts (index into `Game.receptacles`)."""

    cls: str
    number: int
    pddl_id: str
    start: int
    start_cool: bool = False

    @property
    def name(self) -> str:
        return f"{classes.display_class(self.cls)} {self.number}"

    @property
    def is_lamp(self) -> bool:
        return self.cls in classes.LAMPS


@dataclasses.dataclass(frozen=True)
class Task:
    """What to achieve. `receptacle_cls` is the lamp class for look_at_obj_in_light."""

    task_type: str
    object_cls: str
    receptacle_cls: str
    sentence: str


@dataclasses.dataclass(frozen=True)
class Game:
    """One playable game. Receptacles and items are in the real engine's list order."""

    split: str
    index: int
    size: str
    room: str
    scene: int
    task: Task
    receptacles: tuple[Receptacle, ...]
    items: tuple[Item, ...]

    @property
    def game_id(self) -> str:
        return f"{self.split}/{self.size}/{self.index:04d}"


@dataclasses.dataclass(frozen=True)
class ItemSpec:
    """An object before numbering: its class, where it starts, whether it starts cold."""

    cls: str
    start: int
    start_cool: bool = False


def assemble_game(
    *,
    split: str,
    index: int,
    size: str,
    room: str,
    scene: int,
    task: Task,
    receptacle_classes: Sequence[str],
    location_numbers: Sequence[int],
    items: Sequence[ItemSpec],
    item_numbers: Sequence[int],
) -> Game:
    """Name every entity, then sort receptacles and items into the real engine's order.

    Args:
      receptacle_classes: [R] class of each receptacle; instances of a class are numbered
        1, 2, ... in the order given.
      location_numbers: [R] the number of each receptacle's location (a permutation of 1..R).
      items: [I] objects; `start` indexes `receptacle_classes`.
      item_numbers: [I] each item's number among the items of its class.
    """
    receptacle_counts = Counter(receptacle_classes)
    seen: Counter[str] = Counter()
    unsorted_receptacles = []
    for cls, location_number in zip(receptacle_classes, location_numbers, strict=True):
        seen[cls] += 1
        pddl_id = export_id(cls, seen[cls], receptacle_counts[cls])
        unsorted_receptacles.append(Receptacle(cls, seen[cls], pddl_id, location_number))
    order = sorted(
        range(len(unsorted_receptacles)), key=lambda r: _sort_key(unsorted_receptacles[r])
    )
    new_index = {old: new for new, old in enumerate(order)}
    receptacles = tuple(unsorted_receptacles[r] for r in order)

    item_counts = Counter(spec.cls for spec in items)
    numbered = [
        Item(
            spec.cls,
            number,
            export_id(spec.cls, number, item_counts[spec.cls]),
            new_index[spec.start],
            spec.start_cool,
        )
        for spec, number in zip(items, item_numbers, strict=True)
    ]
    numbered.sort(key=_sort_key)
    return Game(split, index, size, room, scene, task, receptacles, tuple(numbered))


def _sort_key(entity: Receptacle | Item) -> str:
    # The real engine lower-cases PDDL names before sorting them.
    return entity.pddl_id.lower()
