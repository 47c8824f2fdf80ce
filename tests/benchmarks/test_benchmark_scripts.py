"""Every script in `benchmarks/` runs end to end with small arguments and prints its comparison.

The scripts are run by hand, so nothing else notices when a change elsewhere breaks one (an
option it passes that is now refused, a shape a worker no longer accepts): three had broken
that way. Each runs here as a user runs it, `python benchmarks/<name>.py key=value ...` in its
own process, with arguments sized to finish in seconds, and its output must hold the line that
states what it compares. The figures mean nothing at this size and are not checked, except
where a script also checks correctness (model_vs_hf's logits against transformers).
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sao_jax.xla_flags import with_cpu_device_count

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
RATIO = r"[\d,]+(\.\d+)?x"

# script -> (its arguments as typed on the command line, patterns its standard output must
# match); "{tmp}" stands for a scratch directory
CASES = {
    "alfworld_experts": (
        "games=3 twins=1 replays=1",
        [r"\| search \| small \| .*%", r"## Ambiguity of the expert"],
    ),
    "alfworld_speed": ("games=2 steps=5 size=small batch=4", [rf"steps/s .* {RATIO}"]),
    "atdp_append": (
        "trajectories=16 batch=4 turns=2 prompt_tokens=32 obs_tokens=8 output_tokens=8 "
        "sessions=2 session_trajectories=4 repeats=1 out_dir={tmp}",
        [r"append throughput: \d+% of raw", r"sessions .* calls/s"],
    ),
    "atdp_loader": (
        "trajectories=16 turns=2 rows=4 seq_len=2048 repeats=1 out_dir={tmp}",
        [r"shuffled loader at \d+% of raw", r"commit   loader at \d+% of raw"],
    ),
    "atdp_loader_groups": (
        "groups=4 group_size=2 turns=2 rows=4 seq_len=2048 repeats=1 out_dir={tmp}",
        [rf"stream   group_by takes {RATIO}"],
    ),
    "attention_layout": ("batch=2 seq_len=32 repeats=1", [rf"stacked / repeated: {RATIO}"]),
    "checkpoint_async": (
        "preset=tiny repeats=1 out_dir={tmp}",
        [r"async blocks the loop \d+\.\dx less than sync"],
    ),
    "cloning_throughput": (
        "demos=20 steps=2 repeats=1 settings=[packed,now]",
        [rf"\| now \| \d+ \| \d+% \| .* \| {RATIO} \|"],
    ),
    "compile_time": (
        "preset=tiny layers_small=1 layers_large=2 batch=1 seq_len=32 chunk_size=32 repeats=1",
        [rf"scan compiles in {RATIO} the loop's CPU time"],
    ),
    "learner_throughput": (
        "rows=8 seq_len=64 repeats=1 turns=2",
        [rf"all / actions: {RATIO} faster per iteration"],
    ),
    "mfu": (
        "presets=[tiny] batch=2 seq_len=64 steps=1 matmul_size=256",
        [r"best f32 matmul 256\^3", r"\ntiny .*%"],
    ),
    "model_vs_hf": (
        "layers=1 d_model=64 experts=4 moe_hidden=64 vocab=512 batch=2 seq_len=16 prompt_len=8 "
        "new_tokens=4 repeats=1",
        [rf"forward tok/s .* {RATIO}", rf"greedy gen tok/s .* {RATIO}"],
    ),
    "moe_scaling": (
        "experts_small=2 experts_large=4 d_model=32 expert_hidden=32 layers=1 vocab=256 batch=2 "
        "seq_len=16 repeats=1",
        [rf"sorted_capacity\s+4 .* {RATIO}"],
    ),
    "rl_throughput": (
        "policy_steps=1 warmup_steps=1 envs_per_worker=2 out_dir={tmp}",
        [rf"now / before: env steps/s {RATIO}, .* trained episodes/s {RATIO}"],
    ),
    "rollout_throughput": (
        "envs=2 episodes=2 max_steps=3 context=256 max_new_tokens=4 repeats=1 policy_steps=1 "
        "episodes_per_step=2 pipeline_max_steps=2 learner_updates=1 bc_steps=0 "
        "out_dir={tmp}",
        [rf"slot refill is {RATIO} lock-step", rf"async is {RATIO} sync for the same policy"],
    ),
    "sao_async_vs_sync": (
        "preset=micro policy_steps=1 repeats=1 warm_start_steps=2 out_dir={tmp}",
        [rf"sync / async wall clock for 1 policy steps: {RATIO}"],
    ),
    # expert=8 only: with fsdp beside expert, XLA:CPU's fake devices can order their
    # collectives differently and deadlock (benchmarks/README.md, Scale-out)
    "scaling_expert_parallel": (
        "preset=small tokens=256 repeats=1 meshes=[8] capacity_factors=[1.25]",
        [rf"expert_parallel\s+expert=8 .* {RATIO}"],
    ),
    "scaling_mfu": (
        "preset=tiny rows=8 seq_len=32 steps=2 matmul_size=256",
        [r"SAO iteration, tiny preset", rf"%\s+\({RATIO}\)"],
    ),
    "scaling_publication": ("preset=tiny repeats=1", [rf"host / per_host: {RATIO}"]),
    "serving_prefix_cache": (
        "preset=tiny prompt_tokens=200 repeats=1 max_tokens=2 prefill_chunk=64 out_dir={tmp}",
        [rf"uncached / cached = {RATIO}"],
    ),
    "serving_throughput": (
        "concurrency=[1,2] requests_per_run=4 max_tokens=4 prompt_words=5 num_slots=2 "
        "context_length=128 repeats=1 out_dir={tmp}",
        [r"HTTP / direct", r"\|\s+2 \|\s+\d+ \|.* \d+\.\d% "],
    ),
}
# needs a run directory with a cloned policy: its own test below
NEEDS_A_RUN = {"seed_skill_gap"}


def run_script(name: str, args: str, tmp: Path) -> subprocess.CompletedProcess:
    """`python benchmarks/<name>.py args` from the repository root, as a user runs it. The
    tests' 8 fake devices are taken out of XLA_FLAGS (a user's process has one CPU device;
    the scripts that need more set them), LLVM's optimisation level is kept for speed."""
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=with_cpu_device_count(os.environ.get("XLA_FLAGS", ""), None),
    )
    argv = shlex.split(args.replace("{tmp}", str(tmp / "scratch")))
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def check_output(done: subprocess.CompletedProcess, patterns: list[str]) -> None:
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    for pattern in patterns:
        assert re.search(pattern, done.stdout), f"{pattern!r} not in:\n{done.stdout[-3000:]}"


