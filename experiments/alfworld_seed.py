"""SEED on ALFWorld: hindsight-skill SFT, then SAO (or GRPO) with self-evolving OPD.

    python -m experiments.alfworld_seed                          # tiny preset, SAO + SEED
    python -m experiments.alfworld_seed learner.algorithm=grpo_seed --out runs/grpo_seed
    python -m experiments.alfworld_seed --config micro hindsight.opd_analyzer=rule_alfworld

Phases: the `alfworld_sao` warm start (demos -> cloning -> evaluation) -> stage 1: the cloned
policy plays `hindsight.sft_episodes`, an analyzer writes one skill per episode (rule-based on
the game's ground truth by default), skills (analysis prompt -> skill) and acting data (won
episodes as played, lost ones relabelled by the expert) go to the `seed_sft` tenant, and one
cloner fine-tunes on both -> critic warm-up -> RL where every learner iteration lets the
current policy write a skill per trajectory, re-scores the sampled actions with it in context
and adds `learner.opd_lambda * seed_opd_loss` (`SeedLearner`) -> evaluation without skills.
Same outputs and summary keys as `alfworld_sao`, plus `seed_*` keys (stage-1 counts, seconds of
analysis and re-scoring per iteration, mean delta and gate). Stage-2 skills go to the `skills`
tenant: `python -m sao_jax.seed inspect DIR/atdp`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from atdp_io import lineage
from experiments import alfworld_run as phases
from experiments import alfworld_sao
from experiments.alfworld_sao import ExperimentConfig
from experiments.alfworld_warm_start import relabel_all
from sao_jax.config_cli import parse_cli
from sao_jax.metrics import MetricsWriter, ProgressBar, read_metrics, save_summary
from sao_jax.rollout import WeightPublisher
from sao_jax.seed import SeedLearner, label_and_store, make_analyzer, write_skills
from sao_jax.seed.config import SeedConfig
from sao_jax.train import BehaviourCloner, Learner, get_algorithm

SFT_PLAY, SEED_SFT, SKILLS = "seed_play", "seed_sft", "skills"
ANALYZER_SAMPLER = -2  # Run.sampler index of the self-policy analyzer (-1: periodic eval)


@dataclasses.dataclass
class SeedExperimentConfig(ExperimentConfig):
    """An `alfworld_sao` run plus SEED (`hindsight`); `learner.algorithm` sao_seed / grpo_seed
    switches stage 2 on (a plain algorithm runs stage 1 only)."""

    hindsight: SeedConfig = dataclasses.field(default_factory=SeedConfig)


def _with_seed(base: ExperimentConfig, hindsight: SeedConfig) -> SeedExperimentConfig:
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ExperimentConfig)}
    fields["learner"] = dataclasses.replace(base.learner, algorithm="sao_seed")
    return SeedExperimentConfig(**fields, hindsight=hindsight)


PRESETS = {
    "tiny": _with_seed(alfworld_sao.tiny(), SeedConfig()),
    "small": _with_seed(alfworld_sao.small(), SeedConfig(sft_episodes=256, sft_steps=200)),
    "micro": _with_seed(
        alfworld_sao.micro(),
        SeedConfig(sft_episodes=2, sft_steps=1, max_skill_new_tokens=8, max_skill_tokens=48),
    ),
}


def parse(argv: list[str] | None = None) -> SeedExperimentConfig:
    """The run's config from the command line (`out_dir` defaults to a timestamped dir)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    has_out = any(a == "--out" or a.startswith("--out=") for a in argv)
    if not has_out and not any(a in ("-h", "--help") for a in argv):
        argv = ["--out", str(Path("runs/alfworld_seed") / time.strftime("%Y%m%d-%H%M%S")), *argv]
    return parse_cli(
        argv,
        PRESETS,
        prog="python -m experiments.alfworld_seed",
        description=__doc__.split("\n")[0],
    )


# -- stage 1 -----------------------------------------------------------------------------------


