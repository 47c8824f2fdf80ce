"""ALFWorld experts: how well each plays, and how well a windowed policy could imitate it.

Plays the first `games` games of every split and size with each expert ("oracle": the planner
that reads the true world state; "search": the observation-only expert) and prints, per task
type and overall, the success rate and the mean steps per episode.

Imitability: a policy sees only its prompt (`render_prompt`, think off, the last h
observation/action pairs), so it can only imitate an expert whose action is a function of that
prompt. Over every demo turn, turns are grouped by the exact prompt text; "ambiguous" is the
share of turns whose prompt maps to more than one distinct expert action, "bayes" the best
accuracy any imitator could reach (sum over prompts of the most common action's count / turns).
Distinct games rarely show identical prompts, so the plain count finds little ambiguity for
either expert; `twins` adds, for each train game, that many copies with every object moved to
another receptacle that can hold it (same room, same task: the same opening prompt, a different
hidden world), which is where an expert that reads hidden state shows. The detour rows play
each of those worlds `replays` more times with a move replaced by a random admissible one with
probability `detour` (the expert still labels every turn), as in the states DAgger relabels:
equal windows then come after different earlier steps, which is where an expert that acts on
history the window does not show shows. The prompt's step numbers tell episodes apart (a
lookup table could use them, a policy hardly); "(no step numbers)" rows group prompts with them
blanked, a stricter count. "+memory" rows add the optional memory line (`memory_line`).

    python benchmarks/alfworld_experts.py [games=300] [twins=4] [detour=0.2] [replays=4]
"""

from __future__ import annotations

import dataclasses
import random
import re
import sys
from collections import Counter, defaultdict

from sao_jax.config_cli import parse_cli
from sao_jax.envs.alfworld import (
    SIZES,
    SPLITS,
    TASK_TYPES,
    AlfworldEnv,
    Game,
    classes,
    make_game,
    render_prompt,
)
from sao_jax.envs.alfworld.game import LOOK
from sao_jax.envs.alfworld.search_expert import memory_line

