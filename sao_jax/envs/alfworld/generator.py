"""Procedural ALFWorld games: `make_game(split, index, size=...)`, a pure function of its args.

Splits mirror ALFWorld: 3,553 train / 140 valid_seen / 134 valid_unseen games with ALFWorld's
exact per-task-type counts. A game draws a room type the task allows, an ALFRED scene of that
room (seen scenes for train/valid_seen, held-out scenes for valid_unseen), the scene's layout,
a target, and objects placed where their class fits. Targets never start solved and every game
is solvable by construction (tests run the expert on all of them).

`size="small"` rooms have 4-6 receptacles, one target instance (two for pick_two) and 1-3
distractors, for CPU-scale training; `size="full"` rooms resemble ALFRED's (6-33 receptacles,
8-20 distractors).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import sao_jax.envs.alfworld.classes as classes
from sao_jax.envs.alfworld.game import (
    APPLIANCE,
    CLEAN,
    COOL,
    HEAT,
    LOOK,
    PICK,
    TASK_TEMPLATES,
    TASK_TYPES,
    TWO,
    Game,
    ItemSpec,
    Task,
    assemble_game,
)
from sao_jax.envs.alfworld.rooms import (
    BATHROOM,
    BEDROOM,
    KITCHEN,
    LIVING_ROOM,
    ROOM_SPECS,
    ROOM_TYPES,
    scene_numbers,
)
from sao_jax.envs.rng import StableRng

SIZES = ("full", "small")
# ALFWorld's games per task type (pick, look, clean, heat, cool, two) in each split.
TASK_COUNTS: dict[str, dict[str, int]] = {
    "train": dict(zip(TASK_TYPES, (790, 308, 650, 459, 533, 813), strict=True)),
    "valid_seen": dict(zip(TASK_TYPES, (35, 13, 27, 16, 25, 24), strict=True)),
    "valid_unseen": dict(zip(TASK_TYPES, (24, 18, 31, 23, 21, 17), strict=True)),
}
SPLITS = {split: sum(counts.values()) for split, counts in TASK_COUNTS.items()}
VALID_ROOMS = {
    PICK: ROOM_TYPES,
    TWO: ROOM_TYPES,
    LOOK: (LIVING_ROOM, BEDROOM),
    CLEAN: (KITCHEN, BATHROOM),
    HEAT: (KITCHEN,),
    COOL: (KITCHEN,),
}
_MAX_LAYOUT_DRAWS = 10_000


@dataclasses.dataclass(frozen=True)
class Layout:
    """A scene's fixed furniture: receptacle classes in numbering order, lamps, object pool."""

    room: str
    scene: int
    receptacles: tuple[str, ...]
    lamps: tuple[tuple[str, int], ...]  # (lamp class, index of the receptacle it stands on)
    objects: tuple[str, ...]  # distractor classes this scene uses

    @property
    def key(self) -> tuple:
        """What makes two layouts the same floor plan."""
        return (self.receptacles, self.lamps)


def check_game_args(split: str, index: int, size: str) -> None:
    """Raise a ValueError / IndexError naming the bad argument and the accepted values."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLITS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    if not isinstance(index, int) or not 0 <= index < SPLITS[split]:
        raise IndexError(
            f"{split} has {SPLITS[split]} games (0..{SPLITS[split] - 1}), got {index!r}"
        )


@functools.lru_cache(maxsize=16384)
def make_game(split: str, index: int, *, size: str = "full") -> Game:
    """The game `index` of `split`; identical in every process (stable hashing, no `hash()`)."""
    check_game_args(split, index, size)
    task_type = task_type_sequence(split)[index]
    rng = StableRng("game", split, index, size)
    room = rng.choice(VALID_ROOMS[task_type])
    scenes = rng.shuffled(scene_numbers(room, unseen=split == "valid_unseen"))
    for scene in scenes:
        layout = scene_layouts(room, size)[scene]
        target = _choose_target(task_type, layout, rng)
        if target is not None:
            return _populate(split, index, size, layout, task_type, *target, rng)
    raise RuntimeError(f"no {task_type} target fits any {room} scene ({split}/{index}, {size})")


@functools.cache
def task_type_sequence(split: str) -> tuple[str, ...]:
    """Task type of every game of a split: ALFWorld's exact counts in a fixed random order."""
    types = [t for t, count in TASK_COUNTS[split].items() for _ in range(count)]
    return tuple(StableRng("task_types", split).shuffled(types))


@functools.cache
def scene_layouts(room: str, size: str) -> dict[int, Layout]:
    """Layout of every ALFRED scene of a room type; held-out scenes differ from all seen ones."""
    layouts: dict[int, Layout] = {}
    for unseen in (False, True):
        seen_keys = {layout.key for layout in layouts.values()}
        for scene in scene_numbers(room, unseen=unseen):
            for attempt in range(_MAX_LAYOUT_DRAWS):
                layout = _draw_layout(room, scene, size, attempt)
                if not (unseen and layout.key in seen_keys):
                    break
            else:
                raise RuntimeError(f"cannot draw an unseen {size} {room} layout for scene {scene}")
            layouts[scene] = layout
    return layouts