def hindsight_sft(run: phases.Run, log: MetricsWriter) -> dict:
    """Play with the warm-started policy, label every episode with a skill, fine-tune jointly on
    acting and analysing; `run.policy` becomes the fine-tuned policy. Returns stage-1 counts."""
    spec, config = run.config.hindsight, run.config
    if spec.sft_steps == 0:
        return {}
    start = time.perf_counter()
    publisher = WeightPublisher()
    publisher.publish(run.policy, 0)
    with run.store.writer(SFT_PLAY) as writer:
        engine = run.engine(publisher, writer, asynchronous=False, tenant=SFT_PLAY, seed_offset=900)
        played_stats = engine.generate(spec.sft_episodes)
    reader = run.store.reader(SFT_PLAY, principal=SFT_PLAY)
    reader.refresh()
    played = [reader.read(i) for i in reader.trajectory_ids() if i.startswith(engine.run_id)]
    sampler = run.sampler(ANALYZER_SAMPLER)
    sampler.update_weights(run.policy, 0)
    analyzer = make_analyzer(
        spec.sft_analyzer, config=spec, sampler=sampler, tokenizer=run.tokenizer
    )
    labelled = label_and_store(
        run.store, played, analyzer, run.tokenizer, tenant=SEED_SFT, max_actions=spec.max_actions
    )
    acting = []
    if spec.sft_acting:
        won = [t for t in played if t.outcome and t.outcome.success]
        lost = [t for t in played if not (t.outcome and t.outcome.success)]
        acting = [_to_tenant(t, SEED_SFT) for t in won] + relabel_all(
            lost,
            run.tokenizer,
            think=config.rollout.think,
            max_new_tokens=config.rollout.max_new_tokens,
            tenant=SEED_SFT,
        )
        with run.store.writer(SEED_SFT) as writer:
            writer.append(acting)
    loader = run.loader(SEED_SFT, rows=config.warm_start.rows, seq_len=config.warm_start.seq_len)
    cloner = BehaviourCloner(
        run.policy,
        dataclasses.replace(config.warm_start.optimizer, learning_rate=spec.sft_learning_rate),
        moe_aux=config.learner.moe,
    )
    cloner.trained_on = run.trained_on  # skills and acting data: in the first RL checkpoint's
    bar = ProgressBar(spec.sft_steps, desc="skill SFT", keys=("nll",), disable=not config.progress)

    def report(step: int, metrics: dict) -> None:
        run.step += 1
        log.write(run.step, {f"sft/{k}": v for k, v in metrics.items()})
        bar.update(metrics=metrics)

    with bar:
        cloner.run(iter(loader.epoch(seed=config.seed, num_epochs=None)), spec.sft_steps, report)
    run.policy = cloner.policy_module()
    stats = {
        "sft_played_episodes": played_stats["episodes"],
        "sft_played_success": played_stats["success_rate"],
        "sft_skills": labelled["skills"],
        "sft_acting_episodes": len(acting),
        "sft_seconds": time.perf_counter() - start,
    }
    log.write(run.step, {f"sft/{k}": v for k, v in stats.items()})
    return stats


def _to_tenant(trajectory, tenant: str):
    """A copy of `trajectory` in `tenant`: derived data, purged with the original."""
    header = lineage.derived_header(
        [trajectory],
        tenant=tenant,
        **{
            f.name: getattr(trajectory.header, f.name)
            for f in dataclasses.fields(trajectory.header)
            if f.name not in ("governance", "derived_from")
        },
    )
    return dataclasses.replace(trajectory, header=header)


# -- stage 2 -----------------------------------------------------------------------------------