EXPERTS = ("oracle", "search")
SHORT = dict(zip(TASK_TYPES, ("pick", "look", "clean", "heat", "cool", "two"), strict=True))
_STEP_NUMBERS = re.compile(r"(taken |Observation |Action |at step )\d+")
# (history length, memory line) variants of the prompt
PROMPTS = ((1, False), (2, False), (1, True), (2, True))


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    games: first games of every split each expert plays per size.
    twins: copies of each train game with every object moved (same opening prompt).
    detour: probability that a move of a replayed world is a random admissible one.
    replays: replays of each world with detours.
    """

    games: int = 300
    twins: int = 4
    detour: float = 0.2
    replays: int = 4


def relocated(game: Game, rng: random.Random) -> Game:
    """`game` with every object (lamps included) moved to a random receptacle that can hold it
    (targets stay out of the goal class, as the generator keeps them)."""
    items = []
    for item in game.items:
        recs = list(enumerate(game.receptacles))
        if item.is_lamp:
            homes = [r for r, rec in recs if rec.cls in classes.LAMP_HOLDERS]
        else:
            homes = [
                r
                for r, rec in recs
                if classes.can_contain(rec.cls, item.cls)
                and not (
                    game.task.task_type != LOOK
                    and item.cls == game.task.object_cls
                    and rec.cls == game.task.receptacle_cls
                )
            ]
        start = rng.choice(homes)
        cold = game.receptacles[start].cls == classes.FRIDGE and item.cls in classes.COOLABLE
        items.append(dataclasses.replace(item, start=start, start_cool=cold))
    return dataclasses.replace(game, items=tuple(items))


def play(env: AlfworldEnv, game: Game, groups, rng: random.Random, detour: float):
    """One episode; every turn's prompts (per variant) are counted with the expert's action.
    Returns (won, steps)."""
    observation, info = env.reset(game=game)
    history: list[tuple[str, str]] = []
    while not env.done:
        action = env.expert_action()
        memory = memory_line(env.opening, env.transcript)
        for h, with_memory in PROMPTS:
            prompt = render_prompt(
                info["task"],
                observation,
                info["admissible_commands"],
                history=history,
                step=len(history),
                history_length=h,
                think=False,
                memory=memory if with_memory else None,
            )
            groups[h, with_memory, False][prompt][action] += 1
            groups[h, with_memory, True][_STEP_NUMBERS.sub(r"\1#", prompt)][action] += 1
        command = action
        if detour and rng.random() < detour:
            command = rng.choice(info["admissible_commands"])
        history.append((observation, command))
        observation, _, _, info = env.step(command)
    return env.engine.won, env.steps


def ambiguity(groups) -> dict:
    out = {}
    for key, by_prompt in groups.items():
        turns = sum(sum(c.values()) for c in by_prompt.values())
        ambiguous = sum(sum(c.values()) for c in by_prompt.values() if len(c) > 1)
        best = sum(max(c.values()) for c in by_prompt.values())
        out[key] = (ambiguous / turns, best / turns, turns)
    return out


def main(argv: list[str]) -> None:
    bench = parse_cli(argv, {"default": BenchConfig()}, prog="alfworld_experts.py", save=False)
    n_games, n_twins, detour, n_replays = bench.games, bench.twins, bench.detour, bench.replays
    print("## Success and steps (all splits, first games of each)\n")
    print("| expert | size | " + " | ".join(SHORT[t] for t in TASK_TYPES) + " | all |")
    print("|---|---|" + "---:|" * (len(TASK_TYPES) + 1))
    plain_groups = {}
    for expert in EXPERTS:
        for size in SIZES:
            groups = defaultdict(lambda: defaultdict(Counter))
            results: dict[str, list[tuple[bool, int]]] = defaultdict(list)
            for split in SPLITS:
                env = AlfworldEnv(split, size=size, expert=expert)
                for index in range(min(n_games, SPLITS[split])):
                    game = make_game(split, index, size=size)
                    result = play(env, game, groups, random.Random(index), 0.0)
                    results[game.task.task_type].append(result)
            plain_groups[expert, size] = groups
            cells = []
            for task_type in (*TASK_TYPES, "all"):
                rs = [r for t in TASK_TYPES for r in results[t]] if task_type == "all" else []
                rs = rs or results[task_type]
                if not rs:  # `games` too few to reach this task type in any split
                    cells.append("-")
                    continue
                won = sum(w for w, _ in rs) / len(rs)
                steps = sum(s for _, s in rs) / len(rs)
                cells.append(f"{won:.1%} / {steps:.1f}")
            print(f"| {expert} | {size} | " + " | ".join(cells) + " |")
    print(
        "\n(cells: success rate / mean steps per episode, 50-step episodes; -: no game of the type)\n"
    )
    columns = [(1, False, False), (2, False, False), (1, True, False), (1, False, True)]
    columns.append((1, True, True))
    names = ["h=1", "h=2", "h=1 +memory", "h=1, no step numbers", "h=1 +memory, no step numbers"]
    print("## Ambiguity of the expert given the policy's prompt\n")
    print("| expert | size | games | turns | " + " | ".join(names) + " |")
    print("|---|---|---|---:|" + "---:|" * len(names))
    for expert in EXPERTS:
        for size in SIZES:
            twin_groups = defaultdict(lambda: defaultdict(Counter))
            detour_groups = defaultdict(lambda: defaultdict(Counter))
            env = AlfworldEnv("train", size=size, expert=expert)
            rng = random.Random(0)
            for index in range(n_games):
                base = make_game("train", index, size=size)
                for twin in range(n_twins + 1):
                    game = base if twin == 0 else relocated(base, rng)
                    play(env, game, twin_groups, rng, 0.0)
                    for _ in range(n_replays if detour else 0):
                        play(env, game, detour_groups, rng, detour)
            rows = [("played", plain_groups[expert, size]), (f"+{n_twins} twins", twin_groups)]
            if detour:
                rows.append((f"+twins, {n_replays} x detour {detour}", detour_groups))
            for games, groups in rows:
                measured = ambiguity(groups)
                turns = measured[columns[0]][2]
                cells = [f"{measured[c][0]:.1%} ({measured[c][1]:.1%})" for c in columns]
                print(f"| {expert} | {size} | {games} | {turns:,} | " + " | ".join(cells) + " |")
    print("\n(cells: share of turns whose prompt has more than one expert action (the Bayes-")
    print("optimal imitation accuracy))")


if __name__ == "__main__":
    main(sys.argv[1:])
