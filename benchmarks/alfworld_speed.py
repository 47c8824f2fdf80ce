"""ALFWorld env speed: our pure-Python engine vs the real alfworld 0.4.2 engine, same games.

Each game is exported with `export_tw_pddl`, then both engines play identical command
sequences (random admissible commands, seeded; the real engine's commands are the ones our
engine chose, and the two observation streams are checked equal on the way). Measured per
engine, through the same env API (observation, reward, done, info with admissible commands):

- reset: start the game again (ours: build the engine from the cached `Game`; real: its
  `reset()`, which re-parses the PDDL problem with fast-downward), plus the real engine's
  one-off load;
- step: one command;
- also ours only: generating a game uncached, the expert's next action, and a batch of envs.

    python benchmarks/alfworld_speed.py [games=8] [steps=40] [size=full] [batch=64]
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import time

from sao_jax.config_cli import parse_cli
from sao_jax.envs.alfworld import (
    AlfworldEnv,
    BatchedAlfworldEnv,
    RealAlfworldEnv,
    export_tw_pddl,
    make_game,
)
from sao_jax.envs.alfworld.generator import task_type_sequence


@dataclasses.dataclass
class BenchConfig:
    """
    Attributes:
      games: train games played (cycling through the six task types).
      steps: random admissible commands per game.
      size: game size preset of the generator.
      batch: envs in the batched-env measurement.
    """

    games: int = 8
    steps: int = 40
    size: str = "full"
    batch: int = 64


def pick_games(count: int, size: str):
    """`count` train games cycling through the six task types."""
    sequence = task_type_sequence("train")
    types = list(dict.fromkeys(sequence))
    chosen, seen = [], {t: 0 for t in types}
    while len(chosen) < count:
        task_type = types[len(chosen) % len(types)]
        index = [i for i, t in enumerate(sequence) if t == task_type][seen[task_type]]
        seen[task_type] += 1
        chosen.append(make_game("train", index, size=size))
    return chosen


def play_ours(games, steps: int, seed: int):
    """Returns (reset seconds, step seconds, n steps, commands per game, observations)."""
    env = AlfworldEnv("train", max_steps=10_000)
    rng = random.Random(seed)
    reset_s = step_s = 0.0
    n_steps, scripts, observations = 0, [], []
    for game in games:
        t0 = time.perf_counter()
        observation, info = env.reset(game=game)
        reset_s += time.perf_counter() - t0
        script, seen = [], [observation]
        for _ in range(steps):
            command = rng.choice(info["admissible_commands"])
            t0 = time.perf_counter()
            observation, _, done, info = env.step(command)
            step_s += time.perf_counter() - t0
            script.append(command)
            seen.append(observation)
            n_steps += 1
            if done:
                break
        scripts.append(script)
        observations.append(seen)
    return reset_s, step_s, n_steps, scripts, observations


def play_real(paths, scripts, observations):
    """Returns (load seconds, reset seconds, step seconds, n steps); checks texts match ours."""
    load_s = reset_s = step_s = 0.0
    n_steps = 0
    for path, script, expected in zip(paths, scripts, observations, strict=True):
        t0 = time.perf_counter()
        env = RealAlfworldEnv(path, max_steps=10_000)
        env.reset()  # the first reset loads the game
        load_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        observation, _ = env.reset()
        reset_s += time.perf_counter() - t0
        assert observation == expected[0], "engines disagree on the opening"
        for command, want in zip(script, expected[1:], strict=True):
            t0 = time.perf_counter()
            observation, *_ = env.step(command)
            step_s += time.perf_counter() - t0
            assert observation == want, f"engines disagree after {command!r}"
            n_steps += 1
        env.close()
    return load_s, reset_s, step_s, n_steps


def ours_extras(size: str, batch: int, seed: int) -> dict[str, float]:
    """Game generation, expert and batched-env rates of our engine alone."""
    make_game.cache_clear()
    t0 = time.perf_counter()
    for index in range(500):
        make_game("train", index, size=size)
    generate = 500 / (time.perf_counter() - t0)

    env = AlfworldEnv("train", size=size)
    calls, t_expert = 0, 0.0
    for index in range(200):
        env.reset(index)
        while not env.done:
            t0 = time.perf_counter()
            command = env.expert_action()
            t_expert += time.perf_counter() - t0
            calls += 1
            env.step(command)

    envs = BatchedAlfworldEnv(batch, "train", size=size, seed=seed, auto_reset=True)
    _, infos = envs.reset()
    rng = random.Random(seed)
    t0, rounds = time.perf_counter(), 50
    for _ in range(rounds):
        _, _, _, infos = envs.step([rng.choice(info["admissible_commands"]) for info in infos])
    batched = batch * rounds / (time.perf_counter() - t0)
    return {"generate": generate, "expert": calls / t_expert, "batched": batched}


def main(argv: list[str] | None = None) -> None:
    args = parse_cli(argv, BenchConfig, prog="alfworld_speed.py", description=__doc__)
    games = pick_games(args.games, args.size)
    ours_reset, ours_step, ours_n, scripts, observations = play_ours(games, args.steps, 0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [export_tw_pddl(game, f"{tmp}/{k}") for k, game in enumerate(games)]
        load_s, real_reset, real_step, real_n = play_real(paths, scripts, observations)
    assert ours_n == real_n
    n_games = len(games)
    rows = [
        ("resets/s", n_games / ours_reset, n_games / real_reset),
        ("steps/s", ours_n / ours_step, real_n / real_step),
    ]
    print(f"{n_games} {args.size} train games (all task types), {ours_n} random admissible steps,")
    print("identical observations on both engines\n")
    print(f"| {'rate':<9} | {'ours':>10} | {'real':>8} | {'ours / real':>11} |")
    print(f"|{'-' * 11}|{'-' * 11}:|{'-' * 9}:|{'-' * 12}:|")
    for name, ours, real in rows:
        print(f"| {name:<9} | {ours:>10,.0f} | {real:>8.1f} | {ours / real:>10,.0f}x |")
    print(f"\nreal engine one-off game load: {load_s / n_games:.2f} s per game")
    extras = ours_extras(args.size, args.batch, 0)
    print(f"ours only: {extras['generate']:,.0f} games generated/s, "
          f"{extras['expert']:,.0f} expert actions/s, "
          f"{extras['batched']:,.0f} steps/s in a batch of {args.batch} envs")  # fmt: skip


if __name__ == "__main__":
    main()
