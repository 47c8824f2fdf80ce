"""Logical-axis sharding: a device mesh, a rule table, and helpers that apply it.

Parameters and key activations are annotated with *logical* axis names ("embed", "heads",
"experts", "batch", ...). A rule table maps each logical name to zero or more mesh axes of a
4-axis mesh (`data`, `fsdp`, `expert`, `tensor`). Changing the parallelism of a run is a change
of `MeshConfig` (and rarely of the rules), never of model code.

Rules are read at trace time from a context (`axis_rules`), defaulting to `DEFAULT_RULES`.
Outside a mesh context every helper here is a no-op, so the same model code runs unsharded.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "expert", "tensor")

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Activations are split over every data-like axis; parameters are FSDP-sharded on their model
# dimension and tensor-parallel on heads / hidden / vocab; experts live on the `expert` axis.
DEFAULT_RULES: LogicalRules = (
    # activations
    ("batch", ("data", "fsdp", "expert")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("act_experts", "expert"),
    ("capacity", None),
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("experts", "expert"),
    ("expert_mlp", "tensor"),
    ("norm", None),
    # the stacked-layer axis of `ModelConfig(scan_layers=True)` parameters: never sharded (the
    # scan slices one layer per step; splitting it would gather a layer per step)
    ("layers", None),
    # KV cache [batch, length, kv_heads, head_dim]
    ("cache_batch", ("data", "fsdp", "expert")),
    ("cache_length", None),
)

_RULES: contextvars.ContextVar[LogicalRules] = contextvars.ContextVar(
    "sao_jax_axis_rules", default=DEFAULT_RULES
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Sizes of the (data, fsdp, expert, tensor) mesh axes; exactly one may be -1 ("the rest")."""

    data: int = 1
    fsdp: int = -1
    expert: int = 1
    tensor: int = 1

    def resolve(self, num_devices: int) -> tuple[int, int, int, int]:
        """Axis sizes with -1 filled in so that their product is `num_devices`."""
        sizes = [self.data, self.fsdp, self.expert, self.tensor]
        unknown = [i for i, s in enumerate(sizes) if s == -1]
        bad = [(MESH_AXES[i], s) for i, s in enumerate(sizes) if s == 0 or s < -1]
        if bad:
            raise ValueError(f"mesh axis sizes must be positive or -1, got {bad}")
        if len(unknown) > 1:
            raise ValueError(
                f"at most one mesh axis may be -1, got {[MESH_AXES[i] for i in unknown]}"
            )
        known = math.prod(s for s in sizes if s != -1)
        if unknown:
            if num_devices % known:
                raise ValueError(
                    f"{num_devices} devices do not split over fixed axis sizes of product {known}"
                )
            sizes[unknown[0]] = num_devices // known
        elif known != num_devices:
            raise ValueError(
                f"mesh {dict(zip(MESH_AXES, sizes, strict=True))} needs {known} devices, "
                f"have {num_devices}"
            )
        return tuple(sizes)  # type: ignore[return-value]