def _draw_layout(room: str, scene: int, size: str, attempt: int) -> Layout:
    spec = ROOM_SPECS[room]
    rng = StableRng("layout", room, scene, size, attempt)
    if size == "full":
        receptacles = [
            cls for cls, low, high in spec.full_receptacles for _ in range(rng.between(low, high))
        ]
        lamp_classes = rng.sample(spec.lamps, rng.between(1, len(spec.lamps))) if spec.lamps else []
        objects = rng.sample(
            spec.objects, rng.between((len(spec.objects) * 2 + 2) // 3, len(spec.objects))
        )
    else:
        total = rng.between(4, 6)
        optional = rng.sample(spec.small_optional, total - len(spec.required))
        receptacles = sorted([*spec.required, *optional])
        lamp_classes = [rng.choice(spec.lamps)] if spec.lamps else []
        objects = rng.sample(spec.objects, min(6, len(spec.objects)))
    holders = [r for r, cls in enumerate(receptacles) if cls in classes.LAMP_HOLDERS]
    lamps = tuple((lamp, rng.choice(holders)) for lamp in sorted(lamp_classes))
    return Layout(room, scene, tuple(receptacles), lamps, tuple(sorted(objects)))


def _choose_target(task_type: str, layout: Layout, rng: StableRng) -> tuple[str, str] | None:
    """(object class, receptacle or lamp class) for the task in this layout, or None."""
    present = sorted(set(layout.receptacles))
    appliance = APPLIANCE.get(task_type)
    if appliance is not None and appliance not in present:
        return None
    affordance = {CLEAN: classes.CLEANABLE, HEAT: classes.HEATABLE, COOL: classes.COOLABLE}
    options: list[tuple[str, list[str]]] = []
    for obj in ROOM_SPECS[layout.room].objects:
        if task_type in affordance and obj not in affordance[task_type]:
            continue
        homes = [rc for rc in present if classes.can_contain(rc, obj)]
        if task_type == LOOK:
            goals = sorted({lamp for lamp, _ in layout.lamps}) if homes else []
        else:
            # A target class the object can go to, with another class it can start in.
            goals = [rc for rc in homes if rc != appliance and any(h != rc for h in homes)]
        if goals:
            options.append((obj, goals))
    if not options:
        return None
    obj, goals = rng.choice(options)
    return obj, rng.choice(goals)


def _populate(
    split: str,
    index: int,
    size: str,
    layout: Layout,
    task_type: str,
    obj: str,
    goal: str,
    rng: StableRng,
) -> Game:
    template = rng.choice(TASK_TEMPLATES[task_type])
    sentence = template.format(obj=classes.display_class(obj), recep=classes.display_class(goal))
    task = Task(task_type, obj, goal, sentence)
    recs = layout.receptacles

    def homes(cls: str, *, exclude: str | None = None) -> list[int]:
        return [r for r, rc in enumerate(recs) if rc != exclude and classes.can_contain(rc, cls)]

    small = size == "small"
    n_targets = (
        (2 if small else rng.between(2, 4))
        if task_type == TWO
        else (1 if small else rng.between(1, 3))
    )
    # Targets start outside every receptacle of the goal class, so no game starts solved.
    target_homes = homes(obj, exclude=None if task_type == LOOK else goal)
    specs = [ItemSpec(obj, rng.choice(target_homes)) for _ in range(n_targets)]
    pool = [cls for cls in layout.objects if cls != obj and homes(cls)]
    n_distractors = (rng.between(1, 3) if small else rng.between(8, 20)) if pool else 0
    for _ in range(n_distractors):
        cls = rng.choice(pool)
        specs.append(ItemSpec(cls, rng.choice(homes(cls))))
    specs.extend(ItemSpec(lamp, holder) for lamp, holder in layout.lamps)
    # Like ALFWorld, whatever starts in a fridge starts cold.
    specs = [
        ItemSpec(s.cls, s.start, recs[s.start] == classes.FRIDGE and s.cls in classes.COOLABLE)
        for s in specs
    ]
    counts = Counter(s.cls for s in specs)
    numbers_left = {cls: rng.shuffled(range(1, n + 1)) for cls, n in sorted(counts.items())}
    item_numbers = [numbers_left[s.cls].pop() for s in specs]
    return assemble_game(
        split=split,
        index=index,
        size=size,
        room=layout.room,
        scene=layout.scene,
        task=task,
        receptacle_classes=recs,
        location_numbers=rng.shuffled(range(1, len(recs) + 1)),
        items=specs,
        item_numbers=item_numbers,
    )
