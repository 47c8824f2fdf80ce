"""The warm start of an ALFWorld run: expert demonstrations, behaviour cloning, DAgger.

A tiny model starts from random weights and never wins by chance, so it first clones the expert.
ALFWorld's expert reads the true game state, so plain demonstrations never show a wrong room, a
closed receptacle that holds nothing, or a command that failed; a cloned policy that strays
there has never seen what to do next and loops. DAgger (Ross et al., 2011) fixes this: the
cloned policy plays, and each of its turns is written again with the expert's reply to that same
prompt. Everything goes through ATDP: demonstrations and the policy's episodes are written to the
run's buffer, each game is replayed from `header.task` with the recorded commands (our engine is
deterministic), relabelled turns are written back, and cloning reads it all through the loader.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from atdp_io import (
    DecodingParams,
    Event,
    EventKind,
    LLMCall,
    Trajectory,
    lineage,
)
from atdp_io.rows import pack_batch
from experiments.alfworld_lengths import (  # noqa: F401  (re-exported: the phase's checks)
    DEMOS,
    DemoLengths,
    SequenceLengthError,
    check_sequence_lengths,
    measure_demonstrations,
    stored_demo_lengths,
)
from sao_jax.distributed.host_sync import allgather_numbers
from sao_jax.envs.alfworld import SPLITS, AlfworldEnv
from sao_jax.metrics import MetricsWriter, ProgressBar
from sao_jax.rollout import collect_expert_demos, expert_reply
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import IM_END
from sao_jax.train import BehaviourCloner

if TYPE_CHECKING:
    from experiments.alfworld_setup import Run

DAGGER = "dagger"
EXPERT_MODEL_ID = "alfworld-expert-relabel"


def relabel_with_expert(
    trajectory: Trajectory,
    tokenizer: Tokenizer,
    *,
    think: bool,
    max_new_tokens: int,
    tenant: str | None = None,
    expert: str = "search",
) -> Trajectory | None:
    """The episode with every LLM call's output replaced by the expert's reply to its prompt.

    The game is rebuilt from `header.task` and stepped with the recorded commands, so each turn
    is relabelled in exactly the state the policy saw. Turns after the game is won (none) and
    expert replies longer than `max_new_tokens` end the relabelled episode. `tenant`: the
    partition the result is written to (its governance names it). `expert`: which expert
    relabels ("search": from the transcript of the recorded commands, as the policy saw them;
    "oracle": the planner), the same kind that made the demos; it is recorded as the calls'
    `decoding.extra["policy"]` ("expert-search") and in their model id. Returns None when no
    turn could be relabelled.
    """
    task = trajectory.header.task
    env = AlfworldEnv(
        task["split"],
        size=task["size"],
        phrasing=task["phrasing"],
        max_steps=task["max_steps"],
        expert=expert,
    )
    env.reset(task["index"])
    im_end = tokenizer.token_to_id(IM_END)
    decoding = DecodingParams(
        temperature=0.0, extra={"logprobs": "absent", "policy": f"expert-{expert}"}
    )
    events: list[Event] = []
    for event in trajectory.events:
        if event.kind == EventKind.LLM_CALL:
            command = env.expert_action()
            if command is None:
                break
            ids = np.asarray([*tokenizer.encode(expert_reply(command, think=think)), im_end])
            if ids.shape[0] > max_new_tokens:
                break
            call = LLMCall(
                model_id=f"{EXPERT_MODEL_ID}-{expert}",
                policy_version=0,
                input_ids=event.llm.input_ids,
                output_ids=ids.astype(np.int32),
                output_logprobs=np.zeros(ids.shape, np.float32),
                decoding=decoding,
                prompt_template_fingerprint=event.llm.prompt_template_fingerprint,
                finish_reason="stop",
            )
            events.append(dataclasses.replace(event, llm=call))
        elif event.kind == EventKind.ENV_STEP:
            # the policy's own command moves the game on: the next prompt is the one it saw
            _, _, done, _ = env.step(event.action.text if event.action else "")
            events.append(dataclasses.replace(event, rewards=()))
            if done:
                break
    if not any(e.kind == EventKind.LLM_CALL for e in events):
        return None
    # Derived data: it names the episode and takes its governance (expires and is purged
    # with it), wherever it is written.
    header = lineage.derived_header(
        [trajectory],
        tenant=tenant,
        trajectory_id=f"{trajectory.trajectory_id}-relabel",
        created_at=trajectory.header.created_at,
        session_id=trajectory.header.session_id,
        task={**task, "source": "expert_relabel"},
        envelope=trajectory.header.envelope,
    )
    return Trajectory(header, tuple(events), trajectory.outcome)


def relabel_all(
    trajectories: Iterable[Trajectory],
    tokenizer: Tokenizer,
    *,
    think: bool,
    max_new_tokens: int,
    tenant: str | None = None,
    expert: str = "search",
) -> list[Trajectory]:
    """`relabel_with_expert` over many episodes (those with nothing to relabel are skipped)."""
    out = []
    for trajectory in trajectories:
        relabelled = relabel_with_expert(
            trajectory,
            tokenizer,
            think=think,
            max_new_tokens=max_new_tokens,
            tenant=tenant,
            expert=expert,
        )
        if relabelled is not None:
            out.append(relabelled)
    return out


# -- the phase ----------------------------------------------------------------------------------


HELDOUT = "demos-heldout"


def heldout_games(num_games: int) -> tuple[range, range]:
    """(training games, held-out games) of the train split: the last `num_games` are held out."""
    total = SPLITS["train"]
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


def clone_expert(run: Run, log: MetricsWriter) -> None:
    """Expert demonstrations -> ATDP -> loader -> behaviour cloning (+ DAgger rounds); the
    cloned policy replaces `run.policy`. Nothing to do with a HF checkpoint or no steps.

    With `warm_start.epochs` the number of steps covers that many passes over the demonstrated
    rows; `bc/epoch` logs the passes made. Teacher-forced imitation metrics on held-out games
    (`bc/heldout_nll`, `bc/heldout_token_accuracy`, `bc/heldout_action_accuracy`) are logged every
    `warm_start.heldout_every` steps and at the end."""
    spec, config = run.config.warm_start, run.config
    if config.model.hf_path or (spec.steps <= 0 and spec.epochs <= 0):
        return
    start = time.perf_counter()
    train_games, held_games = heldout_games(spec.heldout_episodes)
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
    share = spec.rows // run.processes  # each process's share of a batch
    fits = (lengths.longest_row <= spec.seq_len) & (lengths.num_rows <= share)
    epoch_rows = int(lengths.num_rows[fits].sum())
    steps = spec.steps
    if spec.epochs > 0:
        per_epoch = int(allgather_numbers([batches_per_epoch(lengths.num_rows[fits], share)]).max())
        steps = max(1, math.ceil(spec.epochs * per_epoch))
    loader = run.loader(DEMOS, rows=spec.rows, seq_len=spec.seq_len)
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
        pack_row_multiple=config.learner.pack_row_multiple,
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

    with bar:
        cloner.run(batches, steps, report)
        for round_index in range(spec.dagger_rounds):
            dagger_round(run, log, cloner, round_index, report)
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
        **{f"heldout_{k}": v for k, v in last_heldout.items()},
    }


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
) -> None:
    """The cloned policy plays (sampling), the expert relabels its turns into the demos tenant,
    and cloning continues on everything there."""
    spec, config = run.config.warm_start, run.config
    publisher = run.publisher()
    publisher.publish(cloner.policy_module(), index)
    with run.store.writer(run.tenant(DAGGER)) as writer:
        engine = run.engine(
            publisher, writer, asynchronous=False, tenant=DAGGER, seed_offset=700 + index
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
    with run.store.writer(run.tenant(DEMOS)) as writer:
        writer.append(relabelled)
    log.write(
        run.step,
        {
            "dagger/round": index + 1,
            "dagger/episodes": stats["episodes"],
            "dagger/success": stats["success_rate"],
            "dagger/relabelled_turns": int(  # over every process's relabelled episodes
                allgather_numbers([sum(len(t.llm_events()) for t in relabelled)]).sum()
            ),
        },
    )
    loader = run.loader(DEMOS, rows=spec.rows, seq_len=spec.seq_len)
    batches = iter(loader.epoch(seed=config.seed + index + 1, num_epochs=None))
    cloner.run(batches, spec.dagger_steps, report)