def make_mesh(
    mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None
) -> jax.sharding.Mesh:
    """A (data, fsdp, expert, tensor) mesh over `devices` (default: all), Auto axis types.

    Auto axes let XLA propagate shardings between the constraints placed by the model, which is
    what the logical-axis scheme relies on.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_config.resolve(len(devices))
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices
    )


@contextlib.contextmanager
def axis_rules(rules: LogicalRules) -> Iterator[None]:
    """Use `rules` instead of `DEFAULT_RULES` for tracing inside this context."""
    token = _RULES.set(tuple(rules))
    try:
        yield
    finally:
        _RULES.reset(token)


def current_rules() -> LogicalRules:
    """The logical-axis rule table in effect."""
    return _RULES.get()


def logical_to_spec(
    logical_axes: Sequence[str | None], rules: LogicalRules | None = None
) -> PartitionSpec:
    """PartitionSpec for an array whose dims carry `logical_axes` (None: replicated).

    A mesh axis is used at most once per array: a later dim that maps to an axis already taken
    by an earlier dim stays unsharded on that axis.
    """
    table = dict(current_rules() if rules is None else rules)
    used: set[str] = set()
    spec: list[Any] = []
    for name in logical_axes:
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(table)}")
        target = table[name]
        axes = () if target is None else (target,) if isinstance(target, str) else tuple(target)
        axes = tuple(a for a in axes if a not in used)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def _fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: jax.sharding.Mesh) -> PartitionSpec:
    """Drop mesh axes from dims they do not divide (e.g. an odd vocabulary stays replicated)."""
    fitted: list[Any] = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept: list[str] = []
        for axis in axes:
            if dim % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[axis]) == 0:
                kept.append(axis)
        fitted.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*fitted)


def named_sharding(
    mesh: jax.sharding.Mesh,
    logical_axes: Sequence[str | None],
    shape: Sequence[int],
    rules: LogicalRules | None = None,
) -> NamedSharding:
    """NamedSharding of an array of `shape` annotated with `logical_axes` on `mesh`."""
    return NamedSharding(mesh, _fit_spec(logical_to_spec(logical_axes, rules), shape, mesh))


def shard(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
    """Constrain activation `x` to its logical sharding; identity when no mesh is set.

    Use inside jitted code under `jax.set_mesh(mesh)`. Inside a `jax.shard_map` body (manual
    axes, e.g. the expert-parallel dispatch) only the axes left Auto are constrained.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or len(logical_axes) != x.ndim or not mesh.auto_axes:
        return x
    spec = _fit_spec(logical_to_spec(logical_axes), x.shape, mesh)
    if mesh.manual_axes:
        spec = _without_axes(spec, set(mesh.manual_axes))
    return jax.lax.with_sharding_constraint(x, spec)


def _without_axes(spec: PartitionSpec, dropped: set[str]) -> PartitionSpec:
    entries = []
    for entry in spec:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept = tuple(a for a in axes if a not in dropped)
        entries.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    return PartitionSpec(*entries)


def state_shardings(
    state: nnx.State, mesh: jax.sharding.Mesh, rules: LogicalRules | None = None
) -> nnx.State:
    """A tree like `state` with a NamedSharding per variable, from its `logical_axes` metadata.

    Variables without `logical_axes` (RNG counters, scalars) are replicated.
    """

    def one(variable: nnx.Variable) -> nnx.Variable:
        value = variable.get_value()
        axes = variable.get_metadata().get("logical_axes")
        shape = getattr(value, "shape", ())
        if axes is None or len(axes) != len(shape):
            sharding = NamedSharding(mesh, PartitionSpec())
        else:
            sharding = named_sharding(mesh, axes, shape, rules)
        return variable.copy(sharding)

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def init_sharded(
    factory: Callable[[], nnx.Module],
    mesh: jax.sharding.Mesh,
    rules: LogicalRules | None = None,
) -> nnx.Module:
    """Build the module returned by `factory` with every parameter created already sharded.

    The factory runs under `jax.jit` with `out_shardings` from the parameters' logical axes, so
    no device ever holds a full unsharded copy.
    """
    abstract = nnx.eval_shape(factory)
    graphdef, abstract_state = nnx.split(abstract)
    shardings = state_shardings(abstract_state, mesh, rules)
    create = jax.jit(
        lambda: nnx.state(factory()),
        out_shardings=shardings,
        compiler_options=one_off_compiler_options(),
    )
    with jax.set_mesh(mesh):
        state = create()
    return nnx.merge(graphdef, state)


def one_off_compiler_options() -> dict[str, int] | None:
    """XLA options for functions that run once (parameter init): on CPU, skip LLVM's
    optimisation passes, which take ~4x longer to compile than the init takes to run."""
    return {"xla_backend_optimization_level": 0} if jax.default_backend() == "cpu" else None


def describe(state: nnx.State) -> dict[str, str]:
    """`{"layers/0/attn/q_proj/kernel": "PartitionSpec(...)"}` for golden-file style checks."""
    out = {}
    for path, variable in nnx.to_flat_state(state):
        value = variable.get_value()
        sharding = getattr(value, "sharding", None)
        spec = getattr(sharding, "spec", None)
        out["/".join(str(p) for p in path)] = str(spec if spec is not None else sharding)
    return out


def host_array(x: jax.Array) -> np.ndarray:
    """The full value of a (possibly sharded) array as a numpy array."""
    return np.asarray(jax.device_get(x))
