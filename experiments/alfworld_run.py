"""The phases of an ALFWorld RL run (`experiments.alfworld_sao`): build, clone, evaluate, train.

Data flow: every episode (expert demo, critic warm-up rollout, RL rollout) is written to the
run's ATDP store, one tenant per source, and every batch the learner sees comes back through
`atdp_io`'s grain loader. Only weights travel the other way, through a `WeightPublisher`.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

import grain
import jax
from flax import nnx

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from experiments.alfworld_sao import SPLITS, ExperimentConfig
from experiments.alfworld_warm_start import clone_expert
from sao_jax.checkpoint import Checkpointer, checkpoint_directory
from sao_jax.distributed.host_sync import allgather_json
from sao_jax.distributed.job import Job, setup_job
from sao_jax.distributed.mesh import make_global_mesh
from sao_jax.distributed.resharding import reshard, rollout_shardings
from sao_jax.distributed.runtime import DistributedConfig
from sao_jax.envs.alfworld import vocabulary
from sao_jax.metrics import (
    MetricsWriter,
    ProgressBar,
    plot_learning_curves,
    read_metrics,
    save_summary,
    summary_table,
)
from sao_jax.models import Transformer, get_model_config, init_model, load_hf_qwen3_moe
from sao_jax.rollout import (
    EngineConfig,
    EvalResult,
    RolloutEngine,
    Sampler,
    WeightPublisher,
    combine_snapshots,
    evaluate,
)
from sao_jax.sharding import MeshConfig
from sao_jax.tokenizers import Tokenizer, WordTokenizer, load_tokenizer
from sao_jax.train import Learner, get_algorithm
from sao_jax.train.loop import OnlineTrainer

WARMUP, ROLLOUTS = "warmup", "rollouts"
WARM_START_DIR = "warm_start"
CURVE_KEYS = (
    "batch/success_rate",
    "eval/valid_unseen/success",
    "policy/entropy",
    "policy/clip_frac",
    "policy/grad_norm",
    "critic/explained_variance",
    "batch/staleness_mean",
    "bc/nll",
)

# Samplers keep their compiled kernels; runs in one process (comparisons, resumes, tests) with
# the same model shape reuse them instead of compiling again.
_SAMPLERS: dict[tuple, Sampler] = {}


def build_tokenizer(config: ExperimentConfig) -> Tokenizer:
    """The HF checkpoint's tokenizer, or a word-level one over every ALFWorld text."""
    if config.model.hf_path:
        return load_tokenizer(Path(config.model.hf_path) / "tokenizer.json")
    return WordTokenizer.from_texts([" ".join(vocabulary())])


def build_model(config: ExperimentConfig, tokenizer: Tokenizer, mesh=None) -> Transformer:
    """The policy: a HF checkpoint, or the preset with overrides, randomly initialised; created
    sharded over `mesh` when there is one."""
    overrides = config.model.overrides()
    if config.model.hf_path:
        return load_hf_qwen3_moe(config.model.hf_path, mesh=mesh, **overrides)
    model_config = get_model_config(
        config.model.preset, vocab_size=tokenizer.vocab_size, **overrides
    )
    return init_model(model_config, seed=config.seed, mesh=mesh)


def resolve(config: ExperimentConfig) -> ExperimentConfig:
    """Games and sampling offset by `config.seed` (model init uses it directly); group
    algorithms (GRPO) play `learner.group_size` rollouts of each game, and at least one group
    per policy version."""
    rollout = dataclasses.replace(config.rollout, seed=config.rollout.seed + 1000 * config.seed)
    rl = config.rl
    if get_algorithm(config.learner.algorithm).advantage == "group" and rollout.group_size == 1:
        rollout = dataclasses.replace(rollout, group_size=config.learner.group_size)
        rl = dataclasses.replace(
            rl, episodes_per_version=max(rl.episodes_per_version, rollout.group_size)
        )
    return dataclasses.replace(
        config,
        env=dataclasses.replace(config.env, seed=config.env.seed + 1000 * config.seed),
        rollout=rollout,
        rl=rl,
    )


