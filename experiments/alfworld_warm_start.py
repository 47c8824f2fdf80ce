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
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from atdp_io import (
    AtdpStore,
    DecodingParams,
    Event,
    EventKind,
    LLMCall,
    Trajectory,
    TrajectoryHeader,
)
from atdp_io.rows import TrainingView, training_view, trajectory_rows
from sao_jax.distributed.host_sync import allgather_numbers
from sao_jax.envs.alfworld import AlfworldEnv
from sao_jax.metrics import MetricsWriter, ProgressBar
from sao_jax.rollout import EnvConfig, RolloutConfig, collect_expert_demos, expert_reply
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import IM_END
from sao_jax.train import BehaviourCloner

if TYPE_CHECKING:
    from experiments.alfworld_sao import ExperimentConfig
    from experiments.alfworld_setup import Run

DEMOS, DAGGER = "demos", "dagger"
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
    governance = trajectory.header.governance
    if tenant is not None:
        governance = dataclasses.replace(governance, tenant=tenant)
    header = TrajectoryHeader(
        trajectory_id=f"{trajectory.trajectory_id}-relabel",
        governance=governance,
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


# -- do the demonstrations fit the batches? ---------------------------------------------------


class SequenceLengthError(ValueError):
    """No expert demonstration fits a batch the run builds: its loader would never fill one."""


@dataclasses.dataclass(frozen=True)
class DemoLengths:
    """Token lengths of expert episodes as the loader lays them out, one entry per episode.

    Attributes:
      longest_row: [E] tokens of the episode's longest training row (prompt + reply).
      num_rows: [E] rows of the episode (windowed: one per turn; concat: one).
      longest_prompt: [E] tokens of the episode's longest prompt (an LLM call's input).
    """

    longest_row: np.ndarray
    num_rows: np.ndarray
    longest_prompt: np.ndarray

    @classmethod
    def of(cls, episodes: Iterable[Trajectory | TrainingView], layout: str) -> DemoLengths:
        """The lengths of `episodes` laid out in `layout` (exactly the loader's rows)."""
        longest, counts, prompts = [], [], []
        for episode in episodes:
            view = episode if isinstance(episode, TrainingView) else training_view(episode)
            rows, _ = trajectory_rows(view, layout)
            if rows:
                longest.append(max(r.length for r in rows))
                counts.append(len(rows))
                prompts.append(max(len(turn.input_ids) for turn in view.turns))
        return cls(np.asarray(longest), np.asarray(counts), np.asarray(prompts))


def measure_demonstrations(
    tokenizer: Tokenizer, rollout: RolloutConfig, env: EnvConfig, *, num_episodes: int = 256
) -> DemoLengths:
    """Plays `num_episodes` expert games (the real collector, into a throwaway ATDP store) and
    measures their rows: under a second for 256 small games."""
    with tempfile.TemporaryDirectory(prefix="demo-lengths-") as directory:
        store = AtdpStore.open(directory)
        with store.writer(DEMOS) as writer:
            collect_expert_demos(
                writer, tokenizer, num_episodes=num_episodes, rollout=rollout, env=env
            )
        return stored_demo_lengths(store, rollout.layout)


def stored_demo_lengths(store: AtdpStore, layout: str, tenant: str = DEMOS) -> DemoLengths:
    """The lengths of every demonstration committed to `tenant` of `store`."""
    reader = store.reader(tenant, principal=tenant)
    reader.refresh()
    entries = [reader.index.by_row[row] for row in reader.index.close_order]
    return DemoLengths.of(reader.read_training_views(entries), layout)


def check_sequence_lengths(config: ExperimentConfig, lengths: DemoLengths) -> list[str]:
    """Checks the batch shapes of `config` against expert episodes of its prompts.

    Behaviour cloning reads the demonstrations themselves; the critic warm-up and RL read the
    policy's episodes, whose prompts are built the same way (a cloned policy replies like the
    expert; any reply may take up to `rollout.max_new_tokens`). Raises `SequenceLengthError`
    naming the settings to change when no episode fits a phase's `rows x seq_len` (its loader
    would drop everything and the phase wait forever); returns a warning for each phase that
    drops only some.
    """
    rollout = config.rollout
    setting = (
        f"rollout.history_length={rollout.history_length} (layout {rollout.layout}, think "
        f"{rollout.think})"
    )
    if not lengths.longest_row.size:
        raise SequenceLengthError(f"no expert episode has a turn to measure with {setting}")
    longest = int(lengths.longest_row.max())
    needs = {
        "warm_start": longest,
        "rl": int(lengths.longest_prompt.max()) + rollout.max_new_tokens,
    }
    spec = config.warm_start
    phases = {"rl": config.rl}
    if not config.model.hf_path and spec.steps > 0 and not spec.from_run:
        phases = {"warm_start": spec, **phases}
    starved, advice, warnings = [], [], []
    for name, phase in phases.items():
        fits = (lengths.longest_row <= phase.seq_len) & (lengths.num_rows <= phase.rows)
        fix = [f"{name}.seq_len={_round_up(max(needs[name], phase.seq_len), 32)}"]
        if (lengths.num_rows > phase.rows).any():
            fix.append(f"{name}.rows={int(lengths.num_rows.max())}")
        if not fits.any():
            starved.append(f"{name}.seq_len={phase.seq_len} x {name}.rows={phase.rows}")
            advice += fix
        elif not fits.all():
            warnings.append(
                f"{name}.seq_len={phase.seq_len} x {name}.rows={phase.rows} drops "
                f"{int((~fits).sum())} of {fits.size} expert episodes ({1 - fits.mean():.1%}) "
                f"with {setting}: rows up to {longest} tokens; {' '.join(fix)} keeps them"
            )
    if starved:
        raise SequenceLengthError(
            f"with {setting} every one of {lengths.longest_row.size} expert episodes has a row "
            f"of {int(lengths.longest_row.min())} to {longest} tokens (up to "
            f"{int(lengths.num_rows.max())} rows), so {' and '.join(starved)} fit none of them: "
            f"the run would drop every episode and wait forever. Set {' '.join(advice)} "
            f"or more (RL replies may take rollout.max_new_tokens={rollout.max_new_tokens})"
        )
    return warnings


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# -- the phase ----------------------------------------------------------------------------------


def clone_expert(run: Run, log: MetricsWriter) -> None:
    """Expert demonstrations -> ATDP -> loader -> behaviour cloning (+ DAgger rounds); the
    cloned policy replaces `run.policy`. Nothing to do with a HF checkpoint or 0 steps."""
    spec, config = run.config.warm_start, run.config
    if not config.model.hf_path and spec.steps > 0:
        start = time.perf_counter()
        with run.store.writer(run.tenant(DEMOS)) as writer:  # each process its share
            demos = collect_expert_demos(
                writer,
                run.tokenizer,
                num_episodes=run.share(spec.demo_episodes),
                rollout=config.rollout,
                env=dataclasses.replace(config.env, seed=config.env.seed + run.seed_offset()),
                run_id=run.tenant(f"demos-{config.seed}"),
            )
        demos = run.combined_stats(demos)
        # every demo measured (the command line checked a sample): fail here, not in the loader
        lengths = stored_demo_lengths(run.store, config.rollout.layout, run.tenant(DEMOS))
        check_sequence_lengths(config, lengths)
        loader = run.loader(DEMOS, rows=spec.rows, seq_len=spec.seq_len)
        batches = iter(loader.epoch(seed=config.seed, num_epochs=None))
        cloner = BehaviourCloner(
            run.policy,
            spec.optimizer,
            load_balance_loss_weight=config.learner.load_balance_loss_weight,
            router_z_loss_weight=config.learner.router_z_loss_weight,
            context_weight=spec.context_weight,
            mesh=run.mesh,  # with several processes a cloning step spans all of them
        )
        total = spec.steps + spec.dagger_rounds * spec.dagger_steps
        bar = ProgressBar(
            total,
            desc="behaviour cloning",
            keys=("nll",),
            disable=None if config.progress else True,
        )

        def report(step: int, metrics: dict) -> None:
            run.step += 1
            log.write(run.step, {f"bc/{k}": v for k, v in metrics.items()})
            bar.update(metrics=metrics)

        with bar:
            cloner.run(batches, spec.steps, report)
            for round_index in range(spec.dagger_rounds):
                dagger_round(run, log, cloner, round_index, report)
        run.policy = cloner.policy_module()
        run.seconds["bc"] += time.perf_counter() - start
        fits = (lengths.longest_row <= spec.seq_len) & (
            lengths.num_rows <= spec.rows // run.processes  # each process's share of a batch
        )
        log.write(
            run.step,
            {
                "demos/episodes": demos["episodes"],
                "demos/won": demos["won"],
                "demos/too_long_fraction": float(1 - fits.mean()),
            },
        )


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
