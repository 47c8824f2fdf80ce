"""Golden transcripts, one or more per task type, written by hand from the rules in
docs/alfworld.md (texts of alfworld 0.4.2 checked on the real engine), on hand-built
games. test_alfworld_golden.py plays them on our engine; test_alfworld_differential.py plays
the 0.4.2 ones on the real engine.

A step is (command, expected observation, won after it[, expected admissible commands]).
"""

from __future__ import annotations

import dataclasses

from sao_jax.envs.alfworld.game import (
    CLEAN,
    COOL,
    HEAT,
    LOOK,
    PICK,
    TWO,
    Game,
    ItemSpec,
    Task,
    assemble_game,
)
from sao_jax.envs.alfworld.texts import HELP


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    name: str
    game: Game
    opening: str
    steps: tuple
    phrasing: str = "0.4.2"


def build(task, sentence, receptacles, items, *, locations=None, room="kitchen") -> Game:
    """items: (class, receptacle index, number[, starts cold])."""
    return assemble_game(
        split="train",
        index=0,
        size="small",
        room=room,
        scene=7,
        task=Task(task[0], task[1], task[2], sentence),
        receptacle_classes=receptacles,
        location_numbers=locations or list(range(1, len(receptacles) + 1)),
        items=[ItemSpec(cls, start, *cold) for cls, start, _, *cold in items],
        item_numbers=[number for _, _, number, *_ in items],
    )


def opening(receptacles: str, task: str) -> str:
    return (
        "-= Welcome to TextWorld, ALFRED! =-\n\n"
        f"You are in the middle of a room. Looking quickly around you, you see {receptacles}.\n\n"
        f"Your task is to: {task}."
    )


CLEAN_GAME = dict(
    task=(CLEAN, "Mug", "Cabinet"),
    sentence="put a clean mug in cabinet",
    receptacles=["Cabinet", "Cabinet", "CounterTop", "Fridge", "SinkBasin"],
    items=[("Mug", 2, 1), ("Mug", 2, 2), ("Apple", 3, 1, True)],
)
CLEAN_OPENING = opening(
    "a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, and a sinkbasin 1",
    "put a clean mug in cabinet",
)

