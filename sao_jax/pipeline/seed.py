"""The SEED job: hindsight-skill SFT after the warm start, then SAO (or GRPO) with self-evolving
OPD (`SeedJob`; presets and the command line: `experiments.alfworld_seed`).

Phases: the warm start (demos -> cloning -> evaluation) -> stage 1: the cloned policy plays
`hindsight.sft_episodes`, an analyzer writes one skill per episode (rule-based on the game's
ground truth by default), skills (analysis prompt -> skill) and acting data (won episodes as
played, lost ones relabelled by the expert) go to the `seed_sft` tenant, and one cloner
fine-tunes on both -> critic warm-up -> RL where every learner iteration lets the current
policy write a skill per trajectory, re-scores the sampled actions with it in context and adds
`learner.opd.weight * seed_opd_loss` (`SeedLearner`) -> evaluation without skills. Same
outputs and summary keys as the plain job, plus `seed_*` keys (stage-1 counts, seconds of
analysis and re-scoring per iteration, mean delta and gate). Stage-2 skills go to the `skills`
tenant: `python -m sao_jax.seed inspect DIR/atdp`.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from atdp_io import lineage
from sao_jax.distributed.host_sync import allgather_numbers
from sao_jax.losses.seed import SKILL_KINDS
from sao_jax.metrics import MetricsWriter, ProgressBar, read_metrics
from sao_jax.pipeline.config import ExperimentConfig
from sao_jax.pipeline.evaluation import evaluate_policy
from sao_jax.pipeline.job import Job
from sao_jax.pipeline.lengths import DEMOS
from sao_jax.pipeline.relabel import relabel_all, relabel_with_expert
from sao_jax.pipeline.setup import Run
from sao_jax.pipeline.summary import CURVE_KEYS, success_key
from sao_jax.pipeline.warm_start import ExtraDemos
from sao_jax.seed import (
    SeedLearner,
    episode_records,
    label_and_store,
    make_analyzer,
    skill_block_ids,
    write_skills,
)
from sao_jax.seed.analyzers import RuleBasedAnalyzer
from sao_jax.seed.config import SeedConfig, hindsight_rules
from sao_jax.seed.skill_acting import with_skill_in_context
from sao_jax.train import BehaviourCloner, Learner, get_algorithm

SFT_PLAY, SEED_SFT, SKILLS = "seed_play", "seed_sft", "skills"
AFTER_SFT = "after_sft"  # the evaluation tag (and summary suffix) of the policy after stage 1
ANALYZER_SAMPLER = -2  # Run.sampler index of the self-policy analyzer (-1: periodic eval)


@dataclasses.dataclass
class SeedExperimentConfig(ExperimentConfig):
    """An `alfworld_sao` run plus SEED (`hindsight`); `learner.algorithm` sao_seed / grpo_seed
    switches stage 2 on (a plain algorithm runs stage 1 only)."""

    hindsight: SeedConfig = dataclasses.field(default_factory=SeedConfig)

    def __post_init__(self):
        super().__post_init__()
        experts = self.env.env_class.experts
        spec = self.hindsight
        skill_acting = spec.sft_skill_acting or spec.warm_start_skill_fraction > 0
        if skill_acting and spec.sft_skill_expert not in experts:
            raise ValueError(
                f"hindsight.sft_skill_expert must be one of {experts} for env "
                f"{self.env.name!r}, got {spec.sft_skill_expert!r}"
            )
        if spec.warm_start_skill_fraction > 0 and hindsight_rules(self.env.name) is None:
            raise ValueError(
                f"hindsight.warm_start_skill_fraction needs the env's rule-based hindsight; "
                f"env {self.env.name!r} has none"
            )


def with_seed(base: ExperimentConfig, hindsight: SeedConfig) -> SeedExperimentConfig:
    """`base` with SEED: `hindsight` and the SAO + SEED algorithm."""
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(ExperimentConfig)}
    fields["learner"] = dataclasses.replace(base.learner, algorithm="sao_seed")
    return SeedExperimentConfig(**fields, hindsight=hindsight)


# -- stage 1 -----------------------------------------------------------------------------------


def hindsight_sft(run: Run, log: MetricsWriter) -> dict:
    """Play with the warm-started policy, label every episode with a skill, fine-tune jointly on
    acting and analysing; `run.policy` becomes the fine-tuned policy. Returns stage-1 counts."""
    spec, config = run.config.hindsight, run.config
    if spec.sft_steps == 0:
        return {}
    start = time.perf_counter()
    play, sft = run.tenant(SFT_PLAY), run.tenant(SEED_SFT)  # this process's partitions
    publisher = run.publisher()
    publisher.publish(run.policy, 0)
    with run.store.writer(play) as writer:
        engine = run.engine(publisher, writer, asynchronous=False, tenant=SFT_PLAY, seed_offset=900)
        played_stats = run.combined_stats(engine.generate(run.share(spec.sft_episodes)))
    reader = run.store.reader(play, principal=play)
    reader.refresh()
    played = [reader.read(i) for i in reader.trajectory_ids() if i.startswith(engine.run_id)]
    sampler = run.sampler(ANALYZER_SAMPLER)
    sampler.update_weights(run.local_copy(run.policy), 0)  # a collective with several processes
    analyzer = make_analyzer(
        spec.sft_analyzer,
        config=spec,
        sampler=sampler,
        tokenizer=run.tokenizer,
        env=config.env.name,
    )
    labelled, skills = label_and_store(
        run.store, played, analyzer, run.tokenizer, tenant=sft, max_actions=spec.max_actions
    )
    acting = []
    if spec.sft_acting:
        won = [t for t in played if t.outcome and t.outcome.success]
        lost = [t for t in played if not (t.outcome and t.outcome.success)]
        acting = [_to_tenant(t, sft) for t in won] + relabel_all(
            lost,
            run.tokenizer,
            think=config.rollout.think,
            max_new_tokens=config.rollout.max_new_tokens,
            tenant=sft,
            expert=config.env.expert,
        )
    with_skill = skill_acting_data(run, played, skills, tenant=sft) if spec.sft_skill_acting else []
    if acting or with_skill:
        with run.store.writer(sft) as writer:
            writer.append([*acting, *with_skill])
    # the same row length on every process (a cloning step spans them all)
    seq_len = config.warm_start.seq_len + (spec.max_skill_tokens if spec.sft_skill_acting else 0)
    loader = run.loader(SEED_SFT, rows=config.warm_start.rows, seq_len=seq_len)
    cloner = BehaviourCloner(
        run.policy,
        dataclasses.replace(config.warm_start.optimizer, learning_rate=spec.sft_learning_rate),
        moe_aux=config.learner.moe,
        pack_rows=config.learner.pack_rows,
        pack_factor=config.warm_start.pack_factor,
        mesh=run.mesh,  # with several processes a cloning step spans all of them
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
    skills, acted, with_skilled = allgather_numbers(
        [labelled["skills"], len(acting), len(with_skill)]
    ).sum(axis=0)
    stats = {
        "sft_played_episodes": played_stats["episodes"],
        "sft_played_success": played_stats["success_rate"],
        "sft_skills": float(skills),  # over every process
        "sft_acting_episodes": int(acted),
        "sft_skill_acting_episodes": int(with_skilled),
        "sft_seconds": time.perf_counter() - start,
    }
    log.write(run.step, {f"sft/{k}": v for k, v in stats.items()})
    return stats


def skill_acting_data(run: Run, played, skills, *, tenant: str) -> list:
    """Acting turns with a skill in context: each played episode that got a skill, relabelled
    by `hindsight.sft_skill_expert` in the states the policy reached, every prompt prefixed with
    that skill's block (`sao_jax.seed.skill_acting`)."""
    spec, config = run.config.hindsight, run.config
    by_episode = {s.trajectory_id: s for s in skills}
    out = []
    for trajectory in played:
        skill = by_episode.get(trajectory.trajectory_id)
        if skill is None:
            continue
        relabelled = relabel_with_expert(
            trajectory,
            run.tokenizer,
            think=config.rollout.think,
            max_new_tokens=config.rollout.max_new_tokens,
            tenant=tenant,
            expert=spec.sft_skill_expert,
        )
        if relabelled is not None:
            block = skill_block_ids(run.tokenizer, skill.text)
            out.append(
                with_skill_in_context(relabelled, block, max_skill_tokens=spec.max_skill_tokens)
            )
    return out


