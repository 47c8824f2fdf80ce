"""What a policy's greedy games are made of, and which of them change between two policies.

Each finished `Episode` becomes a `GameRecord`: its commands, which the room admitted, the
expert's command at every turn (`expert_commands`: the game replayed with the recorded
commands, so the expert answers in exactly the state the policy was in), and how a lost game
ended (`failure_mode`). `compare_games` lines two policies' records of the same games up: the
games one wins and the other loses, the turn where their play first differs, and which of the
two commands there was the expert's. All functions but `expert_commands` are pure.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence

from sao_jax.envs import env_from_task_spec
from sao_jax.rollout.episode import Episode

# How a game ended, judged on its last `TAIL` turns (a won game is "won"):
#   refused_loop  the same command, refused by the room ("Nothing happens."), every turn
#   refused       refused commands only, not all the same (alternating between them)
#   repeat        the same admitted command every turn (it changes nothing)
#   malformed     replies that parse to no command only
#   context       the prompt outgrew the context window
#   wander        anything else: admitted commands that do not finish the task in time
FAILURE_MODES = ("refused_loop", "refused", "repeat", "malformed", "context", "wander")
TAIL = 4


@dataclasses.dataclass(frozen=True)
class GameRecord:
    """One played game: `commands[i]` the command of turn i ("" for a malformed reply),
    `valid[i]` whether the reply parsed, `admissible[i]` whether the room admitted it,
    `expert[i]` the expert's command in the state of turn i (None once it has nothing to add,
    or when not computed); `mode` "won" or one of `FAILURE_MODES`."""

    game_index: int
    task_type: str
    won: bool
    commands: tuple[str, ...]
    valid: tuple[bool, ...]
    admissible: tuple[bool, ...]
    expert: tuple[str | None, ...]
    truncated_by: str | None
    mode: str

    @property
    def steps(self) -> int:
        return len(self.commands)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> GameRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        )


def failure_mode(
    won: bool,
    commands: Sequence[str],
    valid: Sequence[bool],
    admissible: Sequence[bool],
    truncated_by: str | None,
    tail: int = TAIL,
) -> str:
    """ "won", or how a lost game ended (`FAILURE_MODES`), from its last `tail` turns."""
    if won:
        return "won"
    if truncated_by == "context":
        return "context"
    last = range(max(0, len(commands) - tail), len(commands))
    if not last:
        return "wander"
    if not any(valid[i] for i in last):
        return "malformed"
    same = len({commands[i] for i in last}) == 1 and all(valid[i] for i in last)
    refused = all(valid[i] and not admissible[i] for i in last)
    if refused:
        return "refused_loop" if same else "refused"
    if same and all(admissible[i] for i in last):
        return "repeat"
    return "wander"


def expert_commands(episode: Episode, expert: str = "search") -> tuple[str | None, ...]:
    """The expert's command at each turn of `episode`, its game replayed from `task_spec()`
    with the recorded commands (the engine is deterministic: every turn is asked in exactly
    the state the policy saw). `expert`: "search" (from what the agent has seen) or "oracle"."""
    env = env_from_task_spec(episode.task_spec(), expert=expert)
    env.reset(episode.game_index)
    out: list[str | None] = []
    for turn in episode.turns:
        out.append(env.expert_action())
        _, _, done, _ = env.step(turn.command)
        if done:
            break
    return tuple(out) + (None,) * (len(episode.turns) - len(out))


def game_record(episode: Episode, expert: Sequence[str | None] | None = None) -> GameRecord:
    """`episode` as a `GameRecord` (`expert`: its `expert_commands`, or None to leave them
    out)."""
    commands = tuple(t.command for t in episode.turns)
    valid = tuple(bool(t.valid_reply) for t in episode.turns)
    admissible = tuple(bool(t.admissible) for t in episode.turns)
    if expert is not None and len(expert) != len(commands):
        raise ValueError(f"{len(expert)} expert commands for an episode of {len(commands)} turns")
    return GameRecord(
        game_index=episode.game_index,
        task_type=episode.task_type,
        won=bool(episode.won),
        commands=commands,
        valid=valid,
        admissible=admissible,
        expert=tuple(expert) if expert is not None else (None,) * len(commands),
        truncated_by=episode.truncated_by,
        mode=failure_mode(episode.won, commands, valid, admissible, episode.truncated_by),
    )


def summarize(records: Iterable[GameRecord]) -> dict:
    """Success, games by how they ended, mean steps, and the share of turns whose command is
    the expert's (over the turns where the expert had one)."""
    records = list(records)
    if not records:
        raise ValueError("no games to summarize")
    modes = Counter(r.mode for r in records)
    asked = [
        (c, e) for r in records for c, e in zip(r.commands, r.expert, strict=True) if e is not None
    ]
    return {
        "games": len(records),
        "success": sum(r.won for r in records) / len(records),
        "modes": {m: modes.get(m, 0) for m in ("won", *FAILURE_MODES)},
        "avg_steps": sum(r.steps for r in records) / len(records),
        "expert_agreement": sum(c == e for c, e in asked) / len(asked) if asked else None,
    }


