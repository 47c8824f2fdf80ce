"""ALFRED object and receptacle classes, their affordances, and what fits where.

The affordance sets and the `CAN_CONTAIN` table restate ALFRED's class constants
(`alfworld.gen.constants`, VAL_ACTION_OBJECTS / VAL_RECEPTACLE_OBJECTS), restricted to the
classes our rooms use. Class names keep ALFRED's CamelCase; the text engine shows them
lower-cased (`display_class`).
"""

from __future__ import annotations


def _classes(names: str) -> frozenset[str]:
    return frozenset(names.split())


OPENABLE = _classes("Fridge Cabinet Microwave Drawer Safe")
HEATABLE = _classes("Apple Bread Cup Egg Mug Plate Potato Tomato")
COOLABLE = HEATABLE | _classes("Bowl Lettuce Pan Pot WineBottle")
CLEANABLE = _classes(
    "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Kettle Knife Ladle Lettuce Mug Pan "
    "Plate Pot Potato SoapBar Spatula Spoon Tomato"
)
LAMPS = _classes("DeskLamp FloorLamp")
# Receptacles a lamp stands on; lamps are toggleable objects that cannot be picked up.
LAMP_HOLDERS = _classes("Desk Dresser SideTable")

# Appliances named by the state-changing commands.
SINK, MICROWAVE, FRIDGE = "SinkBasin", "Microwave", "Fridge"

# Everything ALFRED lets stand on a table-like surface (counter, dining/coffee/side table).
_SURFACE = _classes(
    "AlarmClock Apple BaseballBat BasketBall Book Bowl Box Bread ButterKnife CD Candle CellPhone "
    "Cloth CreditCard Cup DishSponge Egg Fork Glassbottle HandTowel Kettle KeyChain Knife Ladle "
    "Laptop Lettuce Mug Newspaper Pan Pen Pencil PepperShaker Plate Pot Potato RemoteControl "
    "SaltShaker SoapBar SoapBottle Spatula Spoon SprayBottle Statue TennisRacket TissueBox "
    "ToiletPaper Tomato Vase Watch WateringCan WineBottle"
)
_SEAT = _classes(
    "BasketBall Book Box CellPhone Cloth CreditCard KeyChain Laptop Newspaper Pillow RemoteControl"
)
_DRESSER = _classes(
    "AlarmClock BasketBall Book Bowl Box CD Candle CellPhone Cloth CreditCard Cup Glassbottle "
    "KeyChain Laptop Mug Newspaper Pen Pencil Plate RemoteControl SprayBottle Statue "
    "TennisRacket TissueBox ToiletPaper Vase Watch WateringCan WineBottle"
)

CAN_CONTAIN: dict[str, frozenset[str]] = {
    "ArmChair": _SEAT,
    "BathtubBasin": _classes("Cloth DishSponge HandTowel SoapBar"),
    "Bed": _classes("BaseballBat BasketBall Book CellPhone Laptop Newspaper Pillow TennisRacket"),
    "Cabinet": _classes(
        "Book Bowl Box CD Candle Cloth Cup DishSponge Glassbottle HandTowel Kettle Ladle Mug "
        "Newspaper Pan PepperShaker Plate Plunger Pot SaltShaker SoapBar SoapBottle SprayBottle "
        "TissueBox ToiletPaper Vase WateringCan WineBottle"
    ),
    "CoffeeMachine": _classes("Mug"),
    "CoffeeTable": _SURFACE,
    "CounterTop": _SURFACE,
    "Desk": _DRESSER | {"SoapBottle"},
    "DiningTable": _SURFACE,
    "Drawer": _classes(
        "Book ButterKnife CD Candle CellPhone Cloth CreditCard DishSponge Fork HandTowel KeyChain "
        "Knife Ladle Newspaper Pen Pencil PepperShaker RemoteControl SaltShaker SoapBar "
        "SoapBottle Spatula Spoon SprayBottle TissueBox ToiletPaper Watch WateringCan"
    ),
    "Dresser": _DRESSER,
    "Fridge": _classes(
        "Apple Bowl Bread Cup Egg Glassbottle Lettuce Mug Pan Plate Pot Potato Tomato WineBottle"
    ),
    "GarbageCan": _classes(
        "Apple Bread CD Cloth DishSponge Egg HandTowel Lettuce Newspaper Pen Pencil Potato "
        "SoapBar SoapBottle SprayBottle TissueBox ToiletPaper Tomato WineBottle"
    ),
    "HandTowelHolder": _classes("HandTowel"),
    "LaundryHamper": _classes("Cloth"),
    "Microwave": _classes("Apple Bowl Bread Cup Egg Glassbottle Mug Plate Potato Tomato"),
    "Ottoman": _SEAT,
    "Safe": _classes("CD CellPhone CreditCard KeyChain Statue Vase Watch"),
    "Shelf": _classes(
        "AlarmClock Book Bowl Box CD Candle CellPhone Cloth CreditCard Cup DishSponge Glassbottle "
        "HandTowel Kettle KeyChain Mug Newspaper Pen Pencil PepperShaker Plate Pot RemoteControl "
        "SaltShaker SoapBar SoapBottle SprayBottle Statue TissueBox ToiletPaper Vase Watch "
        "WateringCan WineBottle"
    ),
    "SideTable": _SURFACE,
    "SinkBasin": _classes(
        "Apple Bowl ButterKnife Cloth Cup DishSponge Egg Fork Glassbottle HandTowel Kettle Knife "
        "Ladle Lettuce Mug Pan Plate Pot Potato SoapBar Spatula Spoon Tomato"
    ),
    "Sofa": _SEAT,
    "StoveBurner": _classes("Kettle Pan Pot"),
    "TVStand": _classes("TissueBox"),
    "Toaster": frozenset(),
    "Toilet": _classes(
        "Candle Cloth DishSponge HandTowel Newspaper SoapBar SoapBottle SprayBottle TissueBox "
        "ToiletPaper"
    ),
    "ToiletPaperHanger": _classes("ToiletPaper"),
    "TowelHolder": _classes("Towel"),
}

RECEPTACLE_CLASSES = frozenset(CAN_CONTAIN)
PICKUPABLE_CLASSES = frozenset().union(*CAN_CONTAIN.values())
OBJECT_CLASSES = PICKUPABLE_CLASSES | LAMPS


def display_class(cls: str) -> str:
    """ALFRED class -> the word the text engine prints ("ButterKnife" -> "butterknife")."""
    return cls.lower()


def can_contain(receptacle_cls: str, object_cls: str) -> bool:
    """Whether `move <object> to <receptacle>` is ever allowed for these two classes."""
    return object_cls in CAN_CONTAIN[receptacle_cls]
