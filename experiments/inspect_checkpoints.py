"""Which games a run's policies win and lose, how they lose them, and what changes between two.

    python -m experiments.inspect_checkpoints run=runs/curve_s0 "policy_steps=[0,50,100]"
    python -m experiments.inspect_checkpoints run=runs/x split=valid_seen expert=oracle
    python -m experiments.inspect_checkpoints run=runs/x "run_overrides=[rollout.reply_choices=true]"
    python -m experiments.inspect_checkpoints run=runs/x temperature=1 samples_per_game=4

Plays the chosen policies of an `experiments.alfworld_sao` run greedily on one split (the
evaluation the run itself reports: same prompts, games and step limit), and for every game
records its commands, which the room refused, the expert's command at each turn (the game
replayed with the policy's commands, so the expert answers in the state the policy was in) and
how a lost game ended (`sao_jax.rollout.inspection.FAILURE_MODES`). Policy step 0 is the warm
start; step n > 0 is the RL checkpoint taken after n policy steps (keep the ones you want with
`checkpoint_every` / `checkpoint_keep` in the run). Prints, per policy, success, how its games
end and how often its command is the expert's; and for each pair of consecutive policies the
games gained and lost, the turn where their play first parts, and whose command there was the
expert's. Writes `OUT/<split>_step<n>.jsonl` (one game a line) and `OUT/<split>_summary.json`.

With `temperature` > 0 it plays the policies RL samples from instead: `samples_per_game`
plays a game at that temperature, per-policy figures over all of them, and no game-by-game
pairs (a game has several outcomes). The records then go to `<split>_t<T>x<N>_step<n>.jsonl`
and `<split>_t<T>x<N>_summary.json`, beside the greedy ones.

With `records` it plays nothing: record files written before (by this command, of one run or
of several, e.g. two seeds or two settings) are compared game by game, each with the next in
the order given:

    python -m experiments.inspect_checkpoints \
        "records=[runs/a/inspect/valid_unseen_step0.jsonl,runs/b/inspect/valid_unseen_step0.jsonl]"
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from sao_jax.checkpoint import Checkpointer, checkpoint_directory
from sao_jax.config_cli import parse_cli
from sao_jax.config_fields import apply_overrides, load_config
from sao_jax.metrics.progress import ProgressBar
from sao_jax.pipeline.config import ExperimentConfig
from sao_jax.pipeline.setup import WARM_START_DIR, build_model, build_tokenizer, resolve
from sao_jax.rollout import Sampler, evaluate
from sao_jax.rollout.evaluate import check_sampling
from sao_jax.rollout.inspection import (
    FAILURE_MODES,
    GameRecord,
    compare_games,
    expert_commands,
    game_record,
    summarize,
)

PROG = "python -m experiments.inspect_checkpoints"


@dataclasses.dataclass
class InspectConfig:
    """Games of a run's policies (greedy, or sampled), game by game.

    Attributes:
      run: an `experiments.alfworld_sao` run directory (its config.yaml, warm start and
        checkpoints).
      policy_steps: the policies, by policy steps: 0 = the warm start (the run's own, or that
        of its `warm_start.from_run`), n > 0 = the latest checkpoint at policy version n.
        Empty: the warm start and every checkpoint the run kept.
      split: the split played (one of the env's splits).
      num_games: games of the split (None: the run's `eval.num_games`).
      expert: the expert the commands are compared with: "search" (acts from what the agent
        has seen; the one the policy cloned) or "oracle" (plans from the true state).
      out: where the records go (default: RUN/inspect).
      run_overrides: key=value overrides of the run's config for this replay (e.g.
        `rollout.reply_choices=true`: the same policies with replies kept to the listed
        actions).
      temperature: 0 plays greedily (what the run's evaluation reports); > 0 samples at this
        temperature (the policy RL trains), `samples_per_game` plays a game.
      samples_per_game: plays of each game when sampling (1 when greedy).
      records: greedy record files (`<split>_step<n>.jsonl`) to compare game by game instead
        of playing (numbered 1, 2, ... in the report, in the order given; `run` not needed).
    """

    run: str = ""
    policy_steps: tuple[int, ...] = ()
    split: str = "valid_unseen"
    num_games: int | None = None
    expert: str = "search"
    out: str = ""
    run_overrides: tuple[str, ...] = ()
    temperature: float = 0.0
    samples_per_game: int = 1
    records: tuple[str, ...] = ()

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    @property
    def label(self) -> str:
        """The split, and the sampling settings when sampled (the records' file names)."""
        if not self.sampled:
            return self.split
        return f"{self.split}_t{self.temperature:g}x{self.samples_per_game}"


def checkpoints_by_version(directory: Path) -> dict[int, int]:
    """Policy version -> the latest checkpoint id holding it, in `directory` (none: {})."""
    if not directory.is_dir():
        return {}
    out: dict[int, int] = {}
    with Checkpointer(checkpoint_directory(directory), create=False) as saved:
        for step in saved.all_steps():
            version = int(saved.metadata(step)["learner"]["policy_version"])
            out[version] = max(step, out.get(version, step))
    return out


def policy_sources(config: InspectConfig, run: ExperimentConfig) -> dict[int, tuple[Path, int]]:
    """Policy step -> (checkpoint directory, checkpoint id) for each policy asked for."""
    run_dir = Path(config.run)
    warm = Path(run.warm_start.from_run or run_dir) / WARM_START_DIR
    rl = checkpoints_by_version(Path(run.checkpoint_dir or run_dir / "checkpoints"))
    available = {v: (run_dir / "checkpoints", s) for v, s in rl.items() if v}
    if warm.is_dir():  # the cloned policy (a run stopped while cloning has none)
        available = {0: (warm, 0), **available}
    if not available:
        raise SystemExit(
            f"error: {config.run} holds no policy yet (no warm_start/, no RL checkpoint)"
        )
    wanted = config.policy_steps or tuple(sorted(available))
    missing = [s for s in wanted if s not in available]
    if missing:
        raise SystemExit(
            f"error: {config.run} holds no policy at step(s) {missing}; it has "
            f"{sorted(available)} (keep more RL checkpoints with checkpoint_every / "
            "checkpoint_keep)"
        )
    return {s: available[s] for s in wanted}


def play(config: InspectConfig, run: ExperimentConfig, sources) -> dict[int, list[GameRecord]]:
    """Each policy's games on the split (greedy, or sampled), as records."""
    tokenizer = build_tokenizer(run)
    model = build_model(run, tokenizer)
    sampler = Sampler(model, pad_id=tokenizer.pad_id)
    num_games = config.num_games if config.num_games is not None else run.eval.num_games
    out = {}
    with ProgressBar(len(sources), keys=("policy_step", "success")) as bar:
        for step, (directory, checkpoint) in sources.items():
            with Checkpointer(checkpoint_directory(directory), create=False) as saved:
                policy = saved.restore({"policy": model}, step=checkpoint).items["policy"]
            sampler.update_weights(policy, step)
            records: list[GameRecord] = []

            def keep(episode, records=records):
                records.append(game_record(episode, expert_commands(episode, config.expert)))

            evaluate(
                sampler,
                tokenizer,
                split=config.split,
                num_games=num_games,
                num_envs=run.eval.num_envs,
                rollout=run.rollout,
                env=run.env,
                on_episode=keep,
                temperature=config.temperature,
                samples_per_game=config.samples_per_game,
            )
            out[step] = sorted(records, key=lambda r: r.game_index)
            bar.update(metrics={"policy_step": step, "success": summarize(records)["success"]})
    return out


def report(records: dict[int, list[GameRecord]], *, pairs: bool = True) -> dict:
    """Per policy: `summarize`; per consecutive pair (with `pairs`): `compare_games` (flips as
    dicts)."""
    steps = sorted(records)
    compared = {}
    for before, after in itertools.pairwise(steps if pairs else ()):
        comparison = compare_games(records[before], records[after])
        comparison["flips"] = [
            {**dataclasses.asdict(f), "agrees": f.agrees} for f in comparison["flips"]
        ]
        compared[f"{before}->{after}"] = comparison
    return {"policies": {s: summarize(records[s]) for s in steps}, "pairs": compared}


def read_records(paths: Sequence[str]) -> dict[int, list[GameRecord]]:
    """Record files, numbered 1, 2, ... in the order given; a clear error for a file that is
    missing or holds no records."""
    if len(paths) < 2:
        raise SystemExit(f"error: records= needs two record files or more, got {len(paths)}")
    records = {}
    for number, path in enumerate(paths, start=1):
        try:
            lines = Path(path).read_text().splitlines()
            games = [GameRecord.from_json(json.loads(line)) for line in lines if line.strip()]
        except (OSError, ValueError, TypeError) as error:
            raise SystemExit(f"error: records: {path} is not a record file ({error})") from None
        if not games:
            raise SystemExit(f"error: records: {path} holds no games")
        records[number] = games
    return records


def compare_record_files(paths: Sequence[str]) -> dict:
    """`report` over record files (see `read_records`); files of different games are refused."""
    try:
        return report(read_records(paths))
    except ValueError as error:  # compare_games: not the same games
        raise SystemExit(f"error: records: {error}") from None


def print_report(
    result: dict, split: str, how: str = "Greedy games", key: str = "policy step"
) -> None:
    modes = ("won", *FAILURE_MODES)
    print(f"\n{how} on {split}, by {key}")
    header = f"{key.split()[-1]:>6} {'success':>8} " + " ".join(f"{m:>12}" for m in modes)
    print(header + f" {'steps':>6} {'expert':>7}")
    for step, s in result["policies"].items():
        agreement = s["expert_agreement"]
        print(
            f"{step:>6} {s['success']:8.3f} "
            + " ".join(f"{s['modes'][m]:>12}" for m in modes)
            + f" {s['avg_steps']:6.2f} "
            + (f"{agreement:7.3f}" if agreement is not None else f"{'-':>7}")
        )
    for pair, c in result["pairs"].items():
        print(
            f"\n{pair}: both won {c['both_won']}, both lost {c['both_lost']}, "
            f"gained {c['gained']}, lost {c['lost']}; played move for move alike {c['alike']}"
        )
        for side in ("gained", "lost"):
            turns = c["divergence_turn"][side]
            if not turns:
                continue
            print(
                f"  {side}: play parts at turn {statistics.median(turns):g} (median); "
                f"expert's command there: {c['agrees'][side]}; the losing side ended "
                f"{c['lost_modes'][side]}"
            )


def main(argv: list[str] | None = None) -> dict:
    config = parse_cli(argv, InspectConfig, prog=PROG, description=__doc__.split("\n")[0])
    if config.records:
        if config.run:
            raise SystemExit(
                "error: records= compares record files and plays nothing; run= plays a run's "
                "policies: give one of the two"
            )
        result = compare_record_files(config.records)
        for number, path in enumerate(config.records, start=1):
            print(f"{number}: {path}")
        print_report(result, "the records' split", key="record")
        return result
    saved = Path(config.run) / "config.yaml"
    if not config.run or not saved.is_file():
        raise SystemExit(f"error: run={config.run!r} is not a run directory (no config.yaml)")
    # every section a run of `alfworld_sao` has; an `alfworld_seed` run's `hindsight` is not
    # needed to replay its policies
    sections = [f.name for f in dataclasses.fields(ExperimentConfig)]
    run = load_config(saved, ExperimentConfig(), sections=sections)
    try:
        run = resolve(apply_overrides(run, config.run_overrides))
    except ValueError as error:  # ConfigError, or a config the overrides make invalid
        raise SystemExit(f"error: run_overrides: {error}") from None
    try:
        check_sampling(config.temperature, config.samples_per_game)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    sources = policy_sources(config, run)
    records = play(config, run, sources)
    out = Path(config.out or Path(config.run) / "inspect")
    out.mkdir(parents=True, exist_ok=True)
    for step, games in records.items():
        with open(out / f"{config.label}_step{step}.jsonl", "w") as f:
            f.writelines(json.dumps(r.to_json()) + "\n" for r in games)
    result = report(records, pairs=not config.sampled)
    (out / f"{config.label}_summary.json").write_text(json.dumps(result, indent=1))
    how = (
        f"Sampled games (temperature {config.temperature:g}, {config.samples_per_game} a game)"
        if config.sampled
        else "Greedy games"
    )
    print_report(result, config.split, how)
    print(f"\nrecords: {out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
