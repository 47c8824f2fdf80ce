"""Start an experiment on every host of a Cloud TPU VM slice (or several), or dry-run its memory.

    python -m experiments.launch_tpu --topology v5p-64 --tpu my-pod --zone us-east5-a \\
        --bucket gs://my-bucket/runs/sao1 --model qwen3-30b-a3b --dry-run
    python -m experiments.launch_tpu --topology v5p-64 --tpu my-pod --zone us-east5-a \\
        --bucket gs://my-bucket/runs/sao1 --config small            # print the commands
    ... --run                                                       # and execute them

Prints the gcloud commands that create the slice(s), install the repository on every host and
start `python -m <experiment>` on every host at once (`--worker=all`). JAX finds its peers on
a TPU VM by itself (`sao_jax.distributed.initialize`; multi-slice jobs created as queued
resources carry the `MEGASCALE_*` settings). The mesh comes from the topology's preset
(`--ici` / `--dcn` override axis sizes, -1 = the rest); the ATDP buffer (TensorStore) and
orbax checkpoints live under `--bucket` on Cloud Storage, metrics on process 0's disk.

`--dry-run` builds the model config abstractly on this CPU and prints the per-device memory of
parameters, optimizer state, KV cache and activations on that mesh; a plan that does not fit
the chip's HBM is refused (exit status 1) with the term that dominates and the excess. The
experiment overrides are applied first (and checked: a typo exits 2), so the plan follows
them: `learner.algorithm=grpo` plans no critic (no value model, no critic optimizer state, no
critic activations), `ppo` and `sao` keep it; `model.*` overrides change the model planned.
`--remat` (`ModelConfig.remat`: none, full, dots_with_no_batch_dims) is set on the dry-run's
model config and its activation term; a launch passes it on as `model.remat=...` when the
experiment's `ModelSpec` has that field, and refuses it otherwise (the job would not apply it).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence

from sao_jax.config_cli import ConfigError, parse_cli, split_known
from sao_jax.distributed.mesh import HybridMeshConfig
from sao_jax.distributed.topology import Topology, mesh_preset, parse_topology
from sao_jax.models.config import REMAT_POLICIES
from sao_jax.sharding import MESH_AXES, MeshConfig

PROG = "python -m experiments.launch_tpu"

# Runs one step's commands at once (one per slice: they must start together) -> exit status.
Runner = Callable[[Sequence[list[str]]], int]


def parse_axes(text: str, base: MeshConfig) -> MeshConfig:
    """ "fsdp=-1,expert=8" applied to `base`; a clear error for a bad axis or size."""
    changes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in MESH_AXES:
            raise ValueError(f"unknown mesh axis {name!r} in {text!r}; axes are {MESH_AXES}")
        try:
            changes[name] = int(value)
        except ValueError:
            raise ValueError(f"mesh axis {name} needs an integer size, got {value!r}") from None
    return dataclasses.replace(base, **changes)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """The launcher's own settings; the line's other `key=value` items are the experiment's
    overrides (e.g. `rl.rows=256`), passed on to the job and checked by --dry-run.

    Attributes:
      topology: one slice, e.g. v5p-64, v6e-16.
      slices: slices (multi-slice over DCN).
      tpu: TPU VM (or queued resource) name.
      zone: the slice's zone.
      project: gcloud project (none: gcloud's).
      bucket: gs:// prefix of the run (ATDP buffer, checkpoints).
      experiment: module to run.
      config: the experiment's preset.
      model: model preset for --dry-run (none: the experiment preset's).
      ici: within-slice axis sizes, e.g. expert=4.
      dcn: across-slice axis sizes, e.g. data=-1.
      repo: repository path on the hosts.
      git_url: repository to clone on the hosts.
      dry_run: memory plan only.
      run: execute install + start.
      create: with --run: also create the slice(s).
      train_rows: dry-run workload: global training rows.
      seq_len: dry-run workload: training sequence length.
      rollout_slots: dry-run workload: global rollout KV-cache slots.
      context: dry-run workload: rollout context length.
      remat: per-layer rematerialisation (ModelConfig.remat) of the plan and the job.
      rollout_chips: disaggregated: chips per host that sample (0: rollout shares the
        training chips).
      overrides: the experiment's overrides (the line's items that are not the launcher's).
    """

    topology: str
    slices: int = 1
    tpu: str = "sao-tpu"
    zone: str = "us-east5-a"
    project: str | None = None
    bucket: str = "gs://YOUR_BUCKET/sao_jax/run"
    experiment: str = "experiments.alfworld_sao"
    config: str = dataclasses.field(default="small", metadata={"flag": "--config"})
    model: str | None = None
    ici: str = ""
    dcn: str = ""
    repo: str = "~/sao_jax"
    git_url: str = "https://github.com/YOUR_ORG/sao_jax.git"
    dry_run: bool = False
    run: bool = False
    create: bool = False
    train_rows: int = 64
    seq_len: int = 1024
    rollout_slots: int = 256
    context: int = 4096
    remat: str = "none"
    rollout_chips: int = 0
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        if self.remat not in REMAT_POLICIES:
            raise ValueError(
                f"--remat: invalid choice: {self.remat!r} (choose from {REMAT_POLICIES})"
            )


def parse_launch(argv: Sequence[str]) -> LaunchConfig:
    """The launcher's settings from its line in the one convention (`--key VALUE`, `--key=VALUE`
    or `key=VALUE`); every other `key=value` item is an experiment override."""
    own = [f.name for f in dataclasses.fields(LaunchConfig) if f.name != "overrides"]
    switches = [f.name for f in dataclasses.fields(LaunchConfig) if f.type == "bool"]
    found, rest = split_known(argv, own, switches=switches)
    unknown = [item for item in rest if item.startswith("-") and item not in ("-h", "--help")]
    if unknown:
        raise ConfigError(f"unknown option {unknown[0]!r}; the launcher's options: {own}")
    helps = [item for item in rest if item in ("-h", "--help")]
    config = parse_cli([*found, *helps], LaunchConfig, prog=PROG, save=False, exit_on_error=False)
    return dataclasses.replace(config, overrides=tuple(i for i in rest if i not in helps))


@dataclasses.dataclass(frozen=True)
class Launch:
    """What to start where: resolved from the command line."""

    topology: Topology
    mesh: HybridMeshConfig
    tpu: str
    zone: str
    project: str | None
    bucket: str
    experiment: str
    config: str
    repo: str
    git_url: str
    overrides: tuple[str, ...]

    def node_names(self) -> list[str]:
        """One TPU VM per slice (queued-resource nodes are `<name>-<i>`)."""
        if self.topology.num_slices == 1:
            return [self.tpu]
        return [f"{self.tpu}-{i}" for i in range(self.topology.num_slices)]

    def _gcloud(self, *words: str) -> list[str]:
        project = ["--project", self.project] if self.project else []
        return ["gcloud", "compute", "tpus", *words, "--zone", self.zone, *project]

    def create_commands(self) -> list[list[str]]:
        accelerator = self.topology.name
        version = self.topology.generation.runtime_version
        if self.topology.num_slices == 1:
            create = self._gcloud("tpu-vm", "create", self.tpu)
            return [[*create, "--accelerator-type", accelerator, "--version", version]]
        create = self._gcloud("queued-resources", "create", self.tpu)
        slices = ["--node-count", str(self.topology.num_slices), "--node-prefix", self.tpu]
        return [[*create, *slices, "--accelerator-type", accelerator, "--runtime-version", version]]

    def _ssh_all(self, node: str, command: str) -> list[str]:
        return [*self._gcloud("tpu-vm", "ssh", node), "--worker=all", "--command", command]

    def install_commands(self) -> list[list[str]]:
        repo = self.repo
        script = (
            f"(test -d {repo} || git clone {shlex.quote(self.git_url)} {repo}) && cd {repo} && "
            'pip install -q -e . && pip install -q "jax[tpu]" gcsfs'
        )
        return [self._ssh_all(node, script) for node in self.node_names()]

    def experiment_args(self) -> list[str]:
        """Arguments of the experiment's command line: preset, paths, mesh, user overrides."""
        mesh = []
        for part, config in (("ici", self.mesh.ici), ("dcn", self.mesh.dcn)):
            mesh += [f"mesh.{part}.{axis}={getattr(config, axis)}" for axis in MESH_AXES]
        bucket = self.bucket.rstrip("/")
        return [
            "--config", self.config, "--out", "/tmp/sao_jax_run",
            f"atdp_path={bucket}/atdp", f"checkpoint_dir={bucket}/checkpoints",
            *mesh, *self.overrides,
        ]  # fmt: skip

    def start_commands(self) -> list[list[str]]:
        run = " ".join(
            [f"cd {self.repo} &&", "python", "-m", self.experiment]
            + [shlex.quote(a) for a in self.experiment_args()]
        )
        return [self._ssh_all(node, run) for node in self.node_names()]


def resolve(args: LaunchConfig) -> Launch:
    if not args.bucket.startswith("gs://"):
        raise ValueError(f"--bucket must be a gs:// path (shared by every host), got {args.bucket}")
    topology = parse_topology(args.topology, args.slices)
    preset = mesh_preset(topology, num_experts=_model_config(args).num_experts)
    mesh = HybridMeshConfig(
        ici=parse_axes(args.ici, preset.ici), dcn=parse_axes(args.dcn, preset.dcn)
    )
    mesh.resolve(topology.chips, topology.num_slices)  # fail here, not on the pod
    overrides = tuple(args.overrides)
    if args.remat != "none" and not args.dry_run:
        overrides += _remat_override(args)
    return Launch(
        topology, mesh, args.tpu, args.zone, args.project, args.bucket, args.experiment,
        args.config, args.repo, args.git_url, overrides,
    )  # fmt: skip


def _remat_override(args: LaunchConfig) -> tuple[str, ...]:
    """`model.remat=<policy>` for the job, if its experiment's ModelSpec takes it."""
    if any(o.startswith("model.remat=") for o in args.overrides):
        return ()
    import importlib

    spec = getattr(importlib.import_module(args.experiment), "ModelSpec", None)
    fields = {f.name for f in dataclasses.fields(spec)} if dataclasses.is_dataclass(spec) else ()
    if "remat" not in fields:
        raise ValueError(
            f"--remat {args.remat}: {args.experiment} has no ModelSpec.remat field, so the job "
            "would train without it; use --remat with --dry-run only"
        )
    return (f"model.remat={args.remat}",)


def _experiment_config(args: LaunchConfig):
    """The experiment's config (`--config` preset with the overrides), as the job would parse
    it; ValueError naming a bad preset or override."""
    import importlib

    from sao_jax.config_cli import ConfigError, parse_cli

    presets = getattr(importlib.import_module(args.experiment), "PRESETS", None)
    if presets is None:
        raise ValueError(f"{args.experiment} has no PRESETS; pass --model PRESET for --dry-run")
    if args.config not in presets:
        raise ValueError(f"unknown experiment preset {args.config!r}; pass --model PRESET")
    try:
        return parse_cli(
            ["--config", args.config, *args.overrides], presets, save=False, exit_on_error=False
        )
    except ConfigError as error:
        raise ValueError(str(error)) from None


def _model_config(args: LaunchConfig):
    """The model preset (`--model`, else the experiment preset's), vocabulary as the preset's."""
    from sao_jax.models import get_model_config

    if args.model:
        return get_model_config(args.model)
    spec = _experiment_config(args).model
    return get_model_config(spec.preset, **spec.overrides())


def _learner_config(args: LaunchConfig):
    """The experiment's learner (algorithm, trainable patterns) after the overrides; the
    default learner when the experiment has no presets (a --model dry-run of another job)."""
    from sao_jax.train.config import LearnerConfig

    try:
        experiment = _experiment_config(args)
    except ValueError:
        if args.overrides:
            raise
        return LearnerConfig()
    return getattr(experiment, "learner", None) or LearnerConfig()


def dry_run(launch: Launch, args: LaunchConfig) -> int:
    """Print the memory plan; 0 if it fits, 1 (with the reason) if not."""
    from sao_jax.train.algorithms import get_algorithm
    from sao_jax.train.memory import Workload, abstract_params, plan_memory

    config = _model_config(args).replace(remat=args.remat)
    learner = _learner_config(args)
    topology = launch.topology
    workload = Workload(
        train_rows=args.train_rows,
        seq_len=args.seq_len,
        rollout_slots=args.rollout_slots,
        context=args.context,
        remat=args.remat,
    )
    train_mesh, rollout_mesh, colocated = _dry_run_meshes(launch, args.rollout_chips)
    plans = plan_memory(
        config,
        train_mesh,
        workload,
        hbm_bytes=topology.hbm_bytes,
        learner=learner,
        rollout_mesh=rollout_mesh,
        rollout_colocated=colocated,
    )
    n_params = sum(math.prod(leaf.shape) for leaf in abstract_params(config))
    print(
        f"{topology.name} x {topology.num_slices} slice(s): {topology.chips} chips on "
        f"{topology.hosts} hosts, {topology.generation.hbm_gib:g} GiB HBM per chip; model "
        f"{args.model or args.config}: {n_params / 1e9:.2f} B parameters ({config.param_dtype})"
    )
    critic = (
        "policy + critic (value model, its optimizer state and activations)"
        if get_algorithm(learner.algorithm).uses_critic
        else "policy only: no critic (no value model, critic optimizer state or activations)"
    )
    print(f"learner.algorithm={learner.algorithm}: {critic}")
    for plan in plans:
        print(plan.table())
    refusals = [plan.refusal() for plan in plans if not plan.fits]
    for reason in refusals:
        print(f"refused: {reason}", file=sys.stderr)
    return 1 if refusals else 0


def _dry_run_meshes(launch: Launch, rollout_chips: int):
    """Axis sizes of the training mesh and of the rollout's, and whether they share chips.

    Colocated on several hosts, the experiment samples on each host's chips (its default
    `mesh.rollout`: fsdp over them), so the rollout copy is whole on every host."""
    topology = launch.topology
    chips_per_host = topology.chips_per_slice // topology.hosts_per_slice
    if not rollout_chips:
        train = launch.mesh.resolve(topology.chips, topology.num_slices)
        if topology.hosts == 1:
            return train, None, False
        per_host = {"data": topology.hosts, "fsdp": chips_per_host, "expert": 1, "tensor": 1}
        return train, per_host, True
    if not 0 < rollout_chips < chips_per_host:
        raise ValueError(
            f"--rollout-chips must leave training chips on each {chips_per_host}-chip host"
        )
    train_chips = (chips_per_host - rollout_chips) * topology.hosts
    train = launch.mesh.resolve(train_chips, topology.num_slices)
    # Decoding: tensor parallel over a host's rollout chips, data parallel across hosts.
    rollout = MeshConfig(data=-1, fsdp=1, expert=1, tensor=rollout_chips)
    sizes = rollout.resolve(rollout_chips * topology.hosts)
    return train, dict(zip(MESH_AXES, sizes, strict=True)), False


def render(commands: Sequence[list[str]]) -> str:
    return "\n".join(shlex.join(c) for c in commands)


def main(argv: Sequence[str] | None = None, runner: Runner | None = None) -> int:
    """Print (and with --run execute through `runner`, default subprocess) the launch."""
    try:
        args = parse_launch(list(sys.argv[1:] if argv is None else argv))
        launch = resolve(args)
        if args.dry_run:
            return dry_run(launch, args)
    except ValueError as error:  # ConfigError is a ValueError
        print(f"error: {error}\n(see {PROG} --help)", file=sys.stderr)
        raise SystemExit(2) from error
    sizes = launch.mesh.resolve(launch.topology.chips, launch.topology.num_slices)
    print(
        f"# {launch.topology.name} x {launch.topology.num_slices} slice(s): "
        f"{launch.topology.chips} chips, {launch.topology.hosts} hosts; mesh "
        + " ".join(f"{k}={v}" for k, v in sizes.items())
    )
    steps = [
        ("create the slice(s) (once)", launch.create_commands()),
        ("install on every host", launch.install_commands()),
        ("start on every host at once", launch.start_commands()),
    ]
    for title, commands in steps:
        print(f"# {title}\n{render(commands)}")
    if not args.run:
        return 0
    runner = runner or run_together
    for title, commands in steps if args.create else steps[1:]:
        print(f"# running: {title}", flush=True)
        code = runner(commands)
        if code:
            print(f"error: {title} exited with status {code}", file=sys.stderr)
            return code
    return 0


def run_together(commands: Sequence[list[str]]) -> int:
    """Start every command, wait for all; the first non-zero exit status (or 0)."""
    processes = [subprocess.Popen(command) for command in commands]
    codes = [process.wait() for process in processes]
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    sys.exit(main())