class Run:
    """What the phases share: config, out dir, store, checkpoints, tokenizer, model, clocks."""

    def __init__(
        self, config: ExperimentConfig, job: Job | None = None, *, multi_process: bool = False
    ):
        # first: joins a multi-process job before anything touches a device
        self.job = job if job is not None else setup_job(config.mesh)
        self.processes = self.job.info.process_count
        self.process = self.job.info.process_index
        if self.processes > 1 and not multi_process:
            raise NotImplementedError(
                f"this run joined {self.processes} processes, but this experiment runs one "
                "process (with any number of its devices in `mesh.*`); multi-process runs: "
                "python -m experiments.alfworld_sao (see docs/scaling.md)"
            )
        _check_process_split(config, self.processes)
        self.mesh = self.job.mesh
        self.config = resolve(config)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = AtdpStore.open(config.atdp_path or str(self.out / "atdp"))
        self.checkpointer = Checkpointer(
            config.checkpoint_dir or self.out / "checkpoints", max_to_keep=config.checkpoint_keep
        )
        self.tokenizer = build_tokenizer(config)
        self.policy = build_model(config, self.tokenizer, self.mesh)
        # Several processes: each samples on a mesh of its own devices (its engine's decode
        # steps are then its own business) and receives weights resharded there.
        self.rollout_mesh, self.rollout_shardings = self.mesh, None
        self._local_template: Transformer | None = None
        if self.processes > 1:
            self.rollout_mesh = make_global_mesh(
                config.mesh.rollout or MeshConfig(), jax.local_devices()
            )
            self.rollout_shardings = rollout_shardings(self.policy, self.rollout_mesh)
            # shapes (and first weights) of this process's samplers; publication replaces them
            self._local_template = self.local_copy(self.policy)
        self.step = 0  # metrics.jsonl step: cloning steps, then learner iterations
        # seconds per phase, summed over resumed segments; `total` also counts this one
        self.seconds = {"bc": 0.0, "eval": 0.0, "rl": 0.0, "total": 0.0}
        self.total_before = 0.0
        self.began = time.perf_counter()
        self.evals: dict[str, Any] = {}
        self.rollout_stats: dict[str, Any] = {}
        self.timing: dict[str, float] = {}
        self.data_state: dict | None = None  # the RL stream's position

    # -- several processes ------------------------------------------------------------------------

    def tenant(self, name: str) -> str:
        """The ATDP tenant this process writes and reads for `name` (one per process: a
        partition has a single writer, and each process trains on the rows it played)."""
        return name if self.processes == 1 else f"{name}-p{self.process}"

    def share(self, total: int) -> int:
        """This process's part of a run-wide episode count (at least 1)."""
        return max(1, -(-total // self.processes))

    @property
    def episodes_per_version(self) -> int:
        """This process's share of `rl.episodes_per_version` (admission, a synchronous round),
        at least one group."""
        return max(self.config.rollout.group_size, self.share(self.config.rl.episodes_per_version))

    def seed_offset(self) -> int:
        """Games and sampling differ per process (process 0 keeps the one-process seeds)."""
        return 100_000 * self.process

    def local_copy(self, policy: Transformer) -> Transformer:
        """`policy` on this process's rollout mesh (a collective with several processes: every
        process calls it at the same point). One process: `policy` itself."""
        if self.rollout_shardings is None:
            return policy
        graphdef = nnx.graphdef(policy)
        return nnx.merge(graphdef, reshard(nnx.state(policy), self.rollout_shardings))

    def combined_stats(self, stats: dict) -> dict:
        """Rollout stats (`RolloutStats.snapshot()`, `engine.stats()`) over every process's
        episodes; a collective with several processes."""
        if self.processes == 1:
            return stats
        local = _scalars(stats) | {"by_task_type": stats.get("by_task_type", {})}
        return combine_snapshots(allgather_json(local))

    @property
    def warm_start_dir(self):
        """Where the cloned policy is saved: DIR/warm_start, or beside `checkpoint_dir` when
        that is given (shared storage every host sees: the save is collective)."""
        if self.config.checkpoint_dir:
            return checkpoint_directory(self.config.checkpoint_dir).parent / WARM_START_DIR
        return self.out / WARM_START_DIR

    @property
    def sampler_template(self) -> Transformer:
        """The policy a new sampler is built from: the current one on one process (the model
        may have been replaced since, e.g. by cloning), else a copy on the rollout mesh."""
        return self.policy if self._local_template is None else self._local_template

    def publisher(self) -> WeightPublisher:
        """A publisher whose snapshots land on this process's rollout mesh."""
        return WeightPublisher(shardings=self.rollout_shardings)

    def sampler(self, index: int) -> Sampler:
        """Sampler `index` for this model shape (worker `index`; 0 also evaluates)."""
        key = (self.policy.config, self.tokenizer.pad_id, self.rollout_mesh, index)
        if key not in _SAMPLERS:
            _SAMPLERS[key] = Sampler(
                self.sampler_template, pad_id=self.tokenizer.pad_id, mesh=self.rollout_mesh
            )
        return _SAMPLERS[key]

    def loader(self, name: str, *, current_version=lambda: 0, rows: int, **config) -> AtdpLoader:
        """A loader over this process's tenant `name`; `rows` is the run-wide batch, of which
        each process brings its share (the learner's batch spans every process)."""
        tenant = self.tenant(name)
        if get_algorithm(self.config.learner.algorithm).advantage == "group":
            # a GRPO member batched apart from its group gets a baseline from the wrong members
            config.setdefault("group_by", "task.group_key")
        return AtdpLoader(
            self.store,
            [tenant],
            principal=tenant,
            config=LoaderConfig(
                layout=self.config.rollout.layout, rows=rows // self.processes, **config
            ),
            current_version=current_version,
            shard=grain.sharding.ShardOptions(shard_index=0, shard_count=1),  # its own tenant
        )

    def engine(self, publisher, writer, *, asynchronous: bool, tenant: str, seed_offset: int):
        """This process's rollout engine over `writer` (its partition of `tenant`); with several
        processes each plays its share of `episodes_per_version` on its own games."""
        rl = self.config.rl
        seed_offset += self.seed_offset()
        rollout = dataclasses.replace(
            self.config.rollout, seed=self.config.rollout.seed + self.seed_offset()
        )
        return RolloutEngine(
            self.sampler_template,
            self.tokenizer,
            writer,
            publisher,
            rollout=rollout,
            env=dataclasses.replace(self.config.env, seed=self.config.env.seed + seed_offset),
            config=EngineConfig(
                num_workers=rl.num_workers,
                envs_per_worker=rl.envs_per_worker,
                asynchronous=asynchronous,
                max_staleness=rl.max_staleness,
                episodes_per_version=self.episodes_per_version,
                tenant=self.tenant(tenant),
            ),
            samplers=[self.sampler(w) for w in range(rl.num_workers)],
            # unique per engine: a resumed run's episodes must not reuse earlier ids. Every number
            # follows a letter, so no id reads as a phone number to the ATDP redactor
            run_id=(
                f"{tenant}-s{self.config.seed}-o{seed_offset}-p{self.process}"
                f"-r{uuid.uuid4().hex[:8]}"
            ),
        )


# -- phases ------------------------------------------------------------------------------------


def warm_start(run: Run, log: MetricsWriter) -> None:
    """The cloned policy and its start evaluation, saved to DIR/warm_start (or both taken from
    `warm_start.from_run`)."""
    spec = run.config.warm_start
    if spec.from_run:
        with Checkpointer(
            checkpoint_directory(spec.from_run) / WARM_START_DIR, create=False
        ) as saved:
            restored = saved.restore({"policy": run.policy})
        run.policy = restored.items["policy"]
        run.evals["start"] = restored.metadata["evals"]["start"]
        return
    clone_expert(run, log)
    evaluate_policy(run, log, run.policy, 0, "start")
    with Checkpointer(run.warm_start_dir, max_to_keep=1, async_save=False) as saved:
        saved.save(0, {"policy": run.policy}, metadata={"evals": {"start": run.evals["start"]}})


def evaluate_policy(
    run: Run, log: MetricsWriter, policy, version: int, tag: str, splits=SPLITS
) -> dict:
    """Greedy success on each split (overall and per task type), logged at the current step.

    Uses worker 0's sampler, so it must not run while the engine plays (see `rl_evaluator`).
    """
    sampler = run.sampler(0)
    sampler.update_weights(run.local_copy(policy), version)
    return _evaluate(run, log, sampler, tag, splits)


def _evaluate(run: Run, log: MetricsWriter, sampler: Sampler, tag: str, splits) -> dict:
    """Each process plays its share of the games; the results are combined on every process."""
    start = time.perf_counter()
    results = {}
    for split in splits:
        result = evaluate(
            sampler,
            run.tokenizer,
            split=split,
            num_games=run.config.eval.num_games,
            num_envs=run.config.eval.num_envs,
            rollout=run.config.rollout,
            env=run.config.env,
            shard=(run.process, run.processes),
        )
        if run.processes > 1:
            parts = allgather_json(dataclasses.asdict(result))
            result = EvalResult.combine([EvalResult(**part) for part in parts])
        log.write(run.step, result.metrics())
        results[split] = {
            "success": result.success_rate,
            "episodes": result.episodes,
            "avg_steps": result.avg_steps,
            "invalid_reply_rate": result.invalid_reply_rate,
            "by_task_type": {
                t: row["success_rate"] for t, row in result.by_task_type.items() if row["episodes"]
            },
        }
    run.seconds["eval"] += time.perf_counter() - start
    run.evals[tag] = results
    return results


def critic_warmup(run: Run, log: MetricsWriter, learner: Learner, publisher) -> None:
    """Critic-only iterations on rollouts of the starting policy, played synchronously (the
    policy version cannot advance while only the critic trains, so an asynchronous engine's
    admission would stall)."""
    rl, config = run.config.rl, run.config
    if not learner.in_warmup:
        return
    with run.store.writer(run.tenant(WARMUP)) as writer:
        engine = run.engine(publisher, writer, asynchronous=False, tenant=WARMUP, seed_offset=500)
        stats = run.combined_stats(engine.generate(run.share(rl.warmup_episodes)))
    log.write(
        run.step, {"warmup/episodes": stats["episodes"], "warmup/success": stats["success_rate"]}
    )
    loader = run.loader(WARMUP, rows=rl.rows, seq_len=rl.seq_len)
    batches = iter(loader.epoch(seed=config.seed, num_epochs=None))
    while learner.in_warmup:
        metrics = learner.iteration(next(batches))
        run.step += 1
        log.write(run.step, metrics)


def checkpoint(run: Run, learner: Learner, trainer: OnlineTrainer | None, *, phase: str) -> None:
    """Learner + run progress; the id is the global step (or the next free id at a phase end)."""
    run.seconds["total"] = run.total_before + time.perf_counter() - run.began
    if trainer is not None:
        # one stream position per process (each reads its own tenant); a collective
        run.data_state = {"by_process": allgather_json(trainer.data_state())}
    metadata = {
        "phase": phase,
        "global_step": run.step,
        "seconds": run.seconds,
        "evals": run.evals,
        "data": run.data_state,
        "rollout_stats": _scalars(run.rollout_stats),
    }
    latest = run.checkpointer.latest_step()
    step = run.step if latest is None or run.step > latest else latest + 1
    learner.save(run.checkpointer, step, metadata=metadata, force=True)


def restore(run: Run, learner: Learner) -> dict | None:
    """The latest checkpoint into `learner` and the run's counters; None when there is none."""
    if run.checkpointer.latest_step() is None:
        return None
    meta = learner.restore(run.checkpointer).metadata
    run.step = int(meta["global_step"])
    run.seconds.update(meta.get("seconds", {}))
    run.total_before = run.seconds["total"]
    run.evals = dict(meta.get("evals", {}))
    run.rollout_stats = dict(meta.get("rollout_stats") or {})
    data = meta.get("data")
    if data is not None:
        positions = data.get("by_process", [data])  # one process before multi-process runs
        if len(positions) != run.processes:
            raise ValueError(
                f"the checkpoint in {run.checkpointer.directory} was written by "
                f"{len(positions)} process(es), this job has {run.processes}: resume it with "
                f"{len(positions)} (each process continues the stream of its own ATDP tenant)"
            )
        data = positions[run.process]
    run.data_state = data
    return meta


def budget_left(run: Run, learner: Learner) -> bool:
    """Whether RL has policy steps (and environment steps) left to take."""
    rl = run.config.rl
    env_steps = int(run.rollout_stats.get("env_steps", 0))
    return learner.policy_version < rl.policy_steps and not (
        rl.env_steps and env_steps >= rl.env_steps
    )


def reinforcement_learning(
    run: Run, log: MetricsWriter, learner: Learner, publisher, data_state: dict | None
) -> None:
    """The online phase: engine -> ATDP -> loader stream -> learner -> publisher."""
    config, rl = run.config, run.config.rl
    start, rl_before = time.perf_counter(), run.seconds["rl"]
    steps_before = int(run.rollout_stats.get("env_steps", 0))
    episodes_before = int(run.rollout_stats.get("episodes", 0))
    writer = run.store.writer(run.tenant(ROLLOUTS))
    engine = run.engine(
        publisher, writer, asynchronous=rl.asynchronous, tenant=ROLLOUTS, seed_offset=0
    )
    loader = run.loader(
        ROLLOUTS,
        rows=rl.rows,
        seq_len=rl.seq_len,
        max_staleness=rl.max_staleness,
        current_version=lambda: learner.policy_version,
    )
    trainer = OnlineTrainer(
        learner,
        loader,
        publisher,
        engine,
        asynchronous=rl.asynchronous,
        episodes_per_round=run.episodes_per_version,
        idle_timeout_s=rl.idle_timeout_s,
    )
    if data_state:
        trainer.set_data_state(data_state)
    evaluator = _PeriodicEval(run, log, publisher)
    bar = ProgressBar(
        rl.policy_steps,
        desc=f"RL ({learner.algorithm.label})",
        keys=("batch/success_rate", "policy/clip_frac", "critic/explained_variance"),
        initial=learner.policy_version,
        disable=None if config.progress else True,  # None: process 0 only
    )
    last_checkpoint = learner.policy_version

    def on_iteration(metrics: dict) -> bool:
        nonlocal last_checkpoint
        run.step += 1
        # what the loader passed over (too long, stale, ...): counted with the engine's
        # stats in one exchange on several processes
        read = {f"loader/{k}": v for k, v in loader.stats.snapshot().items()}
        stats = run.combined_stats(engine.stats() | read)
        run.rollout_stats = dict(
            stats,
            env_steps=steps_before + stats["env_steps"],
            episodes=episodes_before + stats["episodes"],
        )
        metrics.update(
            {
                "rollout/episodes": run.rollout_stats["episodes"],
                "rollout/env_steps": run.rollout_stats["env_steps"],
                "rollout/success_rate": stats["success_rate"],
                "rollout/dropped_stale": stats["dropped_stale"],
                "rollout/invalid_reply_rate": stats["invalid_reply_rate"],
            }
        )
        metrics.update({k: v for k, v in stats.items() if k.startswith("loader/")})
        log.write(run.step, metrics)
        bar.update(learner.policy_version - bar.n, metrics=metrics)
        evaluator.maybe(learner)
        if learner.policy_version - last_checkpoint >= config.checkpoint_every:
            run.seconds["rl"] = rl_before + time.perf_counter() - start
            checkpoint(run, learner, trainer, phase="rl")
            last_checkpoint = learner.policy_version
        return bool(rl.env_steps) and run.rollout_stats["env_steps"] >= rl.env_steps

    try:
        trainer.run(rl.policy_steps, on_iteration)
    finally:
        bar.close()
        writer.close()
    run.seconds["rl"] = rl_before + time.perf_counter() - start
    run.timing = dict(trainer.timing)
    checkpoint(run, learner, trainer, phase="rl_done")


class _PeriodicEval:
    """valid_unseen every `eval.every_policy_steps` during RL, on its own sampler (worker 0's
    is busy playing), with the weights just published (already on the rollout mesh)."""

    def __init__(self, run: Run, log: MetricsWriter, publisher: WeightPublisher):
        self.run, self.log, self.publisher = run, log, publisher
        self.every = run.config.eval.every_policy_steps
        self.done: set[int] = set()

    def maybe(self, learner: Learner) -> None:
        version = learner.policy_version
        if not self.every or version % self.every or version in self.done or learner.in_warmup:
            return
        self.done.add(version)
        snapshot = self.publisher.latest()
        sampler = self.run.sampler(-1)
        sampler.update_weights(snapshot.params, snapshot.version)
        _evaluate(self.run, self.log, sampler, f"policy_step_{version}", ("valid_unseen",))


def summarize(run: Run, learner: Learner) -> dict:
    """summary.json: success before / after RL (overall, per task type), budget, timings."""
    start, end = run.evals.get("start", {}), run.evals.get("end", {})
    stats = run.rollout_stats

    def success(tag: dict, split: str):
        return tag.get(split, {}).get("success")

    return {
        "algorithm": learner.algorithm.name,
        "asynchronous": run.config.rl.asynchronous,
        "seed": run.config.seed,
        "unseen_success_start": success(start, "valid_unseen"),
        "unseen_success_end": success(end, "valid_unseen"),
        "seen_success_start": success(start, "valid_seen"),
        "seen_success_end": success(end, "valid_seen"),
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
            for split in SPLITS
        },
        "rl_timing": run.timing,
    }


def print_summary(summary: dict) -> None:
    """Success per split and task type before / after RL, then the run's scalars."""
    rows = []
    for split, name in (("valid_seen", "seen"), ("valid_unseen", "unseen")):
        before = summary["by_task_type"].get(f"{split}_start", {})
        after = summary["by_task_type"].get(f"{split}_end", {})
        rows.append(
            {
                "split": split,
                "task type": "all",
                "start": summary[f"{name}_success_start"],
                "end": summary[f"{name}_success_end"],
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
    print(summary_table({k: v for k, v in summary.items() if not isinstance(v, dict)}))


def run(config: ExperimentConfig, *, distributed: DistributedConfig | None = None) -> dict:
    """Run (or resume) the experiment; returns the summary also written to DIR/summary.json.

    `distributed` (default: the environment) joins a multi-process job; only process 0 writes
    metrics, the summary and the curve, and prints."""
    state = Run(config, setup_job(config.mesh, distributed), multi_process=True)
    learner = Learner(state.config.learner, state.policy, mesh=state.mesh)
    meta = restore(state, learner) if config.resume else None
    with MetricsWriter(
        state.out,
        tensorboard=config.tensorboard,
        # a resume without a checkpoint starts over: drop the records of the earlier attempt
        resume_from_step=state.step if config.resume else None,
    ) as log:
        if meta is None:
            warm_start(state, log)
            learner = Learner(state.config.learner, state.policy, mesh=state.mesh)
        elif meta["phase"] != "rl" and budget_left(state, learner):
            meta["phase"] = "rl"  # a finished run resumed with a larger budget
            state.evals.pop("end", None)
        if meta is None or meta["phase"] == "rl":
            publisher = state.publisher()
            publisher.publish(learner.policy_module(copy=False), learner.policy_version)
            if meta is None:
                critic_warmup(state, log, learner, publisher)
                checkpoint(state, learner, None, phase="rl")
            reinforcement_learning(state, log, learner, publisher, state.data_state)
        if "end" not in state.evals:
            evaluate_policy(state, log, learner.policy_module(), learner.policy_version, "end")
        checkpoint(state, learner, None, phase="done")
    state.checkpointer.wait_until_finished()
    state.checkpointer.close()
    summary = summarize(state, learner)
    save_summary(state.out, summary)
    if state.job.is_primary:  # metrics.jsonl exists on process 0 only
        records = read_metrics(state.out)
        keys = [k for k in CURVE_KEYS if any(isinstance(r.get(k), int | float) for r in records)]
        curve = state.out / "learning_curve.png"
        plot_learning_curves(records, curve, keys=keys, title=str(state.out))
        print_summary(summary)
    return summary


def _check_process_split(config: ExperimentConfig, processes: int) -> None:
    """Batches span the processes: each brings rows / processes of them."""
    for name, rows in (("rl.rows", config.rl.rows), ("warm_start.rows", config.warm_start.rows)):
        if rows % processes:
            raise ValueError(
                f"{name}={rows} does not split over {processes} processes: each process "
                "brings an equal share of every batch; make it a multiple of the process count"
            )


def _scalars(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if isinstance(v, int | float)}
