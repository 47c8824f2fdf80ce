"""SAO on ALFWorld, asynchronous vs synchronous schedule: wall clock for the same policy steps.

Both schedules run the real pipeline of `python -m experiments.alfworld_sao` (rollout engine ->
ATDP buffer -> loader stream -> SAO learner -> weight publication) from one shared warm start,
in one process, side by side:

- async: workers keep playing with the latest published weights while the learner trains
  (staleness <= `rl.max_staleness`);
- sync: play `rl.episodes_per_version` episodes, train on every batch they fill, publish.

A warm-up pass of each schedule compiles every shape first, so the timed passes measure the
schedule, not XLA. Reported per schedule: RL wall seconds for `policy_steps` policy updates,
environment steps played, the time the learner waited for data, and the ratio sync / async.

    python benchmarks/sao_async_vs_sync.py [preset=tiny] [policy_steps=20] [repeats=2]
        [warm_start_from=RUN_DIR] [out_dir=/tmp/sao_async_bench]
        ["overrides=[rl.envs_per_worker=16]"]
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
from pathlib import Path

from sao_jax.config_cli import apply_overrides, parse_cli


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    preset: `experiments.alfworld_sao` preset of both schedules.
    policy_steps: policy updates per timed pass.
    repeats: timed passes per schedule, alternating (the median is reported).
    warm_start_steps: behaviour-cloning steps of the shared warm start (a few: episodes then
      end early sometimes, as they do in training).
    warm_start_from: an earlier `experiments.alfworld_sao` run of the same preset whose cloned
      policy both schedules start from (skips the warm start; "" clones here).
    out_dir: scratch directory (deleted afterwards).
    overrides: extra key=value overrides of both schedules' config.
    """

    preset: str = "tiny"
    policy_steps: int = 20
    repeats: int = 2
    warm_start_steps: int = 100
    warm_start_from: str = ""
    out_dir: str = "/tmp/sao_async_bench"
    overrides: tuple[str, ...] = ()


def main(argv: list[str]) -> None:
    bench = parse_cli(argv, {"default": BenchConfig()}, prog="sao_async_vs_sync.py", save=False)
    from experiments.alfworld_sao import PRESETS
    from sao_jax.metrics import summary_table
    from sao_jax.pipeline.job import run

    out = Path(bench.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    base = [
        "progress=false",
        "tensorboard=false",
        "eval.num_games=2",
        "learner.critic.warmup_steps=0",
        f"warm_start.steps={bench.warm_start_steps}",
        "warm_start.dagger_rounds=0",
        *bench.overrides,
    ]
    warm = bench.warm_start_from
    if not warm:  # the shared warm start (and the first compile of the evaluation sampler)
        warm = str(out / "warm")
        run(apply_overrides(PRESETS[bench.preset], [*base, f"out_dir={warm}", "rl.policy_steps=1"]))
    base.append(f"warm_start.from_run={warm}")

    def one(schedule: str, steps: int, tag: str) -> dict:
        config = apply_overrides(
            PRESETS[bench.preset],
            [
                *base,
                f"out_dir={out / tag}",
                f"rl.asynchronous={str(schedule == 'async').lower()}",
                f"rl.policy_steps={steps}",
            ],
        )
        return run(config)

    for schedule in ("async", "sync"):  # compile every shape of both schedules
        one(schedule, 2, f"compile-{schedule}")
    timed: dict[str, list[dict]] = {"async": [], "sync": []}
    for repeat in range(bench.repeats):
        order = ("async", "sync") if repeat % 2 == 0 else ("sync", "async")
        for schedule in order:
            timed[schedule].append(one(schedule, bench.policy_steps, f"{schedule}-{repeat}"))

    rows = []
    for schedule, summaries in timed.items():
        seconds = statistics.median(s["rl_seconds"] for s in summaries)
        rows.append(
            {
                "schedule": schedule,
                "policy steps": bench.policy_steps,
                "RL wall (s)": seconds,
                "s / policy step": seconds / bench.policy_steps,
                "env steps": statistics.median(s["rl_env_steps"] for s in summaries),
                "learner waited (s)": statistics.median(
                    s["rl_timing"].get("wait_seconds", 0.0) for s in summaries
                ),
                "dropped stale": statistics.median(s["rl_dropped_stale"] for s in summaries),
            }
        )
    print(summary_table(rows, floatfmt=".3g"))
    ratio = rows[1]["RL wall (s)"] / rows[0]["RL wall (s)"]
    print(f"\nsync / async wall clock for {bench.policy_steps} policy steps: {ratio:.2f}x")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