def warm_start_skill_demos(run: Run, demos: list) -> list:
    """Acting turns with a skill in context for the warm start (`ExtraDemos.build`): a seeded
    `hindsight.warm_start_skill_fraction` of `demos` (the expert demos, or a DAgger round's
    played games), each labelled by the env's rule-based analyzer and relabelled by
    `hindsight.sft_skill_expert` with that skill's block in front of every prompt
    (`skill_acting_data`), for the demos tenant."""
    spec, config = run.config.hindsight, run.config
    count = math.ceil(spec.warm_start_skill_fraction * len(demos))
    if count == 0:
        return []
    demos = sorted(demos, key=lambda t: t.trajectory_id)
    rng = np.random.default_rng(config.seed + run.seed_offset())
    chosen = [demos[i] for i in sorted(rng.choice(len(demos), size=count, replace=False))]
    analyzer = make_analyzer("rule", config=spec, tokenizer=run.tokenizer, env=config.env.name)
    records, _ = episode_records(chosen)
    skills = analyzer.analyze(records)
    return skill_acting_data(run, chosen, skills, tenant=run.tenant(DEMOS))


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


def make_learner(run: Run) -> Learner:
    """A `SeedLearner` for SEED algorithms (self-policy analyzer on its own sampler, skills
    written to the `skills` tenant), a plain `Learner` otherwise."""
    config, spec = run.config, run.config.hindsight
    if not get_algorithm(config.learner.algorithm).opd:
        return Learner(config.learner, run.policy, mesh=run.mesh)
    analyzer = make_analyzer(
        spec.opd_analyzer,
        config=spec,
        sampler=run.sampler(ANALYZER_SAMPLER),
        tokenizer=run.tokenizer,
        env=config.env.name,
    )
    on_skills = None
    if spec.store_skills:

        def on_skills(records, skills):
            write_skills(
                run.store,
                records,
                skills,
                run.tokenizer,
                tenant=run.tenant(SKILLS),
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
        env=config.env.name,
        on_skills=on_skills,
        # the rule-based analyzers read each episode's game spec from its stored header
        store=run.store if isinstance(analyzer, RuleBasedAnalyzer) else None,
        local_copy=run.local_copy if run.processes > 1 else None,
        mesh=run.mesh,
    )


