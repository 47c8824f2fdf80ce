"""`python -m experiments.alfworld_seed` end to end on the micro preset: both SEED stages."""

import json
import sys
from pathlib import Path

import pytest

from atdp_io import AtdpStore
from experiments import alfworld_seed, compare_algos
from sao_jax.distributed.local_launch import launch_local
from sao_jax.losses import SKILL_KINDS
from sao_jax.metrics import read_metrics
from sao_jax.pipeline.seed import SeedExperimentConfig
from sao_jax.pipeline.setup import build_tokenizer
from sao_jax.seed import episode_records, load_skills, make_analyzer, skill_block_ids

REPO = Path(__file__).parents[2]
MICRO = [
    "--config",
    "micro",
    "progress=false",
    "tensorboard=false",
    "eval.num_games=2",
    "warm_start.demo_episodes=4",
    "warm_start.dagger_rounds=0",
    "rl.policy_steps=1",
]


@pytest.mark.slow
def test_a_seed_run_does_stage_one_and_opd_and_writes_the_summary(tmp_path):
    argv = [*MICRO, "hindsight.sft_skill_acting=true", "--out", str(tmp_path)]
    summary = alfworld_seed.main(argv)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert (
        saved["algorithm"] == "sao_seed" and saved["policy_steps"] == summary["policy_steps"] == 1
    )
    for key in ("unseen_success_start", "unseen_success_end", "seen_success_end", "wall_seconds"):
        assert saved[key] is not None, key
    assert saved["seed_sft_skills"] == 2 and saved["seed_sft_acting_episodes"] >= 1
    assert saved["seed_sft_skill_acting_episodes"] >= 1
    # stage 1 alone is evaluated like the start and the end, before any RL step
    for split in ("unseen", "seen"):
        assert 0 <= saved[f"{split}_success_after_sft"] <= 1, split
    assert (
        saved["seed_analysis_seconds_per_iter"] > 0 and saved["seed_rescore_seconds_per_iter"] > 0
    )
    assert 0 < saved["seed_opd_gate_mean"] < 1
    assert 0 <= saved["seed_opd_gate_rate"] <= 1 and saved["seed_opd_token_grad_share"] > 0
    assert saved["seed_opd_grad_share"] is None  # learner.opd.grad_share is off by default
    records = read_metrics(tmp_path)
    assert any("sft/nll" in r for r in records)
    rl = [r for r in records if r.get("phase") == 1.0]
    assert rl and all("policy/opd_loss" in r and "seed/skills" in r for r in rl)
    # every stage-2 skill is classified; the per-kind gap is logged for each kind
    for r in rl:
        assert sum(r[f"seed/skills_{k}"] > 0 for k in SKILL_KINDS) >= 1
        assert all(f"policy/opd_gap_{k}" in r for k in SKILL_KINDS)
    store = AtdpStore.open(str(tmp_path / "atdp"), create=False)
    stage1 = load_skills(store, tenant="seed_sft")
    assert len(stage1) == 2 and {s.skill.analyzer for s in stage1} == {"rule_alfworld"}
    # acting turns with the skill in context: each prompt opens with its episode's skill block
    reader = store.reader("seed_sft", principal="seed_sft")
    reader.refresh()
    word = build_tokenizer(alfworld_seed.parse(MICRO))
    blocks = {s.skill.trajectory_id: skill_block_ids(word, s.skill.text) for s in stage1}
    with_skill = [reader.read(i) for i in reader.trajectory_ids() if i.endswith("-skill")]
    assert len(with_skill) == saved["seed_sft_skill_acting_episodes"]
    for trajectory in with_skill:
        (source,) = trajectory.header.derived_from
        block = blocks[source.trajectory_id]
        calls = [e.llm for e in trajectory.events if e.llm is not None]
        assert calls and all(c.input_ids[: len(block)].tolist() == block for c in calls)
    stage2 = load_skills(store, tenant="skills")
    assert stage2 and {s.skill.analyzer for s in stage2} == {"self_policy"}


