"""SAO against GRPO, GRPO+DIS and PPO on ALFWorld: same warm start, same environment steps.

    python -m experiments.compare_algos                               # tiny runs, 2 seeds
    python -m experiments.compare_algos seeds=[0,1,2] env_steps=6000 --out runs/compare
    python -m experiments.compare_algos "run_overrides=[rl.asynchronous=true]"
    python -m experiments.compare_algos seeds=[0,1,2] warm_start_runs=runs/base_s{seed}

For each seed the first algorithm's run clones the expert and evaluates the cloned policy; every
other algorithm of that seed starts from that same policy and evaluation (`warm_start.from_run`);
`warm_start_runs` starts every algorithm from an earlier run's warm start instead, one per seed.
Every run stops after `env_steps` environment steps of RL rollouts. Outputs in DIR: one run
directory per (algorithm, seed), `comparison.json`, a table on the terminal (mean ± sample std
over seeds; one seed: its value) and `comparison.png` (rollout success and stability signals,
seed-averaged per algorithm). Finished runs are reused when the command is repeated with
`--resume`. The algorithm list takes any name registered in `sao_jax.train.ALGORITHMS` (a SEED
variant, once registered, too).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from sao_jax.config_cli import apply_overrides, parse_cli
from sao_jax.metrics.seeds import format_mean_std, rl_records

PLOT_KEYS = (
    "batch/success_rate",
    "rollout/success_rate",
    "policy/clip_frac",
    "critic/explained_variance",
    "policy/entropy",
    "policy/grad_norm",
)
# End-of-run stability signals: means over the last quarter of each run's iterations.
TAIL_KEYS = ("policy/clip_frac", "critic/explained_variance", "policy/entropy", "policy/grad_norm")
# SEED algorithms' extra columns (table name -> summary key): the teacher-student gap (mean,
# median; per skill kind), the gate rate, the OPD term's share of the policy gradient (the
# exact one with learner.opd.grad_share, else the token-space estimate); mode "kl": the KL
# from the teacher's top k and the log-prob of the teacher's favourite token under each
SEED_COLUMNS = {
    "opd_gap": "seed_opd_delta_mean",
    "opd_kl": "seed_opd_kl",
    "teacher_top1_logp": "seed_opd_teacher_top1_logp",
    "student_top1_logp": "seed_opd_student_top1_logp",
    "opd_gap_p50": "seed_opd_delta_p50",
    "gate_rate": "seed_opd_gate_rate",
    "opd_grad_share": "seed_opd_grad_share",
    "opd_token_grad_share": "seed_opd_token_grad_share",
    "opd_token_grad_cos": "seed_opd_token_grad_cos",
    "gap_fact": "seed_opd_gap_fact",
    "gap_failed_command": "seed_opd_gap_failed_command",
    "gap_procedure": "seed_opd_gap_procedure",
    "gap_other": "seed_opd_gap_other",
}


@dataclasses.dataclass
class CompareConfig:
    """A comparison of RL algorithms on ALFWorld.

    Attributes:
      out_dir: comparison directory (default: runs/compare_algos/<timestamp>).
      resume: reuse finished runs in out_dir and resume unfinished ones.
      preset: `experiments.alfworld_sao` preset every run starts from.
      algorithms: registered algorithm names, in run order.
      seeds: seeds; each seed's runs share one warm start.
      env_steps: RL environment steps per run (the common budget).
      max_policy_steps: a cap on policy steps per run (the budget normally ends a run first).
      run_overrides: key=value overrides applied to every run's config.
      warm_start_runs: earlier runs to start from, one per seed, `{seed}` standing for the seed
        (e.g. `runs/dg_s{seed}`): every algorithm of a seed starts from that run's cloned policy
        and its evaluation, so a comparison reuses warm starts cloned once (empty: the first
        algorithm's run of each seed clones).
    """

    out_dir: str = ""
    resume: bool = False
    preset: str = "tiny"
    algorithms: tuple[str, ...] = ("sao", "grpo", "grpo_dis", "ppo", "sao_seed", "grpo_seed")
    seeds: tuple[int, ...] = (0, 1)
    env_steps: int = 3000
    max_policy_steps: int = 10_000
    run_overrides: tuple[str, ...] = ()
    warm_start_runs: str = ""

    def __post_init__(self):
        if self.warm_start_runs and len(self.seeds) > 1 and "{seed}" not in self.warm_start_runs:
            raise ValueError(
                f"warm_start_runs={self.warm_start_runs!r} names one run for {len(self.seeds)} "
                "seeds; put {seed} where the seed goes (e.g. runs/base_s{seed})"
            )

    def warm_start_of(self, seed: int) -> str | None:
        """The run seed `seed` starts from (None: its first algorithm's run clones)."""
        return self.warm_start_runs.replace("{seed}", str(seed)) or None


def run_config(config: CompareConfig, algorithm: str, seed: int, warm_start_from: str | None):
    """The `ExperimentConfig` of one run of the comparison (SEED algorithms: an
    `experiments.alfworld_seed` config, whose stage 1 starts from the shared warm start)."""
    from experiments.alfworld_sao import PRESETS

    if _is_seed(algorithm):
        from experiments.alfworld_seed import PRESETS

    overrides = [
        f"out_dir={Path(config.out_dir) / f'{algorithm}-seed{seed}'}",
        f"seed={seed}",
        f"learner.algorithm={algorithm}",
        f"rl.env_steps={config.env_steps}",
        f"rl.policy_steps={config.max_policy_steps}",
        f"resume={str(config.resume).lower()}",
        *config.run_overrides,
    ]
    if warm_start_from is not None:
        overrides.append(f"warm_start.from_run={warm_start_from}")
    return apply_overrides(PRESETS[config.preset], overrides)


def _is_seed(algorithm: str) -> bool:
    from sao_jax.train import get_algorithm

    return get_algorithm(algorithm).opd


def seed_columns(summaries: list[dict]) -> dict[str, float | None]:
    """A SEED algorithm's stage-2 diagnostics and cost, means over seeds of each run's
    per-iteration means (`sao_jax.pipeline.seed.seed_summary`; None where no run has it)."""
    out = {}
    for column, key in SEED_COLUMNS.items():
        values = [s[key] for s in summaries if isinstance(s.get(key), int | float)]
        out[column] = float(np.mean(values)) if values else None
    seconds = [
        s["seed_analysis_seconds_per_iter"] + s["seed_rescore_seconds_per_iter"]
        for s in summaries
        if isinstance(s.get("seed_analysis_seconds_per_iter"), int | float)
        and isinstance(s.get("seed_rescore_seconds_per_iter"), int | float)
    ]
    out["seed_s_per_iter"] = float(np.mean(seconds)) if seconds else None
    return out


def release_compiled_programs() -> None:
    """Drops the finished run's compiled programs: one process runs every (algorithm, seed),
    and each run compiles its own, whose machine code XLA's CPU backend keeps mapped until the
    caches let go (a 15-run comparison failed in its 4th run with "LLVM compilation error:
    Cannot allocate memory" without this). The samplers `sao_jax.pipeline.setup` keeps across
    runs stay, and compile their kernels again in the next run."""
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


def _tail_means(records: list[dict], keys=TAIL_KEYS) -> dict[str, float]:
    rl = rl_records(records)
    tail = rl[-max(1, len(rl) // 4) :]
    out = {}
    for key in keys:
        values = [r[key] for r in tail if isinstance(r.get(key), int | float)]
        if values:
            out[key] = float(np.mean(values))
    return out


def _seed_averaged(runs: list[list[dict]], keys=PLOT_KEYS) -> list[dict]:
    """Records averaged over seeds, aligned on the learner iteration index within RL."""
    per_run = [rl_records(records) for records in runs]
    length = min((len(r) for r in per_run), default=0)
    averaged = []
    for i in range(length):
        row = {"step": i + 1}
        for key in keys:
            values = [r[i][key] for r in per_run if isinstance(r[i].get(key), int | float)]
            if values:
                row[key] = float(np.mean(values))
        averaged.append(row)
    return averaged


def compare(config: CompareConfig) -> dict:
    """Run every (algorithm, seed), then write the table and the plot; returns the results."""
    from sao_jax.metrics import plot_learning_curves, read_metrics, summary_table
    from sao_jax.pipeline.job import run
    from sao_jax.pipeline.seed import run as seed_run
    from sao_jax.pipeline.setup import WARM_START_DIR, lacks_warm_start
    from sao_jax.train import get_algorithm

    labels = {name: get_algorithm(name).label for name in config.algorithms}  # validates names
    for seed in config.seeds:  # before any run: a missing warm start would fail it hours in
        start = config.warm_start_of(seed)
        if start and lacks_warm_start(start):
            raise FileNotFoundError(
                f"warm_start_runs: seed {seed}'s run {start} holds no {WARM_START_DIR}/ (a "
                "finished python -m experiments.alfworld_sao run directory is expected)"
            )
    out = Path(config.out_dir)
    results: dict[str, list[dict]] = {name: [] for name in config.algorithms}
    records: dict[str, list[list[dict]]] = {name: [] for name in config.algorithms}
    for seed in config.seeds:
        warm_start_from = config.warm_start_of(seed)
        for algorithm in config.algorithms:
            run_dir = out / f"{algorithm}-seed{seed}"
            if config.resume and (run_dir / "summary.json").is_file():
                summary = json.loads((run_dir / "summary.json").read_text())
            else:
                runner = seed_run if _is_seed(algorithm) else run
                summary = runner(run_config(config, algorithm, seed, warm_start_from))
                release_compiled_programs()
            if warm_start_from is None and (run_dir / WARM_START_DIR).is_dir():
                # a run started from `warm_start.from_run` in run_overrides saves no warm start
                # of its own; the others then take that same one from run_overrides
                warm_start_from = str(run_dir)
            history = read_metrics(run_dir)
            summary = dict(summary, **_tail_means(history))
            results[algorithm].append(summary)
            records[algorithm].append(history)

    rows = []
    for algorithm, summaries in results.items():
        row = {"algorithm": labels[algorithm], "seeds": len(summaries)}
        for key in ("unseen_success_start", "unseen_success_end", "seen_success_end"):
            values = [float(s[key]) for s in summaries]
            row[key] = format_mean_std(values, scale=1.0, signed=False, digits=3, pm="±")
        gain = [float(s["unseen_success_end"] - s["unseen_success_start"]) for s in summaries]
        row["unseen_gain"] = format_mean_std(gain, scale=1.0, digits=3, pm="±")
        for key in ("policy_steps", "rl_env_steps", "rl_seconds"):
            row[key] = float(np.mean([s[key] for s in summaries]))
        for key in TAIL_KEYS:
            values = [s[key] for s in summaries if key in s]
            row[key.split("/")[-1]] = float(np.mean(values)) if values else None
        row.update(seed_columns(summaries) if _is_seed(algorithm) else {})
        rows.append(row)
    table = summary_table(rows, floatfmt=".3g", numparse=False)
    print(table)
    (out / "comparison.txt").write_text(table + "\n")
    (out / "comparison.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=2))
    curves = {labels[a]: _seed_averaged(r) for a, r in records.items()}
    curves = {label: recs for label, recs in curves.items() if recs}
    keys = [k for k in PLOT_KEYS if any(k in rec for recs in curves.values() for rec in recs)]
    if curves and keys:
        plot_learning_curves(
            curves, out / "comparison.png", keys=keys, title="seed-averaged, per RL iteration"
        )
    return {"rows": rows, "runs": results}


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--out" or a.startswith("--out=") for a in argv):
        stamp = time.strftime("%Y%m%d-%H%M%S")
        argv = ["--out", str(Path("runs/compare_algos") / stamp), *argv]
    config = parse_cli(
        argv,
        {"default": CompareConfig()},
        prog="python -m experiments.compare_algos",
        description=__doc__.split("\n")[0],
    )
    return compare(config)


if __name__ == "__main__":
    main()
