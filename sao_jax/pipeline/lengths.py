"""Do a run's batches fit its episodes? Expert episodes measured as the loader lays them out.

The loader drops an episode with a row longer than `seq_len` (or more rows than a batch holds).
Before anything runs, a run plays a few hundred expert games with its own prompt settings (under
a second), sizes the `seq_len` left at 0 ("auto") to the longest of them, and refuses settings
that would drop every episode (the loader would wait forever).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable

import numpy as np

from atdp_io import AtdpStore, Trajectory
from atdp_io.rows import TrainingView, training_view, trajectory_rows
from sao_jax.pipeline.config import ExperimentConfig
from sao_jax.rollout import EnvConfig, RolloutConfig, collect_expert_demos
from sao_jax.tokenizers import Tokenizer

DEMOS = "demos"


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

    def extended(self, other: DemoLengths) -> DemoLengths:
        """These episodes' lengths followed by `other`'s (as if stored after them)."""
        joined = {
            f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)]).astype(int)
            for f in dataclasses.fields(self)
        }
        return DemoLengths(**joined)


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
    config = size_sequences(config, lengths)  # a seq_len left at 0 fits by construction
    rollout = config.rollout
    setting = (
        f"rollout.history_length={rollout.history_length} (layout {rollout.layout}, think "
        f"{rollout.think})"
    )
    if not lengths.longest_row.size:
        raise SequenceLengthError(f"no expert episode has a turn to measure with {setting}")
    longest = int(lengths.longest_row.max())
    needs = row_needs(config, lengths)
    spec = config.warm_start
    phases = {"rl": config.rl}
    if not config.model.hf_path and (spec.steps > 0 or spec.epochs > 0) and not spec.from_run:
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


AUTO_SEQ_LEN = 0  # `warm_start.seq_len` / `rl.seq_len` left at 0: sized from measured episodes
SIZING_MARGIN = 16  # tokens above the longest measured row, then rounded up to 32


def row_needs(config: ExperimentConfig, lengths: DemoLengths) -> dict[str, int]:
    """Tokens a row of each phase needs: cloning the longest demonstrated row, RL the longest
    prompt plus a whole `rollout.max_new_tokens` reply (a policy may use all of it)."""
    return {
        "warm_start": int(lengths.longest_row.max()),
        "rl": int(lengths.longest_prompt.max()) + config.rollout.max_new_tokens,
    }


def needs_sizing(config: ExperimentConfig) -> bool:
    """Whether a `seq_len` of `config` is left at `AUTO_SEQ_LEN`."""
    return AUTO_SEQ_LEN in (config.warm_start.seq_len, config.rl.seq_len)


def size_sequences(config: ExperimentConfig, lengths: DemoLengths) -> ExperimentConfig:
    """`config` with each `seq_len` left at 0 set from `lengths` (expert episodes of its prompts):
    cloning rows hold the longest demonstrated row, RL rows the longest prompt plus a whole
    `rollout.max_new_tokens` reply, each `SIZING_MARGIN` tokens more, rounded up to 32."""
    if not needs_sizing(config):
        return config
    if not lengths.longest_row.size:
        raise SequenceLengthError("no expert episode has a turn to size the batches from")
    changes = {}
    for name, need in row_needs(config, lengths).items():
        phase = getattr(config, name)
        if phase.seq_len == AUTO_SEQ_LEN:
            sized = _round_up(need + SIZING_MARGIN, 32)
            changes[name] = dataclasses.replace(phase, seq_len=sized)
    return dataclasses.replace(config, **changes)


def sized_config(
    config: ExperimentConfig, tokenizer: Tokenizer, *, num_episodes: int = 512
) -> ExperimentConfig:
    """`size_sequences` over `num_episodes` expert games of `config`'s prompts (a few seconds);
    `config` itself when nothing is left at 0."""
    if not needs_sizing(config):
        return config
    lengths = measure_demonstrations(
        tokenizer, config.rollout, config.env, num_episodes=num_episodes
    )
    return size_sequences(config, lengths)