def make_learner(run: phases.Run) -> Learner:
    """A `SeedLearner` for SEED algorithms (self-policy analyzer on its own sampler, skills
    written to the `skills` tenant), a plain `Learner` otherwise."""
    config, spec = run.config, run.config.hindsight
    if not get_algorithm(config.learner.algorithm).opd:
        return Learner(config.learner, run.policy)
    analyzer = make_analyzer(
        spec.opd_analyzer,
        config=spec,
        sampler=run.sampler(ANALYZER_SAMPLER),
        tokenizer=run.tokenizer,
    )
    on_skills = None
    if spec.store_skills:

        def on_skills(records, skills):
            write_skills(
                run.store,
                records,
                skills,
                run.tokenizer,
                tenant=SKILLS,
                max_actions=spec.max_actions,
                skip_purged=True,  # an episode purged while training leaves no skill behind
            )

    return SeedLearner(
        config.learner,
        run.policy,
        analyzer=analyzer,
        tokenizer=run.tokenizer,
        max_skill_tokens=spec.max_skill_tokens,
        think=config.rollout.think,
        on_skills=on_skills,
    )


def seed_summary(records: list[dict], sft: dict) -> dict:
    """SEED's cost and signal over the run's RL iterations (means), plus stage-1 counts."""
    out = {f"seed_{k}": v for k, v in sft.items()}
    keys = {
        "seed_analysis_seconds_per_iter": "seed/analysis_seconds",
        "seed_rescore_seconds_per_iter": "seed/rescore_seconds",
        "seed_opd_delta_mean": "policy/opd_delta_mean",
        "seed_opd_gate_mean": "policy/opd_gate_mean",
        "seed_opd_loss": "policy/opd_loss",
    }
    for name, key in keys.items():
        values = [r[key] for r in records if isinstance(r.get(key), int | float)]
        out[name] = float(np.mean(values)) if values else None
    return out


def run(config: SeedExperimentConfig) -> dict:
    """Run (or resume) the experiment; returns the summary also written to DIR/summary.json."""
    state = phases.Run(config)
    learner = make_learner(state)
    meta = phases.restore(state, learner) if config.resume else None
    sft: dict = dict(state.evals.get("seed_sft") or {})
    with MetricsWriter(
        state.out,
        tensorboard=config.tensorboard,
        resume_from_step=state.step if config.resume else None,
    ) as log:
        if meta is None:
            phases.warm_start(state, log)
            sft = hindsight_sft(state, log)
            learner = make_learner(state)
            learner.trained_on = state.trained_on  # warm start + skill SFT data, then RL
        elif meta["phase"] != "rl" and phases.budget_left(state, learner):
            meta["phase"] = "rl"
            state.evals.pop("end", None)
        if meta is None or meta["phase"] == "rl":
            publisher = WeightPublisher()
            publisher.publish(learner.policy_module(copy=False), learner.policy_version)
            if meta is None:
                phases.critic_warmup(state, log, learner, publisher)
                _checkpoint(state, learner, sft, phase="rl")
            phases.reinforcement_learning(state, log, learner, publisher, state.data_state)
        if "end" not in state.evals:
            phases.evaluate_policy(
                state, log, learner.policy_module(), learner.policy_version, "end"
            )
        _checkpoint(state, learner, sft, phase="done")
    state.checkpointer.wait_until_finished()
    state.checkpointer.close()
    records = read_metrics(state.out)
    summary = dict(phases.summarize(state, learner), **seed_summary(records, sft))
    save_summary(state.out, summary)
    keys = [*phases.CURVE_KEYS, "policy/opd_gate_mean", "policy/opd_delta_mean", "sft/nll"]
    keys = [k for k in keys if any(isinstance(r.get(k), int | float) for r in records)]
    phases.plot_learning_curves(
        records, state.out / "learning_curve.png", keys=keys, title=str(state.out)
    )
    phases.print_summary(summary)
    return summary


def _checkpoint(state: phases.Run, learner: Learner, sft: dict, *, phase: str) -> None:
    """`alfworld_run.checkpoint` plus the stage-1 counts, carried in the metadata's `evals`
    (restored with them, so a resumed run reports them too)."""
    state.evals["seed_sft"] = sft
    phases.checkpoint(state, learner, None, phase=phase)


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary."""
    return run(parse(argv))


if __name__ == "__main__":
    main()
