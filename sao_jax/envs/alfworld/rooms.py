"""Room types: which receptacles and objects a room of each type holds, and ALFRED's scenes.

A *scene* (ALFRED floor plan number) fixes a room's layout; games are drawn on scenes. ALFRED
splits scenes: train and valid_seen games use scenes 7-30 of each room type, valid_unseen games
use scenes 1-6, so unseen games never share a layout with training games.
"""

from __future__ import annotations

import dataclasses

KITCHEN, LIVING_ROOM, BEDROOM, BATHROOM = "kitchen", "livingroom", "bedroom", "bathroom"
ROOM_TYPES = (KITCHEN, LIVING_ROOM, BEDROOM, BATHROOM)
_SCENE_OFFSET = {KITCHEN: 0, LIVING_ROOM: 200, BEDROOM: 300, BATHROOM: 400}
SEEN_SCENE_NUMBERS = range(7, 31)
UNSEEN_SCENE_NUMBERS = range(1, 7)


def scene_numbers(room: str, *, unseen: bool) -> tuple[int, ...]:
    """ALFRED scene numbers of a room type (e.g. bedrooms 307..330 seen, 301..306 unseen)."""
    numbers = UNSEEN_SCENE_NUMBERS if unseen else SEEN_SCENE_NUMBERS
    return tuple(_SCENE_OFFSET[room] + n for n in numbers)


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


@dataclasses.dataclass(frozen=True)
class RoomSpec:
    """What a room type may contain.

    full_receptacles: (class, min count, max count) for full-size layouts.
    required: receptacle classes every layout has (appliances the room's tasks need).
    small_optional: classes a small layout (4-6 receptacles in all) draws the rest from.
    objects: pickupable classes that occur in this room type.
    lamps: lamp classes that may stand in this room.
    """

    full_receptacles: tuple[tuple[str, int, int], ...]
    required: tuple[str, ...]
    small_optional: tuple[str, ...]
    objects: tuple[str, ...]
    lamps: tuple[str, ...] = ()


ROOM_SPECS: dict[str, RoomSpec] = {
    KITCHEN: RoomSpec(
        full_receptacles=(
            ("Cabinet", 4, 12),
            ("CoffeeMachine", 1, 1),
            ("CounterTop", 1, 3),
            ("DiningTable", 0, 1),
            ("Drawer", 2, 8),
            ("Fridge", 1, 1),
            ("GarbageCan", 1, 1),
            ("Microwave", 1, 1),
            ("Shelf", 0, 3),
            ("SinkBasin", 1, 2),
            ("StoveBurner", 2, 4),
            ("Toaster", 0, 1),
        ),
        required=("Fridge", "Microwave", "SinkBasin"),
        small_optional=("Cabinet", "CounterTop", "DiningTable", "Drawer", "GarbageCan", "Shelf"),
        objects=_words(
            "Apple Bowl Bread ButterKnife CellPhone CreditCard Cup DishSponge Egg Fork Glassbottle "
            "Kettle Knife Ladle Lettuce Mug Pan PepperShaker Plate Pot Potato SaltShaker "
            "SoapBottle Spatula Spoon Statue Tomato Vase WineBottle"
        ),
    ),
    LIVING_ROOM: RoomSpec(
        full_receptacles=(
            ("ArmChair", 0, 2),
            ("Cabinet", 0, 4),
            ("CoffeeTable", 1, 2),
            ("DiningTable", 0, 1),
            ("Drawer", 0, 6),
            ("Dresser", 0, 1),
            ("GarbageCan", 1, 1),
            ("Ottoman", 0, 1),
            ("Shelf", 0, 6),
            ("SideTable", 1, 3),
            ("Sofa", 1, 1),
            ("TVStand", 0, 1),
        ),
        required=("SideTable",),
        small_optional=("ArmChair", "Cabinet", "CoffeeTable", "Drawer", "Shelf", "Sofa"),
        objects=_words(
            "Book Bowl Box Candle CellPhone CreditCard KeyChain Laptop Newspaper Pillow Plate "
            "RemoteControl Statue TissueBox Vase Watch WateringCan"
        ),
        lamps=("DeskLamp", "FloorLamp"),
    ),
    BEDROOM: RoomSpec(
        full_receptacles=(
            ("ArmChair", 0, 1),
            ("Bed", 1, 1),
            ("Desk", 0, 1),
            ("Drawer", 1, 6),
            ("Dresser", 0, 1),
            ("GarbageCan", 1, 1),
            ("LaundryHamper", 0, 1),
            ("Safe", 0, 1),
            ("Shelf", 0, 6),
            ("SideTable", 1, 2),
        ),
        required=("Bed", "SideTable"),
        small_optional=("Desk", "Drawer", "Dresser", "GarbageCan", "Safe", "Shelf"),
        objects=_words(
            "AlarmClock BaseballBat BasketBall Book Bowl Box CD Candle CellPhone Cloth CreditCard "
            "KeyChain Laptop Mug Pen Pencil Pillow Statue TennisRacket TissueBox Vase "
            "Watch"
        ),
        lamps=("DeskLamp",),
    ),
    BATHROOM: RoomSpec(
        full_receptacles=(
            ("BathtubBasin", 0, 1),
            ("Cabinet", 1, 4),
            ("CounterTop", 1, 1),
            ("Drawer", 0, 4),
            ("GarbageCan", 1, 1),
            ("HandTowelHolder", 0, 2),
            ("Shelf", 0, 2),
            ("SinkBasin", 1, 2),
            ("Toilet", 1, 1),
            ("ToiletPaperHanger", 1, 1),
            ("TowelHolder", 0, 2),
        ),
        required=("SinkBasin",),
        small_optional=("Cabinet", "CounterTop", "Drawer", "GarbageCan", "Shelf", "Toilet"),
        objects=_words(
            "Candle Cloth DishSponge HandTowel Plunger SoapBar SoapBottle SprayBottle TissueBox "
            "ToiletPaper Towel"
        ),
    ),
}