CASES = [
    GoldenCase(
        "clean",
        build(**CLEAN_GAME),
        CLEAN_OPENING,
        (
            ("look", "You are in the middle of a room. Looking quickly around you, you see nothing.", False,
             ["go to cabinet 1", "go to cabinet 2", "go to countertop 1", "go to fridge 1",
              "go to sinkbasin 1", "inventory", "look"]),
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 2, and a mug 1.", False,
             ["examine countertop 1", "go to cabinet 1", "go to cabinet 2", "go to fridge 1",
              "go to sinkbasin 1", "inventory", "look", "take mug 1 from countertop 1",
              "take mug 2 from countertop 1"]),
            ("take mug 1 from countertop 1", "You pick up the mug 1 from the countertop 1.", False),
            ("examine mug 1", "There's nothing special about mug 1.", False),
            ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed.", False,
             ["examine cabinet 1", "examine mug 1", "go to cabinet 2", "go to countertop 1",
              "go to fridge 1", "go to sinkbasin 1", "inventory", "look", "open cabinet 1"]),
            ("move mug 1 to cabinet 1", "Nothing happens.", False),
            ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see nothing.", False),
            ("move mug 1 to cabinet 1", "You move the mug 1 to the cabinet 1.", False),
            ("examine cabinet 1", "The cabinet 1 is open. In it, you see a mug 1.", False),
            ("take mug 1 from cabinet 1", "You pick up the mug 1 from the cabinet 1.", False),
            ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.", False,
             ["clean mug 1 with sinkbasin 1", "examine mug 1", "examine sinkbasin 1",
              "go to cabinet 1", "go to cabinet 2", "go to countertop 1", "go to fridge 1",
              "inventory", "look", "move mug 1 to sinkbasin 1"]),
            ("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the sinkbasin 1.", False),
            ("examine mug 1", "This is a clean mug 1.", False),
            ("inventory", "You are carrying: a mug 1.", False),
            ("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is open. In it, you see nothing.", False),
            ("move mug 1 to cabinet 1", "You move the mug 1 to the cabinet 1.", True),
        ),
    ),
    GoldenCase(
        "heat",
        build(
            task=(HEAT, "Potato", "DiningTable"),
            sentence="heat some potato and put it in diningtable",
            receptacles=["CounterTop", "DiningTable", "Fridge", "Microwave"],
            items=[("Potato", 2, 1, True), ("Egg", 0, 1)],
        ),
        opening(
            "a countertop 1, a diningtable 1, a fridge 1, and a microwave 1",
            "heat some potato and put it in diningtable",
        ),
        (
            ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.", False),
            ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a potato 1.", False),
            ("take potato 1 from fridge 1", "You pick up the potato 1 from the fridge 1.", False),
            ("examine potato 1", "This is a cold potato 1.", False),
            ("close fridge 1", "You close the fridge 1.", False),
            # The microwave heats with its door closed, but cannot take the potato while closed.
            ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed.", False,
             ["examine microwave 1", "examine potato 1", "go to countertop 1",
              "go to diningtable 1", "go to fridge 1", "heat potato 1 with microwave 1",
              "inventory", "look", "open microwave 1"]),
            ("heat potato 1 with microwave 1", "You heat the potato 1 using the microwave 1.", False),
            ("examine potato 1", "This is a hot potato 1.", False),
            ("go to diningtable 1", "You arrive at diningtable 1. On the diningtable 1, you see nothing.", False),
            ("move potato 1 to diningtable 1", "You move the potato 1 to the diningtable 1.", True),
        ),
    ),
    GoldenCase(
        "cool",
        build(
            task=(COOL, "Tomato", "CounterTop"),
            sentence="put a cool tomato in countertop",
            receptacles=["CounterTop", "Fridge", "Microwave", "SinkBasin"],
            items=[("Tomato", 3, 1)],
        ),
        opening(
            "a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1",
            "put a cool tomato in countertop",
        ),
        (
            ("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you see a tomato 1.", False),
            ("take tomato 1 from sinkbasin 1", "You pick up the tomato 1 from the sinkbasin 1.", False),
            ("clean tomato 1 with sinkbasin 1", "You clean the tomato 1 using the sinkbasin 1.", False),
            ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed.", False),
            ("heat tomato 1 with microwave 1", "You heat the tomato 1 using the microwave 1.", False),
            ("examine tomato 1", "This is a hot and clean tomato 1.", False),
            ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed.", False),
            ("cool tomato 1 with fridge 1", "You cool the tomato 1 using the fridge 1.", False),
            ("examine tomato 1", "This is a cool and clean tomato 1.", False),
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see nothing.", False),
            ("move tomato 1 to countertop 1", "You move the tomato 1 to the countertop 1.", True),
        ),
    ),
    GoldenCase(
        "look",
        build(
            task=(LOOK, "AlarmClock", "DeskLamp"),
            sentence="look at alarmclock under the desklamp",
            receptacles=["Bed", "Desk", "Drawer"],
            items=[("AlarmClock", 2, 1), ("Book", 0, 1), ("DeskLamp", 1, 1)],
            room="bedroom",
        ),
        opening("a bed 1, a desk 1, and a drawer 1", "look at alarmclock under the desklamp"),
        (
            ("inventory", "You are not carrying anything.", False),
            ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a desklamp 1.", False,
             ["examine desk 1", "go to bed 1", "go to drawer 1", "inventory", "look",
              "use desklamp 1"]),
            ("take desklamp 1 from desk 1", "Nothing happens.", False),
            ("use desklamp 1", "You turn on the desklamp 1.", False),
            ("use desklamp 1", "You turn on the desklamp 1.", False),
            ("look", "You are facing the desk 1. Next to it, you see nothing.", False),
            ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed.", False),
            ("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see a alarmclock 1.", False),
            ("take alarmclock 1 from drawer 1", "You pick up the alarmclock 1 from the drawer 1.", False),
            ("close drawer 1", "You close the drawer 1.", False),
            # Holding the object at a lamp that was turned on wins on arrival.
            ("go to desk 1", "You arrive at desk 1. On the desk 1, you see a desklamp 1.", True),
        ),
    ),
    GoldenCase(
        "pick",
        build(
            task=(PICK, "SoapBar", "Toilet"),
            sentence="put some soapbar on toilet",
            receptacles=["Cabinet", "CounterTop", "SinkBasin", "Toilet"],
            items=[("SoapBar", 0, 1), ("Cloth", 1, 1), ("SoapBottle", 1, 1)],
            room="bathroom",
        ),
        opening("a cabinet 1, a countertop 1, a sinkbasin 1, and a toilet 1", "put some soapbar on toilet"),
        (
            ("jump", "Nothing happens.", False),
            ("go to toilet 1", "You arrive at toilet 1. On the toilet 1, you see nothing.", False),
            ("go to toilet 1", "Nothing happens.", False),
            ("help", HELP, False),
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a cloth 1, and a soapbottle 1.", False),
            ("take cloth 1 from countertop 1", "You pick up the cloth 1 from the countertop 1.", False),
            ("take soapbottle 1 from countertop 1", "Nothing happens.", False),
            ("move cloth 1 to countertop 1", "You move the cloth 1 to the countertop 1.", False),
            ("  go to cabinet 1  ", "You arrive at cabinet 1. The cabinet 1 is closed.", False),
            ("open cabinet 1", "You open the cabinet 1. The cabinet 1 is open. In it, you see a soapbar 1.", False),
            ("Take soapbar 1 from cabinet 1", "Nothing happens.", False),
            ("take soapbar 1 from cabinet 1", "You pick up the soapbar 1 from the cabinet 1.", False),
            ("go to toilet 1", "You arrive at toilet 1. On the toilet 1, you see nothing.", False),
            ("move soapbar 1 to toilet 1", "You move the soapbar 1 to the toilet 1.", True),
        ),
    ),
    GoldenCase(
        "two",
        build(
            task=(TWO, "CellPhone", "Sofa"),
            sentence="find two cellphone and put them in sofa",
            receptacles=["CoffeeTable", "Drawer", "Sofa"],
            items=[("CellPhone", 0, 1), ("CellPhone", 1, 2), ("RemoteControl", 2, 1)],
            room="livingroom",
        ),
        opening("a coffeetable 1, a drawer 1, and a sofa 1", "find two cellphone and put them in sofa"),
        (
            ("go to coffeetable 1", "You arrive at coffeetable 1. On the coffeetable 1, you see a cellphone 1.", False),
            ("take cellphone 1 from coffeetable 1", "You pick up the cellphone 1 from the coffeetable 1.", False),
            ("go to sofa 1", "You arrive at sofa 1. On the sofa 1, you see a remotecontrol 1.", False),
            ("move cellphone 1 to sofa 1", "You move the cellphone 1 to the sofa 1.", False),
            ("take cellphone 1 from sofa 1", "You pick up the cellphone 1 from the sofa 1.", False),
            ("move cellphone 1 to sofa 1", "You move the cellphone 1 to the sofa 1.", False),
            ("examine sofa 1", "On the sofa 1, you see a cellphone 1, and a remotecontrol 1.", False),
            ("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed.", False),
            ("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see a cellphone 2.", False),
            ("take cellphone 2 from drawer 1", "You pick up the cellphone 2 from the drawer 1.", False),
            ("go to sofa 1", "You arrive at sofa 1. On the sofa 1, you see a cellphone 1, and a remotecontrol 1.", False),
            ("move cellphone 2 to sofa 1", "You move the cellphone 2 to the sofa 1.", True),
        ),
    ),
    GoldenCase(
        "lists",
        build(
            task=(PICK, "Mug", "Cabinet"),
            sentence="put a mug in cabinet",
            receptacles=["CounterTop", "Cabinet"],
            items=[("Mug", 0, 1), ("CD", 0, 1), ("Candle", 0, 1), ("Mug", 0, 3), ("Mug", 0, 2)],
        ),
        opening("a cabinet 1, and a countertop 1", "put a mug in cabinet"),
        (
            # By type A-Z (lower-cased: candle before cd), then number descending.
            ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a candle 1, a cd 1, a mug 3, a mug 2, and a mug 1.", False),
        ),
    ),
    GoldenCase(
        "clean, 0.3 phrasing",
        build(**CLEAN_GAME, locations=[4, 2, 5, 1, 3]),
        CLEAN_OPENING,
        (
            ("go to countertop 1", "You arrive at loc 5. On the countertop 1, you see a mug 2, and a mug 1.", False),
            ("take mug 2 from countertop 1", "You pick up the mug 2 from the countertop 1.", False),
            ("go to sinkbasin 1", "You arrive at loc 3. On the sinkbasin 1, you see nothing.", False,
             ["clean mug 2 with sinkbasin 1", "examine mug 2", "examine sinkbasin 1",
              "go to cabinet 1", "go to cabinet 2", "go to countertop 1", "go to fridge 1",
              "inventory", "look", "put mug 2 in/on sinkbasin 1"]),
            ("clean mug 2 with sinkbasin 1", "You clean the mug 2 using the sinkbasin 1.", False),
            ("go to cabinet 2", "You arrive at loc 2. The cabinet 2 is closed.", False),
            ("open cabinet 2", "You open the cabinet 2. The cabinet 2 is open. In it, you see nothing.", False),
            ("move mug 2 to cabinet 2", "Nothing happens.", False),
            ("put mug 2 in/on cabinet 2", "You put the mug 2 in/on the cabinet 2.", True),
        ),
        phrasing="0.3",
    ),
]  # fmt: skip
