"""What every phase of a job shares (`sao_jax.pipeline.job`): the config
resolved, the tokenizer and model built, the ATDP store, checkpoints, samplers and engines, and
where each process of a multi-process job differs (its tenants, share of episodes, seeds,
rollout mesh).
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
from atdp_io.mask_replay import MaskReplay
from atdp_io.retention import PurgeSchedule
from atdp_io.trained_on import TrainedOn
from sao_jax.checkpoint import Checkpointer, checkpoint_directory
from sao_jax.distributed.host_sync import allgather_json
from sao_jax.distributed.job import Job, setup_job
from sao_jax.distributed.mesh import make_global_mesh
from sao_jax.distributed.resharding import reshard, rollout_shardings
from sao_jax.models import Transformer, get_model_config, init_model, load_hf_qwen3_moe
from sao_jax.pipeline.config import ExperimentConfig
from sao_jax.pipeline.lengths import sized_config
from sao_jax.rollout import (
    EngineConfig,
    RolloutEngine,
    Sampler,
    WeightPublisher,
    combine_snapshots,
)
from sao_jax.sharding import MeshConfig
from sao_jax.tokenizers import Tokenizer, WordTokenizer, load_tokenizer
from sao_jax.train import get_algorithm

WARMUP, ROLLOUTS = "warmup", "rollouts"
WARM_START_DIR = "warm_start"


def lacks_warm_start(run_dir: str) -> bool:
    """True when `run_dir` is a local directory without a saved warm start (DIR/warm_start): a
    command taking an earlier run refuses it up front. A URL (gs://...) is not listed here; its
    restore says when it is missing."""
    return "://" not in run_dir and not (Path(run_dir) / WARM_START_DIR).is_dir()


# Samplers keep their compiled kernels; runs in one process (resumes, tests) with the same model
# shape reuse them instead of compiling again. `compare_algos` clears JAX's caches after every
# run (`release_compiled_programs`), so there the kept samplers compile again once per run.
_SAMPLERS: dict[tuple, Sampler] = {}


def build_tokenizer(config: ExperimentConfig) -> Tokenizer:
    """The HF checkpoint's tokenizer, or a word-level one over every text of the env
    (`TextEnv.vocabulary`)."""
    if config.model.hf_path:
        return load_tokenizer(Path(config.model.hf_path) / "tokenizer.json")
    return WordTokenizer.from_texts([" ".join(config.env.env_class.vocabulary())])


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
    algorithms (GRPO) play `learner.group.size` rollouts of each game, and at least one group
    per policy version; windowed rows in the per-row head layout fix its capacity at one reply."""
    rollout = dataclasses.replace(config.rollout, seed=config.rollout.seed + 1000 * config.seed)
    rl, learner = config.rl, config.learner
    if (
        rollout.layout == "windowed"
        and learner.head_positions == "rows"
        and learner.max_action_tokens_per_row is None
    ):
        # a windowed row holds one reply of at most max_new_tokens tokens: one compiled head
        # capacity for the whole run instead of one per bucket the batches happen to reach
        learner = dataclasses.replace(learner, max_action_tokens_per_row=rollout.max_new_tokens)
    if get_algorithm(config.learner.algorithm).advantage == "group" and rollout.group_size == 1:
        rollout = dataclasses.replace(rollout, group_size=config.learner.group.size)
        rl = dataclasses.replace(
            rl, episodes_per_version=max(rl.episodes_per_version, rollout.group_size)
        )
    return dataclasses.replace(
        config,
        env=dataclasses.replace(config.env, seed=config.env.seed + 1000 * config.seed),
        rollout=rollout,
        rl=rl,
        learner=learner,
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
        check_process_split(config, self.processes)
        if not config.atdp_purge_every_s >= 0:  # here, not hours later when RL starts
            raise ValueError(
                f"atdp_purge_every_s must be >= 0 seconds, got {config.atdp_purge_every_s!r}"
            )
        self.eval_splits = config.eval_splits  # held-out last
        self.mesh = self.job.mesh
        # a seq_len left at 0 is sized from expert games of this run's prompts (every process
        # measures the same games, so all agree)
        self.tokenizer = build_tokenizer(config)
        config = sized_config(config, self.tokenizer)
        self.config = resolve(config)
        self.out = Path(config.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.store = AtdpStore.open(config.atdp_path or str(self.out / "atdp"))
        self.checkpointer = Checkpointer(
            config.checkpoint_dir or self.out / "checkpoints", max_to_keep=config.checkpoint_keep
        )
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
        # the RL task streams' failed-task replay (one state per worker; `env.replay_failed`)
        self.task_replay: list[dict] | None = None
        # What `policy` trained on since its last checkpoint: shared by the cloner(s) and the
        # learner, so every checkpoint's lineage sidecar chains back to the warm start.
        self.trained_on = TrainedOn()

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
        local = scalars(stats) | {"by_task_type": stats.get("by_task_type", {})}
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
            mask_replay=self.mask_replay(),
        )

    def mask_replay(self) -> MaskReplay | None:
        """What rebuilds the grammar and thinking-budget masks of constrained calls (served
        traffic of the online job, rollouts with `rollout.reply_choices`) with the run's
        tokenizer, so they train with the exact masked ratio; None for a tokenizer without a
        Hugging Face backend (such a run cannot sample constrained either)."""
        if getattr(self.tokenizer, "backend", None) is None:
            return None
        return MaskReplay.from_tokenizer(self.tokenizer, self.policy.config.vocab_size)

    def purge_schedule(self, name: str) -> PurgeSchedule | None:
        """Retention of this process's tenant `name` while it trains: a started thread purging
        its expired trajectories every `atdp_purge_every_s` seconds through the live writer
        (None when that is 0). Stop it before closing the writer."""
        every_s = self.config.atdp_purge_every_s
        if not every_s:
            return None
        tenant = self.tenant(name)
        return PurgeSchedule(
            self.store, every_s=every_s, tenants=[tenant], principal=tenant
        ).start()

    def engine(
        self,
        publisher,
        writer,
        *,
        asynchronous: bool,
        tenant: str,
        seed_offset: int,
        temperature: float | None = None,
    ):
        """This process's rollout engine over `writer` (its partition of `tenant`); with several
        processes each plays its share of `episodes_per_version` on its own games.
        `temperature`: decode at this temperature instead of `rollout.temperature` (0: greedy)."""
        rl = self.config.rl
        seed_offset += self.seed_offset()
        rollout = dataclasses.replace(
            self.config.rollout, seed=self.config.rollout.seed + self.seed_offset()
        )
        if temperature is not None:
            rollout = dataclasses.replace(rollout, temperature=temperature)
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


def env_splits(config: ExperimentConfig) -> dict[str, int]:
    """{split: number of tasks} of the run's env (`TextEnv.splits`)."""
    return dict(config.env.env_class.splits)


def check_process_split(config: ExperimentConfig, processes: int) -> None:
    """Batches span the processes: each brings rows / processes of them."""
    for name, rows in (("rl.rows", config.rl.rows), ("warm_start.rows", config.warm_start.rows)):
        if rows % processes:
            raise ValueError(
                f"{name}={rows} does not split over {processes} processes: each process "
                "brings an equal share of every batch; make it a multiple of the process count"
            )


def scalars(stats: dict) -> dict:
    return {k: v for k, v in stats.items() if isinstance(v, int | float)}
