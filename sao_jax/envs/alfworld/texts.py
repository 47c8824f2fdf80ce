"""Every text the engine prints, as pure functions of names and flags (alfworld 0.4.2 grammar).

`phrasing="0.3"` switches to alfworld 0.3.x wording, which many published prompts use:
`put O in/on R` instead of `move O to R`, and "You arrive at loc N." on arrival.
"""

from __future__ import annotations

from collections.abc import Sequence

PHRASINGS = ("0.4.2", "0.3")

NOTHING_HAPPENS = "Nothing happens."
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
HELP = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)


def check_phrasing(phrasing: str) -> str:
    """Return `phrasing` or raise a ValueError that lists the supported ones."""
    if phrasing not in PHRASINGS:
        raise ValueError(f"unknown phrasing {phrasing!r}; expected one of {PHRASINGS}")
    return phrasing


def listing(names: Sequence[str]) -> str:
    """ "a x" items joined by ", " with ", and " before the last; "nothing" when empty."""
    if not names:
        return "nothing"
    if len(names) == 1:
        return f"a {names[0]}"
    return ", ".join(f"a {name}" for name in names[:-1]) + f", and a {names[-1]}"


def receptacle_view(name: str, openable: bool, opened: bool, contents: Sequence[str]) -> str:
    """What `examine R` shows, and what arriving at / opening R appends."""
    if openable and opened:
        return f"The {name} is open. In it, you see {listing(contents)}."
    if openable:
        return f"The {name} is closed."
    return f"On the {name}, you see {listing(contents)}."


def look_around(receptacles: Sequence[str]) -> str:
    """The view from the middle of the room (the opening lists every receptacle; a `look`
    from there lists none, as in the real engine)."""
    return f"You are in the middle of a room. Looking quickly around you, you see {listing(receptacles)}."


def look_at(receptacle: str) -> str:
    """`look` while at a receptacle (nothing ever lies on the floor next to it)."""
    return f"You are facing the {receptacle}. Next to it, you see nothing."


def intro(receptacles: Sequence[str], task_sentence: str) -> str:
    """The opening observation."""
    return f"{WELCOME}\n\n{look_around(receptacles)}\n\nYour task is to: {task_sentence}."


def arrive(name: str, location_number: int, view: str, phrasing: str) -> str:
    """Feedback of `go to R`."""
    where = f"loc {location_number}" if phrasing == "0.3" else name
    return f"You arrive at {where}. {view}"


def put_command(item: str, receptacle: str, phrasing: str) -> str:
    """The command that puts the held object into a receptacle."""
    if phrasing == "0.3":
        return f"put {item} in/on {receptacle}"
    return f"move {item} to {receptacle}"


def put_feedback(item: str, receptacle: str, phrasing: str) -> str:
    """Feedback of the put command."""
    if phrasing == "0.3":
        return f"You put the {item} in/on the {receptacle}."
    return f"You move the {item} to the {receptacle}."


def opened(receptacle: str, view: str) -> str:
    """Feedback of `open R`."""
    return f"You open the {receptacle}. {view}"


def closed(receptacle: str) -> str:
    """Feedback of `close R`."""
    return f"You close the {receptacle}."


def picked_up(item: str, receptacle: str) -> str:
    """Feedback of `take O from R`."""
    return f"You pick up the {item} from the {receptacle}."


def treat_command(verb: str, item: str, appliance: str) -> str:
    """`clean` / `heat` / `cool` command."""
    return f"{verb} {item} with {appliance}"


def treated(verb: str, item: str, appliance: str) -> str:
    """Feedback of `clean` / `heat` / `cool O with R`."""
    return f"You {verb} the {item} using the {appliance}."


def turned_on(lamp: str) -> str:
    """Feedback of `use L` (the grammar says "turn on" however often the lamp is used)."""
    return f"You turn on the {lamp}."


def inventory(held: str | None) -> str:
    """Feedback of `inventory`."""
    return "You are not carrying anything." if held is None else f"You are carrying: a {held}."


def examine_item(name: str, clean: bool, hot: bool, cool: bool) -> str:
    """Feedback of `examine O` for a held object (first matching rule of the grammar)."""
    if clean and hot:
        return f"This is a hot and clean {name}."
    if clean and cool:
        return f"This is a cool and clean {name}."
    if hot:
        return f"This is a hot {name}."
    if clean:
        return f"This is a clean {name}."
    if cool:
        return f"This is a cold {name}."
    return f"There's nothing special about {name}."