# summary key -> metrics key of SEED's per-iteration signal and cost (means over RL iterations)
SEED_SUMMARY_KEYS = {
    "seed_analysis_seconds_per_iter": "seed/analysis_seconds",
    "seed_rescore_seconds_per_iter": "seed/rescore_seconds",
    "seed_opd_delta_mean": "policy/opd_delta_mean",
    "seed_opd_delta_p50": "policy/opd_delta_p50",
    "seed_opd_gate_mean": "policy/opd_gate_mean",
    "seed_opd_gate_rate": "policy/opd_gate_rate",
    "seed_opd_token_grad_share": "policy/opd_token_grad_share",
    "seed_opd_token_grad_cos": "policy/opd_token_grad_cos",
    "seed_opd_grad_share": "policy/opd_grad_share",
    "seed_opd_loss": "policy/opd_loss",
    # mode "kl": the KL from the teacher's top k, and its favourite token under each model
    "seed_opd_kl": "policy/opd_kl",
    "seed_opd_teacher_top1_logp": "policy/opd_teacher_top1_logp",
    "seed_opd_student_top1_logp": "policy/opd_student_top1_logp",
    **{f"seed_opd_gap_{kind}": f"policy/opd_gap_{kind}" for kind in SKILL_KINDS},
    **{f"seed_skills_{kind}": f"seed/skills_{kind}" for kind in SKILL_KINDS},
}


def seed_summary(records: list[dict], sft: dict) -> dict:
    """SEED's cost and signal over the run's RL iterations (means of `SEED_SUMMARY_KEYS`;
    None when never logged, a per-kind gap over the iterations that had that kind), plus
    stage-1 counts."""
    out = {f"seed_{k}": v for k, v in sft.items()}
    for name, key in SEED_SUMMARY_KEYS.items():
        values = [r[key] for r in records if isinstance(r.get(key), int | float)]
        values = [v for v in values if math.isfinite(v)]
        out[name] = float(np.mean(values)) if values else None
    return out


class SeedJob(Job):
    """The job with SEED: skill SFT after the warm start, a `SeedLearner` for SEED algorithms,
    `seed_*` keys in the summary. Several processes as the plain job: each plays, labels and
    writes its own partitions (`seed_play-p<k>`, `seed_sft-p<k>`, `skills-p<k>`), cloning and
    learner steps span them all."""

    multi_process = True
    curve_keys = (
        *CURVE_KEYS,
        "policy/opd_gate_rate",
        "policy/opd_delta_mean",
        "policy/opd_token_grad_share",
        "sft/nll",
    )

    def make_learner(self) -> Learner:
        return make_learner(self.state)

    def extra_demos(self) -> ExtraDemos | None:
        spec = self.state.config.hindsight
        if spec.warm_start_skill_fraction <= 0:
            return None
        return ExtraDemos(
            build=warm_start_skill_demos, extra_tokens=spec.max_skill_tokens, name="skill_acting"
        )

    def after_warm_start(self) -> None:
        # stage-1 counts ride in the evals of every checkpoint, so a resumed run reports them
        self.state.evals["seed_sft"] = hindsight_sft(self.state, self.log)
        spec = self.state.config.hindsight
        if spec.sft_steps and spec.eval_after_sft:
            evaluate_policy(self.state, self.log, self.state.policy, 0, AFTER_SFT)

    def summarize(self) -> dict:
        sft = dict(self.state.evals.get("seed_sft") or {})
        after = {
            success_key(split, AFTER_SFT): result["success"]
            for split, result in self.state.evals.get(AFTER_SFT, {}).items()
        }
        summary = seed_summary(read_metrics(self.state.out), sft)
        return dict(super().summarize(), **after, **summary)


def run(config: SeedExperimentConfig) -> dict:
    """Run (or resume) the SEED job; returns the summary also written to DIR/summary.json."""
    return SeedJob(config).run()
