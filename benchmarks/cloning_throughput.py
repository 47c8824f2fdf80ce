"""Behaviour cloning of the tiny preset: demonstration turns cloned per second, side by side.

The real warm-start pipeline (search-expert demonstrations -> ATDP store -> grain loader ->
`BehaviourCloner` steps) of the `experiments.alfworld_sao` tiny preset, in up to five settings
(`SETTINGS`): `paper` (the papers' prompt wording, rows padded, attention over whole rows: the
preset when the throughput issue was filed), `compact` (the compact prompt style), `packed`
(compact, rows packed into rows of their own length: `sao_jax.train.packing`), `blocked`
(packed, causal attention in query blocks: `ModelConfig.attention_query_block`) and `now`
(blocked, packed rows twice as long: `BehaviourCloner(pack_factor=2)`, today's preset). Each
setting's rows are sized to its own demonstrations (`sao_jax.pipeline.lengths`); all clone the
same games with the same model. After compiling every packed row count on the held batches,
`steps` steps per setting are timed in `repeats` rounds that alternate the settings (other load
on the machine then falls on all of them alike); the fastest round of each counts. Prints turns
per second, the ratio to the first setting, the rows' length, the packed grid's fill and the
load.

    python benchmarks/cloning_throughput.py [demos=200] [steps=30] [repeats=2] \\
        [settings=[paper,compact,packed,blocked,now]]
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import numpy as np

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from experiments import alfworld_sao
from sao_jax.config_cli import parse_cli
from sao_jax.pipeline.lengths import measure_demonstrations, size_sequences
from sao_jax.pipeline.setup import build_model, build_tokenizer
from sao_jax.rollout import collect_expert_demos
from sao_jax.train import BehaviourCloner
from sao_jax.train.packing import packed_inputs


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    demos: expert episodes written per prompt style.
    steps: timed cloning steps per setting and round (after compiling).
    repeats: rounds; each times every setting once, in turn.
    settings: compared settings, from `SETTINGS` (the first is the reference).
    """

    demos: int = 200
    steps: int = 30
    repeats: int = 2
    settings: tuple[str, ...] = ("paper", "compact", "packed", "blocked", "now")

    def __post_init__(self):
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or not self.settings:
            raise ValueError(f"settings must be taken from {sorted(SETTINGS)}, got {unknown}")
        if self.steps < 1 or self.repeats < 1:
            raise ValueError("steps and repeats must be >= 1")


# setting -> (prompt style, pack factor (0: rows padded), attention query block (0: whole rows))
SETTINGS = {
    "paper": ("paper", 0, 0),
    "compact": ("compact", 0, 0),
    "packed": ("compact", 1, 0),
    "blocked": ("compact", 1, 64),
    "now": ("compact", 2, 64),
}


def demo_batches(style: str, bench: BenchConfig, directory: str):
    """(config, tokenizer, `bench.steps` loader batches) of `bench.demos` expert episodes
    written with the prompt style `style`, rows sized to them."""
    config = alfworld_sao.parse(
        ["--out", f"{directory}/run-{style}", f"rollout.prompt_style={style}"]
    )
    tokenizer = build_tokenizer(config)
    config = size_sequences(
        config, measure_demonstrations(tokenizer, config.rollout, config.env, num_episodes=256)
    )
    store = AtdpStore.open(f"{directory}/atdp-{style}")
    with store.writer("demos") as writer:
        collect_expert_demos(
            writer, tokenizer, num_episodes=bench.demos, rollout=config.rollout, env=config.env
        )
    spec = config.warm_start
    loader = AtdpLoader(
        store,
        ["demos"],
        principal="demos",
        config=LoaderConfig(layout="windowed", rows=spec.rows, seq_len=spec.seq_len),
    )
    batches = iter(loader.epoch(seed=0, num_epochs=None))
    return config, tokenizer, [next(batches) for _ in range(bench.steps)]


def make_cloner(setting: str, config, tokenizer) -> BehaviourCloner:
    _, pack_factor, block = SETTINGS[setting]
    model = dataclasses.replace(config.model, attention_query_block=block)
    spec = config.warm_start
    return BehaviourCloner(
        build_model(dataclasses.replace(config, model=model), tokenizer),
        spec.optimizer,
        context_weight=spec.context_weight,
        pack_rows=pack_factor > 0,
        pack_factor=max(pack_factor, 1),
    )


def main(argv: list[str]) -> None:
    bench = parse_cli(argv, {"default": BenchConfig()}, prog="cloning_throughput.py", save=False)
    prepared, results = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        data = {}
        for setting in bench.settings:
            style = SETTINGS[setting][0]
            if style not in data:
                data[style] = demo_batches(style, bench, directory)
            config, tokenizer, held = data[style]
            cloner = make_cloner(setting, config, tokenizer)
            for batch in held:  # compiles every packed row count before anything is timed
                cloner.step(batch)
            grids = [cloner._device_batch(b) for b in held]
            # the positions the backbone runs on: the packed grid, or the rows themselves
            fill = np.mean([float((np.asarray(packed_inputs(g)[2]) != 0).mean()) for g in grids])
            turns = sum(int((b["traj_index"] >= 0).sum()) for b in held)
            prepared[setting] = (cloner, held, turns, config.warm_start.seq_len, fill)
        load = [os.getloadavg()[0]]
        for _ in range(bench.repeats):
            for setting, (cloner, held, _, _, _) in prepared.items():
                started = time.perf_counter()
                for batch in held:
                    cloner.step(batch)
                seconds = time.perf_counter() - started
                results[setting] = min(results.get(setting, np.inf), seconds)
        load.append(os.getloadavg()[0])
    reference = prepared[bench.settings[0]][2] / results[bench.settings[0]]
    print(f"load average {load[0]:.2f} -> {load[1]:.2f}; {bench.steps} steps of 32 rows per "
          f"setting, best of {bench.repeats} alternating rounds")  # fmt: skip
    print("| setting | seq_len | positions filled | s / step | turns / s | vs first |")
    print("|---|---:|---:|---:|---:|---:|")
    for setting, (_, _, turns, seq_len, fill) in prepared.items():
        seconds = results[setting]
        print(f"| {setting} | {seq_len} | {fill:.0%} | {seconds / bench.steps:.3f} | "
              f"{turns / seconds:.1f} | {turns / seconds / reference:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