@pytest.mark.slow
def test_a_seed_run_distils_the_teachers_distribution_with_mode_kl(tmp_path):
    """`learner.opd.mode=kl`: the re-scoring keeps the teacher's top k and the step adds the KL
    from it; the summary and the comparison columns carry its figures."""
    argv = [*MICRO, "learner.opd.mode=kl", "learner.opd.top_k=8", "--out", str(tmp_path)]
    alfworld_seed.main(argv)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["policy_steps"] == 1 and saved["seed_opd_kl"] > 0
    assert saved["seed_opd_loss"] == pytest.approx(saved["seed_opd_kl"])
    assert saved["seed_opd_teacher_top1_logp"] <= 0 and saved["seed_opd_student_top1_logp"] <= 0
    assert saved["seed_opd_gate_mean"] is None  # no gate on sampled tokens in this mode
    rl = [r for r in read_metrics(tmp_path) if r.get("phase") == 1.0]
    assert rl and all(0 < r["policy/opd_teacher_mass"] <= 1 for r in rl)
    columns = compare_algos.seed_columns([saved])
    assert columns["opd_kl"] == saved["seed_opd_kl"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("opd_mode", ["gated", "kl"])
def test_a_seed_run_spans_two_processes(tmp_path, opd_mode):
    """Like alfworld_sao's multi-process run: 2 local processes x 2 fake devices, each playing,
    labelling and writing its own partitions; cloning and learner steps span both. In mode kl
    each process reads back its own rows of the teacher's top k too."""
    shared = tmp_path / "bucket"  # storage every "host" sees
    argv = [
        *MICRO, "--out", str(tmp_path / "out"), f"atdp_path={shared / 'atdp'}",
        f"checkpoint_dir={shared / 'checkpoints'}", "mesh.ici.fsdp=-1", "mesh.ici.expert=2",
        "mesh.dcn.data=-1", "mesh.dcn.fsdp=1", f"learner.opd.mode={opd_mode}",
    ]  # fmt: skip
    command = [sys.executable, "-m", "experiments.alfworld_seed", *argv]
    result = launch_local(
        command, 2, logs=tmp_path / "logs", devices_per_process=2, timeout_s=600, cwd=REPO
    )
    assert result.ok, result.describe()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["algorithm"] == "sao_seed" and summary["policy_steps"] == 1
    # micro's 2 stage-1 episodes: one per process, each labelled, counted over both
    assert summary["seed_sft_played_episodes"] == 2 and summary["seed_sft_skills"] == 2
    store = AtdpStore.open(str(shared / "atdp"), create=False)
    for tenant in ("seed_play", "seed_sft"):
        assert {f"{tenant}-p0", f"{tenant}-p1"} <= set(store.tenants())
    for process in (0, 1):
        assert len(load_skills(store, tenant=f"seed_sft-p{process}")) == 1
    # stage 2: the processes that brought rows wrote their skills to their own partition
    written = [t for t in store.tenants() if t.startswith("skills-p")]
    assert written and all(load_skills(store, tenant=t) for t in written)
    rl = [r for r in read_metrics(tmp_path / "out") if r.get("phase") == 1.0]
    assert rl and all("policy/opd_loss" in r and "policy/opd_delta_p50" in r for r in rl)
    if opd_mode == "kl":
        assert all(r["policy/opd_kl"] > 0 and r["policy/opd_teacher_mass"] > 0 for r in rl)


@pytest.mark.slow
def test_the_warm_start_clones_skill_carrying_turns_beside_the_demos(tmp_path):
    overrides = [
        *MICRO, "warm_start.dagger_rounds=1", "hindsight.warm_start_skill_fraction=0.5",
        "hindsight.sft_steps=0",
    ]  # fmt: skip
    alfworld_seed.main([*overrides, "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "summary.json").read_text())
    store = AtdpStore.open(str(tmp_path / "atdp"), create=False)
    sources = {}  # every episode a skill-carrying one may derive from
    for tenant in ("demos", "dagger"):
        reader = store.reader(tenant, principal=tenant)
        reader.refresh()
        sources.update({i: reader.read(i) for i in reader.trajectory_ids()})
    with_skill = [t for i, t in sources.items() if i.endswith("-skill")]
    derived = {t.header.derived_from[0].trajectory_id: t for t in with_skill}
    demos = [i for i in sources if i.startswith("demos-") and "-relabel" not in i]
    played = [i for i in sources if i.startswith("dagger-") and "-relabel" not in i]
    # half of micro's 4 demos and of the DAgger round's 2 played games (the policy's own
    # states), each relabelled by the planner with its skill block in front of every prompt
    assert len(demos) == 4 and len(played) == 2
    assert len(set(derived) & set(demos)) == 2 and len(set(derived) & set(played)) == 1
    assert len(with_skill) == 3 and saved["warm_start"]["skill_acting_episodes"] == 2
    config = alfworld_seed.parse(overrides)
    word = build_tokenizer(config)
    analyzer = make_analyzer("rule", config=config.hindsight, tokenizer=word, env=config.env.name)
    for source_id, trajectory in derived.items():
        source = sources[source_id]
        (skill,) = analyzer.analyze(episode_records([source])[0])
        block = skill_block_ids(word, skill.text)
        calls, plain = _calls(trajectory), _calls(source)
        assert calls and all(c.input_ids[: len(block)].tolist() == block for c in calls)
        assert [c.input_ids[len(block) :].tolist() for c in calls] == [
            c.input_ids.tolist() for c in plain[: len(calls)]
        ]
        assert {c.decoding.extra["policy"] for c in calls} == {"expert-oracle"}
    # the counts are logged with the demos' and the round's own, and the cloning rows grew to
    # hold the longer turns (at the demos' own seq_len every skill-carrying one is dropped)
    records = read_metrics(tmp_path)
    (demo_record,) = [r for r in records if "demos/skill_acting_episodes" in r]
    (round_record,) = [r for r in records if "dagger/skill_acting_episodes" in r]
    assert demo_record["demos/skill_acting_episodes"] == 2
    assert round_record["dagger/skill_acting_episodes"] == 1
    assert saved["warm_start"]["demos_too_long_fraction"] == 0.0
    longest = max(len(c.input_ids) + len(c.output_ids) for t in with_skill for c in _calls(t))
    assert longest > config.warm_start.seq_len


def _calls(trajectory):
    return [e.llm for e in trajectory.events if e.llm is not None]


def test_a_warm_start_skill_fraction_outside_zero_to_one_is_refused(capsys):
    for value in ("-0.1", "1.5"):
        with pytest.raises(SystemExit):
            alfworld_seed.parse(
                ["--config", "micro", f"hindsight.warm_start_skill_fraction={value}"]
            )
        assert "warm_start_skill_fraction must be in [0, 1]" in capsys.readouterr().err
    argv = ["--config", "micro", "hindsight.warm_start_skill_fraction=0.5"]
    with pytest.raises(SystemExit):
        alfworld_seed.parse([*argv, "hindsight.sft_skill_expert=x"])
    assert "hindsight.sft_skill_expert must be one of" in capsys.readouterr().err


def test_bad_seed_overrides_are_named(capsys):
    with pytest.raises(SystemExit):
        alfworld_seed.parse(["--config", "micro", "hindsight.opd_analyzer=oracle"])
    assert "oracle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_seed.parse(["--config", "micro", "learner.algorithm=seed"])
    assert "unknown algorithm 'seed'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_seed.parse(
            ["--config", "micro", "hindsight.sft_skill_acting=true", "hindsight.sft_skill_expert=x"]
        )
    assert "hindsight.sft_skill_expert must be one of ('search', 'oracle')" in (
        capsys.readouterr().err
    )


def test_compare_algos_gives_seed_algorithms_a_seed_config(tmp_path):
    from experiments import compare_algos

    config = compare_algos.CompareConfig(out_dir=str(tmp_path), preset="micro")
    assert {"sao_seed", "grpo_seed"} <= set(config.algorithms)
    run = compare_algos.run_config(config, "grpo_seed", 1, str(tmp_path / "sao-seed1"))
    assert isinstance(run, SeedExperimentConfig)
    assert (run.learner.algorithm, run.seed) == ("grpo_seed", 1)
    assert run.warm_start.from_run == str(tmp_path / "sao-seed1")
    assert run.hindsight == alfworld_seed.PRESETS["micro"].hindsight
    plain = compare_algos.run_config(config, "sao", 1, None)
    assert not hasattr(plain, "hindsight") and plain.learner.algorithm == "sao"


def test_compare_algos_reports_seed_diagnostics_and_cost_columns(tmp_path):
    from experiments import compare_algos

    base = {"unseen_success_start": 0.2, "unseen_success_end": 0.3, "seen_success_end": 0.3,
            "policy_steps": 2, "rl_env_steps": 8, "rl_seconds": 1.0}  # fmt: skip
    seed = {"seed_opd_delta_mean": -0.1, "seed_opd_delta_p50": -0.05, "seed_opd_gate_rate": 0.4,
            "seed_opd_grad_share": None, "seed_opd_token_grad_share": 0.02,
            "seed_opd_gap_fact": 0.3, "seed_opd_gap_failed_command": None,
            "seed_opd_gap_procedure": 0.5, "seed_opd_gap_other": -0.2,
            "seed_analysis_seconds_per_iter": 0.1, "seed_rescore_seconds_per_iter": 0.4}  # fmt: skip
    for name, summary in (("sao", base), ("sao_seed", {**base, **seed})):
        for run_seed, shift in ((0, 0.0), (1, 0.2)):
            run = tmp_path / f"{name}-seed{run_seed}"
            run.mkdir()
            moved = {k: v + shift if isinstance(v, float) and k.startswith("seed_opd_gap") else v
                     for k, v in summary.items()}  # fmt: skip
            (run / "summary.json").write_text(json.dumps(moved))
            record = {"step": 1, "phase": 1.0, "policy/entropy": 1.0}
            (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    config = compare_algos.CompareConfig(
        out_dir=str(tmp_path), resume=True, algorithms=("sao", "sao_seed"), seeds=(0, 1)
    )
    rows = {row["algorithm"]: row for row in compare_algos.compare(config)["rows"]}
    assert "opd_gap" not in rows["SAO"]
    seeded = rows["SAO+SEED"]
    assert seeded["opd_gap"] == -0.1 and seeded["gate_rate"] == 0.4
    assert seeded["gap_fact"] == pytest.approx(0.4) and seeded["gap_procedure"] == 0.6
    assert seeded["opd_grad_share"] is None and seeded["gap_failed_command"] is None
    assert seeded["seed_s_per_iter"] == pytest.approx(0.5)
    table = (tmp_path / "comparison.txt").read_text()
    assert "gate_rate" in table and "seed_s_per_iter" in table
