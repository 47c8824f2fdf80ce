"""Behaviour cloning of the tiny preset: demonstration turns cloned per second, side by side.

The real warm-start pipeline (search-expert demonstrations -> ATDP store -> grain loader ->
`BehaviourCloner` steps) of the `experiments.alfworld_sao` tiny preset, in up to three settings:
`paper` (the papers' prompt wording, rows padded: the preset when the throughput issue was
filed), `compact` (the compact prompt style, rows padded) and `packed` (compact, rows packed:
`sao_jax.train.packing`, today's preset), each with rows sized to its own demonstrations
(`sao_jax.pipeline.lengths`). All clone the same games with the same model; after the
compile, `steps` cloning steps are timed per setting and the demonstrated turns (rows) they
covered are counted. Prints turns per second, the ratio to the first setting, the rows' length
and the load.

    python benchmarks/cloning_throughput.py [demos=200] [steps=30] [settings=[paper,compact,packed]]
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from experiments import alfworld_sao
from sao_jax.config_cli import parse_cli
from sao_jax.pipeline.lengths import measure_demonstrations, size_sequences
from sao_jax.pipeline.setup import build_model, build_tokenizer
from sao_jax.rollout import collect_expert_demos
from sao_jax.train import BehaviourCloner


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    demos: expert episodes written per style.
    steps: timed cloning steps per style (after one compiling step).
    settings: compared settings, from paper, compact, packed (the first is the reference).
    """

    demos: int = 200
    steps: int = 30
    settings: tuple[str, ...] = ("paper", "compact", "packed")

    def __post_init__(self):
        unknown = [s for s in self.settings if s not in SETTINGS]
        if unknown or not self.settings:
            raise ValueError(f"settings must be taken from {sorted(SETTINGS)}, got {unknown}")


# setting -> (prompt style, rows packed)
SETTINGS = {"paper": ("paper", False), "compact": ("compact", False), "packed": ("compact", True)}


def clone_rate(setting: str, bench: BenchConfig, directory: str) -> dict:
    """Turns per second of `bench.steps` cloning steps on the tiny preset in `setting`."""
    style, pack = SETTINGS[setting]
    config = alfworld_sao.parse(["--out", directory, f"rollout.prompt_style={style}"])
    tokenizer = build_tokenizer(config)
    config = size_sequences(
        config, measure_demonstrations(tokenizer, config.rollout, config.env, num_episodes=256)
    )
    spec = config.warm_start
    store = AtdpStore.open(f"{directory}/atdp-{setting}")
    with store.writer("demos") as writer:
        collect_expert_demos(
            writer, tokenizer, num_episodes=bench.demos, rollout=config.rollout, env=config.env
        )
    loader = AtdpLoader(
        store,
        ["demos"],
        principal="demos",
        config=LoaderConfig(layout="windowed", rows=spec.rows, seq_len=spec.seq_len),
    )
    batches = iter(loader.epoch(seed=0, num_epochs=None))
    cloner = BehaviourCloner(
        build_model(config, tokenizer),
        spec.optimizer,
        context_weight=spec.context_weight,
        pack_rows=pack,
        pack_row_multiple=config.learner.pack_row_multiple,
    )
    cloner.step(next(batches))  # compile
    # a first pass over the held batches compiles every packed row count before the timed pass
    held = [next(batches) for _ in range(bench.steps)]
    for batch in held:
        cloner.step(batch)
    turns, started = 0, time.perf_counter()
    for batch in held:
        turns += int((batch["traj_index"] >= 0).sum())
        cloner.step(batch)
    seconds = time.perf_counter() - started
    return {"setting": setting, "seq_len": spec.seq_len, "turns_per_s": turns / seconds,
            "s_per_step": seconds / bench.steps}  # fmt: skip


def main(argv: list[str]) -> None:
    bench = parse_cli(argv, {"default": BenchConfig()}, prog="cloning_throughput.py", save=False)
    with tempfile.TemporaryDirectory() as directory:
        results = [clone_rate(setting, bench, directory) for setting in bench.settings]
    reference = results[0]["turns_per_s"]
    print(f"load average {os.getloadavg()[0]:.2f}, {bench.steps} steps of 32 rows per setting")
    print("| setting | seq_len | s / step | turns / s | vs first |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['setting']} | {r['seq_len']} | {r['s_per_step']:.3f} | "
              f"{r['turns_per_s']:.1f} | {r['turns_per_s'] / reference:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
