"""The tiny preset's RL phase, "before" settings vs today's defaults, side by side.

The real pipeline of `python -m experiments.alfworld_sao` (tiny preset): the rollout engine
plays into the ATDP buffer, the loader streams batches to the SAO learner, the learner
publishes weights that the workers pick up: `sao_jax.pipeline.rl.reinforcement_learning`
on a `Run` of `sao_jax.pipeline.setup`, with a randomly initialised model (no cloning:
throughput, not success) and no critic warm-up. Two settings:

- before: the tiny preset when the throughput issue was filed: the rollout path without prefix
  caching, split prefill dispatches or the attention window (`rollout.prefix_cache=false`,
  `Sampler.split_prefill / attention_window = False`), `learner.head_positions=all`,
  `learner.pack_rows=false`, `learner.fused_iteration=false`, `rollout.prompt_style=paper`,
  `rollout.decode_chunk=4`, causal attention over whole rows (`model.attention_query_block=0`),
  the asynchronous schedule;
- now: the tiny preset as it is;
- unpacked (optional): now with `learner.pack_rows=false` (what packing alone brings);
- uncached (optional, `settings=before,uncached,now`): now, but the rollout path of before
  (what the prefill savings alone bring in this pipeline);
- nosplit (optional): now without split prefill dispatches (prefix caching and the attention
  window only: one dispatch per load, as before).

Each setting first runs `warmup_steps` policy steps (every shape compiles), then the settings
alternate for `repeats` measured segments of `policy_steps` policy steps each, on the same
learner and engine settings (the machine is shared: a ratio from one run is what counts).
Reported per setting (the best segment): env steps per second and trained episodes per second
of the RL wall time, env steps per second of the worker's busy time (admission waits
excluded: the rollout side alone, sharing the cores with the learner), learner seconds per
iteration, the share of the time the learner waited for data, and the ratios to before.

    python benchmarks/rl_throughput.py [policy_steps=6] [warmup_steps=2] [repeats=1]
        [settings=before,now]
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

from experiments.alfworld_sao import PRESETS
from sao_jax.config_cli import parse_cli
from sao_jax.metrics import MetricsWriter, read_metrics
from sao_jax.pipeline.rl import reinforcement_learning
from sao_jax.pipeline.setup import Run
from sao_jax.train import Learner

SETTINGS = ("before", "uncached", "nosplit", "unpacked", "now")


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    policy_steps: policy steps per measured segment.
    warmup_steps: policy steps per setting before measuring (compilation).
    repeats: measured segments per setting, alternating (the best is reported).
    envs_per_worker: KV-cache slots of the rollout worker (the preset's 16).
    seed: the run's seed (model init, games, sampling).
    settings: comma-separated, from before, uncached, nosplit, unpacked, now (the first is the
      ratios' base).
    out_dir: scratch directory (deleted afterwards).
    """

    policy_steps: int = 6
    warmup_steps: int = 2
    repeats: int = 1
    envs_per_worker: int = 16
    seed: int = 0
    settings: str = "before,now"
    out_dir: str = "/tmp/rl_throughput"

    def __post_init__(self):
        for name in ("policy_steps", "warmup_steps", "repeats", "envs_per_worker"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        names = self.names()
        unknown = [n for n in names if n not in SETTINGS]
        if unknown or len(set(names)) != len(names) or len(names) < 2:
            raise ValueError(
                f"settings must name at least 2 distinct settings from {SETTINGS}, got "
                f"{self.settings!r}"
            )

    def names(self) -> list[str]:
        return [n.strip() for n in self.settings.split(",") if n.strip()]


def experiment_config(setting: str, bench: BenchConfig, out: Path):
    """The tiny preset, no cloning or critic warm-up, with `setting`'s overrides."""
    config = PRESETS["tiny"]
    rollout, learner, rl, model = config.rollout, config.learner, config.rl, config.model
    if setting == "before":
        model = dataclasses.replace(model, attention_query_block=0)
        rollout = dataclasses.replace(
            rollout, prefix_cache=False, prompt_style="paper", decode_chunk=4
        )
        learner = dataclasses.replace(
            learner, head_positions="all", pack_rows=False, fused_iteration=False
        )
        rl = dataclasses.replace(rl, asynchronous=True)
    elif setting == "uncached":
        rollout = dataclasses.replace(rollout, prefix_cache=False)
    elif setting == "unpacked":
        learner = dataclasses.replace(learner, pack_rows=False)
    return dataclasses.replace(
        config,
        out_dir=str(out),
        seed=bench.seed,
        model=model,
        rollout=rollout,
        learner=dataclasses.replace(
            learner, critic=dataclasses.replace(learner.critic, warmup_steps=0)
        ),
        rl=dataclasses.replace(rl, envs_per_worker=bench.envs_per_worker),
        progress=False,
        tensorboard=False,
        checkpoint_every=10**9,
    )


class Setting:
    """One setting's run, learner and publisher, played in segments of policy steps."""

    def __init__(self, name: str, bench: BenchConfig, root: Path):
        self.name = name
        self.run = Run(experiment_config(name, bench, root / name))
        self.learner = Learner(self.run.config.learner, self.run.policy, mesh=self.run.mesh)
        self.publisher = self.run.publisher()
        self.publisher.publish(self.learner.policy_module(copy=False), 0)
        self.log = MetricsWriter(self.run.out, tensorboard=False)

    def segment(self, policy_steps: int) -> dict:
        """`policy_steps` more policy steps of RL; the segment's figures."""
        run, rl = self.run, self.run.config.rl
        for w in range(rl.num_workers):  # the samplers are shared by every setting's run
            sampler = run.sampler(w)  # before and uncached: one dispatch, the whole cache
            sampler.split_prefill = self.name == "now"
            sampler.attention_window = self.name in ("now", "nosplit")
        target = self.learner.policy_version + policy_steps
        run.config = dataclasses.replace(
            run.config, rl=dataclasses.replace(rl, policy_steps=target)
        )
        steps0, episodes0 = (int(run.rollout_stats.get(k, 0)) for k in ("env_steps", "episodes"))
        seconds0, step0 = run.seconds["rl"], run.step
        compiled0 = sum(run.sampler(w).num_compiled() for w in range(rl.num_workers))
        # the stream's position from the last segment (checkpointed per process, as `restore`
        # reads it): this segment trains on new episodes, not on the stale ones already read
        data = (run.data_state or {}).get("by_process", [None])[run.process]
        reinforcement_learning(run, self.log, self.learner, self.publisher, data)
        self.log.flush()
        seconds = run.seconds["rl"] - seconds0
        records = [r for r in read_metrics(run.out) if r.get("step", 0) > step0]
        trained = sum(r.get("batch/trajectories", 0.0) for r in records)
        iterations = len(records)
        timing = run.timing
        return {
            "seconds": seconds,
            "env_steps": int(run.rollout_stats["env_steps"]) - steps0,
            "episodes_played": int(run.rollout_stats["episodes"]) - episodes0,
            "episodes_trained": trained,
            "iterations": iterations,
            "env steps/s": (int(run.rollout_stats["env_steps"]) - steps0) / seconds,
            # the segment's engine alone: its busy time, admission waits excluded
            "rollout env steps/s": (int(run.rollout_stats["env_steps"]) - steps0)
            / max(float(run.rollout_stats["rollout_seconds"]), 1e-9),
            "trained episodes/s": trained / seconds,
            "learner s/iter": timing["learner_seconds"] / max(iterations, 1),
            "wait share": timing["wait_seconds"] / seconds,
            "seq_len": run.config.rl.seq_len,
            # sampler executables compiled during the segment (shared samplers: any setting's)
            "compiles": sum(run.sampler(w).num_compiled() for w in range(rl.num_workers))
            - compiled0,
        }

    def close(self) -> None:
        self.log.close()
        self.run.checkpointer.wait_until_finished()
        self.run.checkpointer.close()


def main(argv: list[str]) -> None:
    bench = parse_cli(argv, {"default": BenchConfig()}, save=False)
    root = Path(bench.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    print(f"config: {dataclasses.asdict(bench)}; load average {os.getloadavg()}")
    names = bench.names()
    settings: dict[str, Setting] = {}
    results: dict[str, list[dict]] = {name: [] for name in names}
    try:
        for name in names:
            settings[name] = Setting(name, bench, root)
            if bench.warmup_steps:
                start = time.perf_counter()
                settings[name].segment(bench.warmup_steps)
                print(f"{name}: warm-up ({bench.warmup_steps} steps, compiles) "
                      f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
        for _ in range(bench.repeats):  # interleaved: the machine is shared
            for name in names:
                results[name].append(settings[name].segment(bench.policy_steps))
                print(f"{name}: {results[name][-1]}", flush=True)
    finally:
        for setting in settings.values():
            setting.close()
        shutil.rmtree(root, ignore_errors=True)
    best = {name: max(runs, key=lambda r: r["env steps/s"]) for name, runs in results.items()}
    print(
        f"\nRL phase of the tiny preset, {bench.policy_steps} policy steps per segment, random "
        f"weights; load average {os.getloadavg()}"
    )
    header = ("seconds", "env steps", "env steps/s", "rollout st/s", "trained ep/s", "learner s/it")
    print(f"{'setting':<9} {' '.join(f'{h:>12}' for h in header)} {'wait':>6} seq_len")
    for name in names:
        r = best[name]
        print(
            f"{name:<9} {r['seconds']:12.1f} {r['env_steps']:12d} {r['env steps/s']:12.2f} "
            f"{r['rollout env steps/s']:12.2f} {r['trained episodes/s']:12.3f} "
            f"{r['learner s/iter']:12.2f} {r['wait share']:6.0%} {r['seq_len']}"
        )
    base = best[names[0]]
    for name in names[1:]:
        r = best[name]
        print(
            f"{name} / {names[0]}: env steps/s {r['env steps/s'] / base['env steps/s']:.2f}x, "
            f"rollout env steps/s (busy) "
            f"{r['rollout env steps/s'] / base['rollout env steps/s']:.2f}x, trained episodes/s "
            f"{r['trained episodes/s'] / max(base['trained episodes/s'], 1e-9):.2f}x, learner "
            f"s/iter {base['learner s/iter'] / r['learner s/iter']:.2f}x faster"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
