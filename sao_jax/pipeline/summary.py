"""What a finished job reports: DIR/summary.json, the learning curve and the terminal table.

Success per evaluation split before / after RL reads `<name>_success_start` / `_end`, where
`name` is the split without a `valid_` prefix (ALFWorld: `seen_*`, `unseen_*`; a `test` split:
`test_*`); `eval_splits` lists the splits, held-out last.
"""

from __future__ import annotations

from sao_jax.metrics import plot_learning_curves, read_metrics, save_summary, summary_table
from sao_jax.pipeline.setup import Run
from sao_jax.train import Learner

HELDOUT_CURVE_KEY = "eval/{heldout}/success"  # the held-out split's periodic evaluation
CURVE_KEYS = (
    "batch/success_rate",
    HELDOUT_CURVE_KEY,
    "policy/entropy",
    "policy/clip_frac",
    "policy/grad_norm",
    "critic/explained_variance",
    "batch/staleness_mean",
    "bc/nll",
)


def success_key(split: str, tag: str) -> str:
    """The summary key of success on `split` at `tag` ("start", "end"; SEED: "after_sft")."""
    return f"{split.removeprefix('valid_')}_success_{tag}"


def summarize(run: Run, learner: Learner) -> dict:
    """summary.json: success before / after RL (overall, per task type), budget, timings."""
    start, end = run.evals.get("start", {}), run.evals.get("end", {})
    stats = run.rollout_stats

    def success(tag: dict, split: str):
        return tag.get(split, {}).get("success")

    successes = {  # the held-out split first
        success_key(split, tag): success(evals, split)
        for split in reversed(run.eval_splits)
        for tag, evals in (("start", start), ("end", end))
    }
    return {
        "algorithm": learner.algorithm.name,
        "asynchronous": run.config.rl.asynchronous,
        "seed": run.config.seed,
        **successes,
        "policy_steps": learner.policy_version,
        "critic_steps": learner.counters.critic_steps,
        "skipped_policy_steps": learner.counters.skipped_policy_steps,
        "rl_episodes": stats.get("episodes", 0),
        "rl_env_steps": stats.get("env_steps", 0),
        "rl_dropped_stale": stats.get("dropped_stale", 0),
        "rl_dropped_too_long": stats.get("loader/dropped_too_long", 0),
        "bc_seconds": run.seconds["bc"],
        "eval_seconds": run.seconds["eval"],
        "rl_seconds": run.seconds["rl"],
        "wall_seconds": run.seconds["total"],
        "by_task_type": {
            f"{split}_{tag}": run.evals.get(tag, {}).get(split, {}).get("by_task_type", {})
            for tag in ("start", "end")
            for split in run.eval_splits
        },
        "eval_splits": list(run.eval_splits),
        "rl_timing": run.timing,
        "warm_start": run.evals.get("warm_start", {}),
    }


def print_summary(summary: dict) -> None:
    """Success per split and task type before / after RL, then the run's scalars."""
    rows = []
    for split in summary["eval_splits"]:
        before = summary["by_task_type"].get(f"{split}_start", {})
        after = summary["by_task_type"].get(f"{split}_end", {})
        rows.append(
            {
                "split": split,
                "task type": "all",
                "start": summary[success_key(split, "start")],
                "end": summary[success_key(split, "end")],
            }
        )
        for task_type in sorted(set(before) | set(after)):
            rows.append(
                {
                    "split": split,
                    "task type": task_type,
                    "start": before.get(task_type),
                    "end": after.get(task_type),
                }
            )
    print(summary_table(rows, floatfmt=".3f"))
    if summary.get("warm_start"):  # the cloned start: its expert, epochs, held-out imitation
        print(summary_table({f"warm start: {k}": v for k, v in summary["warm_start"].items()}))
    print(summary_table({k: v for k, v in summary.items() if not isinstance(v, dict | list)}))


def write_outputs(run: Run, summary: dict, curve_keys=CURVE_KEYS) -> None:
    """DIR/summary.json, then (process 0, which alone has DIR/metrics.jsonl) DIR/learning_curve.png
    of the `curve_keys` the run logged and the summary table on the terminal."""
    save_summary(run.out, summary)
    if not run.job.is_primary:
        return
    records = read_metrics(run.out)
    curve_keys = [k.format(heldout=run.eval_splits[-1]) for k in curve_keys]
    keys = [k for k in curve_keys if any(isinstance(r.get(k), int | float) for r in records)]
    plot_learning_curves(records, run.out / "learning_curve.png", keys=keys, title=str(run.out))
    print_summary(summary)