def test_every_benchmark_script_has_a_run_here():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")}
    assert scripts == set(CASES) | NEEDS_A_RUN, "add the new script to CASES"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_and_prints_its_comparison(name, tmp_path):
    args, patterns = CASES[name]
    done = run_script(name, args, tmp_path)
    check_output(done, patterns)
    if name == "model_vs_hf":  # the parity it reports beside the speed (greedy tokens are
        # not compared: a near-tie of two random logits may break either way on another CPU)
        (diff,) = re.findall(r"max \|ours - transformers\| = (\S+)", done.stdout)
        assert float(diff) <= 1e-5


@pytest.mark.slow
def test_seed_skill_gap_runs_on_a_run_directory(tmp_path):
    run = tmp_path / "run"
    from experiments import alfworld_sao

    alfworld_sao.main(
        [
            "--config",
            "micro",
            "--out",
            str(run),
            "progress=false",
            "tensorboard=false",
            "eval.num_games=2",
            "warm_start.demo_episodes=4",
            "rl.policy_steps=1",
        ]
    )
    done = run_script("seed_skill_gap", f"run_dir={run} episodes=2 out_dir={{tmp}}", tmp_path)
    check_output(
        done,
        [
            r"2 episodes of train \(success \d\.\d{3}\)",
            r"gap = log pi",
            r"the oracle's replies in those states \(\d+\), whole skill in context: gap [-+]\d",
            r"only its fact sentences: gap [-+]\d",
            r"only its procedure sentences: gap [-+]\d",
        ],
    )
    result = json.loads((tmp_path / "scratch" / "skill_gap.json").read_text())
    expert = result["expert_replies"]
    assert expert["replies"] > 0 and expert["unlikely_replies"] <= expert["replies"]
    gap = expert["logp_with"] - expert["logp_without"]
    assert expert["gap_per_reply"] == pytest.approx(gap, abs=1e-6)
    # each kind alone is scored on the same replies
    for part in expert["by_kind"].values():
        assert part["replies"] == expert["replies"]
        assert part["logp_without"] == pytest.approx(expert["logp_without"], abs=1e-6)


@pytest.mark.slow
def test_a_loader_benchmark_whose_rows_hold_no_episode_says_so(tmp_path):
    args = "trajectories=8 turns=2 rows=4 seq_len=128 repeats=1 out_dir={tmp}"
    done = run_script("atdp_loader", args, tmp_path)
    assert done.returncode != 0
    assert "made no batch" in done.stderr and "raise seq_len" in done.stderr
    assert "loader at" not in done.stdout  # no ratio over nothing