@dataclasses.dataclass(frozen=True)
class Flip:
    """A game one policy wins and the other loses. `turn`: the first turn whose commands
    differ (play before it is identical); `before` / `after`: each policy's command there;
    `expert`: the expert's command in that (shared) state; `lost_mode`: how the losing side
    ended."""

    game_index: int
    task_type: str
    gained: bool  # True: `after` wins it, `before` lost it
    turn: int
    before: str | None
    after: str | None
    expert: str | None
    lost_mode: str

    @property
    def agrees(self) -> str:
        """Whose command at the divergence was the expert's: "winner", "loser", "both" or
        "neither" (or "unknown" without the expert's commands)."""
        if self.expert is None:
            return "unknown"
        winner, loser = (self.after, self.before) if self.gained else (self.before, self.after)
        hits = (winner == self.expert, loser == self.expert)
        return {(True, False): "winner", (False, True): "loser", (True, True): "both"}.get(
            hits, "neither"
        )


def _divergence(a: GameRecord, b: GameRecord) -> int:
    for i, (x, y) in enumerate(zip(a.commands, b.commands, strict=False)):
        if x != y:
            return i
    return min(a.steps, b.steps)


def _command_at(record: GameRecord, turn: int) -> str | None:
    return record.commands[turn] if turn < record.steps else None


def compare_games(before: Sequence[GameRecord], after: Sequence[GameRecord]) -> dict:
    """Two policies' records of the same games, game by game: counts of games both win, both
    lose, `after` gains and `after` loses, and of games both play command for command `alike`;
    the `Flip`s; and, over the flips, whose command at the divergence was the expert's and how
    the losing side ended."""
    by_game = {r.game_index: r for r in before}
    if len(by_game) != len(before) or {r.game_index for r in after} != set(by_game):
        raise ValueError("compare_games needs the same games, once each, on both sides")
    flips, both, alike = [], Counter(), 0
    for b in sorted(after, key=lambda r: r.game_index):
        a = by_game[b.game_index]
        alike += a.commands == b.commands
        if a.won == b.won:
            both[a.won] += 1
            continue
        turn = _divergence(a, b)
        expert = a.expert[turn] if turn < a.steps else (b.expert[turn] if turn < b.steps else None)
        flips.append(
            Flip(
                game_index=b.game_index,
                task_type=b.task_type,
                gained=b.won,
                turn=turn,
                before=_command_at(a, turn),
                after=_command_at(b, turn),
                expert=expert,
                lost_mode=a.mode if b.won else b.mode,
            )
        )
    gained = [f for f in flips if f.gained]
    lost = [f for f in flips if not f.gained]
    return {
        "both_won": both[True],
        "both_lost": both[False],
        "gained": len(gained),
        "lost": len(lost),
        "alike": alike,
        "flips": flips,
        "agrees": {
            side: dict(Counter(f.agrees for f in group))
            for side, group in (("gained", gained), ("lost", lost))
        },
        "lost_modes": {
            side: dict(Counter(f.lost_mode for f in group))
            for side, group in (("gained", gained), ("lost", lost))
        },
        "divergence_turn": {
            side: sorted(f.turn for f in group)
            for side, group in (("gained", gained), ("lost", lost))
        },
    }
