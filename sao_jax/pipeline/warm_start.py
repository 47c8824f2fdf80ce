"""The warm start of a job: the env's expert demonstrations, behaviour cloning, DAgger.

A tiny model starts from random weights and never wins by chance, so it first clones the env's
expert (`TextEnv.expert_action`). An expert's demonstrations only show the states the expert
reaches (ALFWorld's never show a wrong room, a closed receptacle that holds nothing, or a
command that failed); a cloned policy that strays there has never seen what to do next and
loops. DAgger (Ross et al., 2011) fixes this: the cloned policy plays, and each of its turns is
written again with the expert's reply to that same prompt (`relabel`). Everything goes through
ATDP: demonstrations and the policy's episodes are written to the run's buffer, each task is
replayed from `header.task` with the recorded actions (a task is a pure function of its split
and index), relabelled turns are written back, and cloning reads it all through the loader.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from atdp_io.rows import pack_batch
from atdp_io.trained_on import TrainedOn
from sao_jax.checkpoint import Checkpointer, checkpoint_directory
from sao_jax.config_cli import CONFIG_FILE
from sao_jax.config_fields import load_config
from sao_jax.distributed.host_sync import allgather_numbers
from sao_jax.metrics import MetricsWriter, ProgressBar
from sao_jax.pipeline.evaluation import evaluate_policy
from sao_jax.pipeline.lengths import (
    DEMOS,
    DemoLengths,
    check_sequence_lengths,
    stored_demo_lengths,
)
from sao_jax.pipeline.relabel import relabel_all
from sao_jax.pipeline.setup import WARM_START_DIR, Run, env_splits
from sao_jax.rollout import collect_expert_demos
from sao_jax.train import BehaviourCloner

DAGGER = "dagger"
HELDOUT = "demos-heldout"


@dataclasses.dataclass(frozen=True)
class ExtraDemos:
    """Derived demonstrations cloned beside the expert's from the first step (a job's hook:
    `Job.extra_demos`; SEED's acting turns with a skill in context are one).

    Attributes:
      build: (run, episodes) -> derived trajectories, appended to the demos tenant: called
        with this process's expert demos before cloning starts, and with each DAgger round's
        played games before that round clones (each result names the episode it derives from).
      extra_tokens: how much longer a derived row may be than its demo's: the cloning rows
        (`warm_start.seq_len`) grow by this much.
      name: the metric prefix of their count (`demos/<name>_episodes`).
    """

    build: Callable[[Run, list], list]
    extra_tokens: int = 0
    name: str = "extra"


def heldout_games(num_games: int, total: int) -> tuple[range, range]:
    """(training games, held-out games) of a training split of `total` games: the last
    `num_games` are held out."""
    if not 0 <= num_games < total:
        raise ValueError(f"warm_start.heldout_episodes must be in [0, {total}), got {num_games}")
    return range(total - num_games), range(total - num_games, total)


def batches_per_epoch(num_rows: np.ndarray, rows: int) -> int:
    """Batches of `rows` one pass over episodes of `num_rows` rows each fills (the loader never
    splits an episode: one that does not fit starts the next batch)."""
    batches, used = 0, 0
    for n in (int(n) for n in num_rows if n <= rows):
        if used + n > rows:
            batches, used = batches + 1, 0
        used += n
    return batches + int(used > 0)


def clone_expert(run: Run, log: MetricsWriter, *, extra: ExtraDemos | None = None) -> None:
    """Expert demonstrations -> ATDP -> loader -> behaviour cloning (+ DAgger rounds); the
    cloned policy replaces `run.policy`. Nothing to do with a HF checkpoint or no steps.
    `extra`: derived demonstrations cloned with the expert's (`ExtraDemos`); the epochs count
    them too.

    With `warm_start.epochs` the number of steps covers that many passes over the demonstrated
    rows; `bc/epoch` logs the passes made. Teacher-forced imitation metrics on held-out games
    (`bc/heldout_nll`, `bc/heldout_token_accuracy`, `bc/heldout_action_accuracy`) are logged every
    `warm_start.heldout_every` steps and at the end."""
    spec, config = run.config.warm_start, run.config
    if config.model.hf_path or (spec.steps <= 0 and spec.epochs <= 0):
        return
    start = time.perf_counter()
    total = env_splits(config)[config.env.split]
    train_games, held_games = heldout_games(spec.heldout_episodes, total)
    env = dataclasses.replace(config.env, seed=config.env.seed + run.seed_offset())

    def collect(tenant: str, episodes: int, prefix: str, games: range) -> dict:
        with run.store.writer(run.tenant(tenant)) as writer:  # each process its share
            return collect_expert_demos(
                writer,
                run.tokenizer,
                num_episodes=run.share(episodes),
                rollout=config.rollout,
                env=env,
                run_id=run.tenant(f"{prefix}-{config.seed}"),
                indices=games,
            )

    demos = run.combined_stats(collect(DEMOS, spec.demo_episodes, "demos", train_games))
    if spec.heldout_episodes:
        collect(HELDOUT, spec.heldout_episodes, "heldout", held_games)
    # every demo measured (the command line checked a sample): fail here, not in the loader
    lengths = stored_demo_lengths(run.store, config.rollout.layout, run.tenant(DEMOS))
    check_sequence_lengths(config, lengths)
    seq_len, extra_episodes = spec.seq_len, 0
    if extra is not None:
        derived, extra_episodes = add_extra_demos(run, extra)
        seq_len += extra.extra_tokens
        lengths = lengths.extended(DemoLengths.of(derived, config.rollout.layout))
    share = spec.rows // run.processes  # each process's share of a batch
    fits = (lengths.longest_row <= seq_len) & (lengths.num_rows <= share)
    epoch_rows = int(lengths.num_rows[fits].sum())
    steps = spec.steps
    if spec.epochs > 0:
        per_epoch = int(allgather_numbers([batches_per_epoch(lengths.num_rows[fits], share)]).max())
        steps = max(1, math.ceil(spec.epochs * per_epoch))
    loader = run.loader(DEMOS, rows=spec.rows, seq_len=seq_len)
    rows_seen = [0]

    def counted(batches: Iterator[dict]) -> Iterator[dict]:
        for batch in batches:
            rows_seen[0] += int((batch["traj_index"] >= 0).sum())
            yield batch

    batches = counted(iter(loader.epoch(seed=config.seed, num_epochs=None)))
    optimizer = spec.optimizer
    if spec.decay:
        decay_steps = max(1, steps - optimizer.warmup_steps)
        optimizer = dataclasses.replace(optimizer, decay_steps=decay_steps)
    cloner = BehaviourCloner(
        run.policy,
        optimizer,
        moe_aux=config.learner.moe,
        context_weight=spec.context_weight,
        pack_rows=config.learner.pack_rows,
        pack_factor=spec.pack_factor,
        mesh=run.mesh,  # with several processes a cloning step spans all of them
    )
    cloner.trained_on = run.trained_on  # the demos and relabels go into the warm start's lineage
    heldout = heldout_batches(run, spec) if spec.heldout_episodes else None
    total = steps + spec.dagger_rounds * spec.dagger_steps
    bar = ProgressBar(
        total,
        desc="behaviour cloning",
        keys=("nll", "heldout_action_accuracy"),
        disable=None if config.progress else True,
    )
    last_heldout: dict[str, float] = {}

    def report(step: int, metrics: dict) -> None:
        run.step += 1
        record = {f"bc/{k}": v for k, v in metrics.items()}
        record["bc/epoch"] = rows_seen[0] / max(epoch_rows, 1)
        every = spec.heldout_every
        if heldout is not None and ((every and run.step % every == 0) or run.step == total):
            last_heldout.update(cloner.evaluate(heldout))
            record.update({f"bc/heldout_{k}": v for k, v in last_heldout.items()})
        log.write(run.step, record)
        bar.update(metrics=metrics | {f"heldout_{k}": v for k, v in last_heldout.items()})

    dagger = []
    with bar:
        cloner.run(batches, steps, report)
        for round_index in range(spec.dagger_rounds):
            dagger.append(
                dagger_round(run, log, cloner, round_index, report, seq_len=seq_len, extra=extra)
            )
    run.policy = cloner.policy_module()
    run.seconds["bc"] += time.perf_counter() - start
    log.write(
        run.step,
        {
            "demos/episodes": demos["episodes"],
            "demos/won": demos["won"],
            "demos/success_rate": demos["success_rate"],
            "demos/avg_steps": demos["avg_steps"],
            "demos/too_long_fraction": float(1 - fits.mean()),
            **({f"demos/{extra.name}_episodes": extra_episodes} if extra is not None else {}),
            "bc/steps": total,
            "bc/epochs": rows_seen[0] / max(epoch_rows, 1),
        },
    )
    run.evals["warm_start"] = {
        "bc_steps": total,
        "bc_epochs": rows_seen[0] / max(epoch_rows, 1),
        "expert_success": demos["success_rate"],
        "expert_avg_steps": demos["avg_steps"],
        "demos_too_long_fraction": float(1 - fits.mean()),
        **({f"{extra.name}_episodes": extra_episodes} if extra is not None else {}),
        **{f"heldout_{k}": v for k, v in last_heldout.items()},
    }
    if dagger:  # each round's success on the games it played, and the turns relabelled
        for i, result in enumerate(dagger):
            run.evals["warm_start"][f"dagger{i + 1}_success"] = result["success"]
        turns = sum(r["relabelled_turns"] for r in dagger)
        run.evals["warm_start"]["dagger_relabelled_turns"] = turns


def add_extra_demos(run: Run, extra: ExtraDemos) -> tuple[list, int]:
    """Builds `extra`'s trajectories from this process's expert demos and appends them to the
    demos tenant; returns them and how many every process added."""
    tenant = run.tenant(DEMOS)
    reader = run.store.reader(tenant, principal=tenant)
    reader.refresh()
    demos = [reader.read(i) for i in reader.trajectory_ids()]
    derived = list(extra.build(run, demos))
    if derived:
        with run.store.writer(tenant) as writer:
            writer.append(derived)
    return derived, int(allgather_numbers([len(derived)]).sum())


def heldout_batches(run: Run, spec) -> list[dict]:
    """Every batch of this process's held-out demonstrations, padded with empty batches to the
    count of the process with the most (evaluation steps span every process in lockstep)."""
    loader = run.loader(HELDOUT, rows=spec.rows, seq_len=spec.seq_len)
    batches = [dict(b) for b in loader.epoch(seed=0, shuffle=False, num_epochs=1)]
    most = int(allgather_numbers([len(batches)]).max())
    empty = pack_batch([], spec.rows // run.processes, spec.seq_len, run.tokenizer.pad_id)
    return batches + [empty] * (most - len(batches))


def dagger_round(
    run: Run,
    log: MetricsWriter,
    cloner: BehaviourCloner,
    index: int,
    report: Callable[[int, dict], None],
    *,
    seq_len: int | None = None,
    extra: ExtraDemos | None = None,
) -> dict[str, float]:
    """The cloned policy plays (at `warm_start.dagger_temperature`; 0: greedy), the expert
    relabels its turns into the demos tenant (with `extra`'s trajectories derived from the
    played episodes: the policy's own states), and cloning continues on everything there
    (rows of `seq_len`, default `warm_start.seq_len`). Returns the round's `success` (of the
    games played, every process's) and `relabelled_turns`."""
    spec, config = run.config.warm_start, run.config
    publisher = run.publisher()
    publisher.publish(cloner.policy_module(), index)
    with run.store.writer(run.tenant(DAGGER)) as writer:
        engine = run.engine(
            publisher,
            writer,
            asynchronous=False,
            tenant=DAGGER,
            seed_offset=700 + index,
            temperature=spec.dagger_temperature,
        )
        stats = run.combined_stats(engine.generate(run.share(spec.dagger_episodes)))
    tenant = run.tenant(DAGGER)
    reader = run.store.reader(tenant, principal=tenant)
    reader.refresh()
    played = [reader.read(i) for i in reader.trajectory_ids() if i.startswith(engine.run_id)]
    relabelled = relabel_all(
        played,
        run.tokenizer,
        think=config.rollout.think,
        max_new_tokens=config.rollout.max_new_tokens,
        tenant=run.tenant(DEMOS),
        expert=config.env.expert,  # the expert that made the demos
    )
    derived = list(extra.build(run, played)) if extra is not None else []
    with run.store.writer(run.tenant(DEMOS)) as writer:
        writer.append([*relabelled, *derived])
    counts = allgather_numbers([sum(len(t.llm_events()) for t in relabelled), len(derived)])
    turns, derived_count = (int(n) for n in counts.sum(axis=0))  # over every process's
    log.write(
        run.step,
        {
            "dagger/round": index + 1,
            "dagger/episodes": stats["episodes"],
            "dagger/success": stats["success_rate"],
            "dagger/relabelled_turns": turns,
            **({f"dagger/{extra.name}_episodes": derived_count} if extra is not None else {}),
        },
    )
    loader = run.loader(DEMOS, rows=spec.rows, seq_len=seq_len or spec.seq_len)
    batches = iter(loader.epoch(seed=config.seed + index + 1, num_epochs=None))
    cloner.run(batches, spec.dagger_steps, report)
    return {"success": float(stats["success_rate"]), "relabelled_turns": turns}


# What decides a greedy evaluation's games besides the weights (decoding is forced greedy).
EVALUATION_FIELDS = {
    "rollout": (
        "layout",
        "history_length",
        "think",
        "memory_line",
        "prompt_style",
        "max_new_tokens",
        "max_context_tokens",
        "reply_choices",
    ),
    "env": ("name", "size", "phrasing", "max_steps"),
    "eval": ("num_games", "splits"),
}


def evaluation_changes(config, from_run: str) -> list[str]:
    """The settings (`EVALUATION_FIELDS`) in which `config` evaluates otherwise than the run in
    `from_run` did (its config.yaml); none when that run saved no config. Only those sections
    are read, so the run may be another job's (an `alfworld_seed` warm start for an
    `alfworld_sao` run, whose schema has no `hindsight`)."""
    saved = Path(from_run) / CONFIG_FILE
    if not saved.is_file():
        return []
    earlier = load_config(saved, type(config)(), sections=list(EVALUATION_FIELDS))
    return [
        f"{section}.{name}"
        for section, names in EVALUATION_FIELDS.items()
        for name in names
        if getattr(getattr(config, section), name) != getattr(getattr(earlier, section), name)
    ]


def warm_start(
    run: Run,
    log: MetricsWriter,
    *,
    reevaluate: bool = True,
    extra: ExtraDemos | None = None,
) -> None:
    """The cloned policy and its start evaluation, saved to DIR/warm_start (or both taken from
    `warm_start.from_run`; its policy is evaluated again when this run evaluates otherwise,
    `evaluation_changes`, unless `reevaluate` is False). `extra`: derived demonstrations
    cloned beside the expert's (`ExtraDemos`)."""
    spec = run.config.warm_start
    if spec.from_run:
        with Checkpointer(
            checkpoint_directory(spec.from_run) / WARM_START_DIR, create=False
        ) as saved:
            restored = saved.restore({"policy": run.policy})
            run.trained_on = TrainedOn(parent=saved.step_path(restored.step))
        run.policy = restored.items["policy"]
        if "warm_start" in restored.metadata["evals"]:
            run.evals["warm_start"] = restored.metadata["evals"]["warm_start"]
        changed = evaluation_changes(run.config, spec.from_run) if reevaluate else []
        if not changed:
            run.evals["start"] = restored.metadata["evals"]["start"]
            return
        # the saved start evaluation played other prompts or rules than this run's end one
        # will: evaluate the reused policy again, so start and end compare like with like
        print(f"warm_start.from_run: evaluating its policy again ({', '.join(changed)} differ)")
        evaluate_policy(run, log, run.policy, 0, "start")
        return
    clone_expert(run, log, extra=extra)
    evaluate_policy(run, log, run.policy, 0, "start")
    with Checkpointer(run.warm_start_dir, max_to_keep=1, async_save=False) as saved:
        kept = {k: run.evals[k] for k in ("start", "warm_start") if k in run.evals}
        saved.save(0, {"policy": run.policy}, metadata={"evals": kept}, trained_on=run.trained_on)
