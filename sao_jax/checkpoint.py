"""Asynchronous orbax checkpoints of nnx models, optimizers and run metadata.

One checkpoint step holds any number of named items (for the learner: `policy`, `critic`,
`policy_opt`, `critic_opt`, plus small array trees such as the training RNG key) and one JSON
metadata dict (step, policy version, data-iterator state, ...). Layout on disk:

    <directory>/<step>/<item name>/...   orbax PyTree (OCDBT) per item
    <directory>/<step>/metadata/         JSON

Saving is asynchronous: `save` copies device arrays to host and returns; the write finishes
in a background thread (`wait_until_finished` blocks on it). Buffers may be donated to the
next train step as soon as `save` returns. A step directory becomes visible only once fully
written, so a crash mid-save leaves the previous step as the latest.

Restoring places every array on the sharding of its target: a live nnx object is restored in
place onto its current shardings; an abstract tree (`jax.ShapeDtypeStruct` with `sharding=`)
or concrete arrays give the shardings explicitly. A checkpoint written on one device restores
sharded over a mesh and vice versa.

Example (the learner)::

    ckpt = Checkpointer(out_dir / "checkpoints", max_to_keep=3)
    ckpt.save(step, {"policy": policy, "critic": critic, "policy_opt": policy_opt,
                     "critic_opt": critic_opt, "train": {"rng": rng}},
              metadata={"policy_version": version, "data": loader_state})
    ...
    restored = ckpt.restore({"policy": policy, "critic": critic, "policy_opt": policy_opt,
                             "critic_opt": critic_opt, "train": {"rng": rng}})
    rng = restored.items["train"]["rng"]; version = restored.metadata["policy_version"]
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from atdp_io.trained_on import TrainedOn
from atdp_io.trained_on import write_step as write_trained_on

METADATA_ITEM = "metadata"
_ITEM_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class CheckpointNotFoundError(FileNotFoundError):
    """The directory or the requested step does not exist."""


class CorruptCheckpointError(RuntimeError):
    """A step exists but cannot be read (missing or damaged files)."""


class CheckpointMismatchError(ValueError):
    """The restore target does not have the checkpoint's structure or shapes."""


@dataclasses.dataclass(frozen=True)
class Restored:
    """`items`: restored trees by name (nnx objects are the same objects, updated in place)."""

    step: int
    items: dict[str, Any]
    metadata: dict[str, Any]


def _is_nnx(value: Any) -> bool:
    return isinstance(value, nnx.Pytree)  # Modules, Optimizers, Rngs


def _as_tree(value: Any) -> Any:
    """What gets written for one item: an nnx object's state as a pure dict, else the tree."""
    return nnx.to_pure_dict(nnx.state(value)) if _is_nnx(value) else value


def _path_str(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        for attribute in ("key", "idx", "name"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _stored_shape(leaf: Any) -> tuple[int, ...]:
    """Shape as stored: typed PRNG keys are written as their uint32 key data."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return tuple(jax.eval_shape(jax.random.key_data, leaf).shape)
    return tuple(leaf.shape)


def abstract_tree(tree: Any, shardings: Any = None) -> Any:
    """`jax.ShapeDtypeStruct` leaves for `tree` (arrays, an nnx object, or an abstract one from
    `nnx.eval_shape`) with `shardings` (a matching tree of `jax.sharding.Sharding`, or one for
    all leaves; default: the leaves' own). A restore target that allocates nothing."""
    tree = _as_tree(tree)
    if shardings is None:  # keep the sharding the leaves already carry, if any
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
            tree,
        )
    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree
        )
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def checkpoint_directory(directory: str | os.PathLike) -> epath.Path:
    """Where a `Checkpointer` writes: a URL (`gs://bucket/run/checkpoints`, any scheme
    `etils.epath` knows) kept as the URL, a local path made absolute. Touches nothing."""
    text = os.fspath(directory)
    if "://" in text:
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))


class Checkpointer:
    """Named items + JSON metadata per step, asynchronous, keeping the last `max_to_keep`.

    Args:
      directory: root of the step directories (created unless `create=False`): a local path
        or a URL such as `gs://bucket/run/checkpoints` (every process of a multi-host job
        must see the same one).
      max_to_keep: finished steps kept on disk (older ones are deleted); None keeps all.
      save_interval_steps: `save` writes only on multiples of this (unless `force=True`).
      async_save: write in a background thread (default) or block in `save`.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        max_to_keep: int | None = 3,
        save_interval_steps: int = 1,
        async_save: bool = True,
        create: bool = True,
    ):
        self.directory = checkpoint_directory(directory)
        if not create and not self.directory.is_dir():
            raise CheckpointNotFoundError(f"no checkpoint directory at {self.directory}")
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        preservation = (
            ocp.checkpoint_managers.LatestN(max_to_keep)
            if max_to_keep is not None
            else ocp.checkpoint_managers.preservation_policy.PreserveAll()
        )
        options = ocp.CheckpointManagerOptions(
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_interval_steps),
            preservation_policy=preservation,
            enable_async_checkpointing=async_save,
            create=create,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    # -- saving -------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        items: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
        force: bool = False,
        trained_on: TrainedOn | None = None,
    ) -> bool:
        """Start writing `items` (nnx Module / Optimizer, or pytrees of arrays, typed PRNG keys
        included) and JSON `metadata` as `step`. Returns False when the interval skips it.

        `trained_on`: the trajectories the saved weights consumed since their parent step; its
        sidecar (`atdp_io.trained_on`) is written, synchronously, before the step itself, so a
        step never exists without it; then `trained_on` restarts from this step.
        """
        if not items:
            raise ValueError("save needs at least one item")
        for name in items:
            if not _ITEM_NAME.match(name) or name == METADATA_ITEM:
                raise ValueError(
                    f"item name {name!r} must match {_ITEM_NAME.pattern} and not be "
                    f"{METADATA_ITEM!r}"
                )
            if not _is_nnx(items[name]) and jax.tree_util.treedef_is_leaf(
                jax.tree.structure(items[name])
            ):
                raise ValueError(
                    f"item {name!r} is a single array or scalar; wrap it in a dict, "
                    f"e.g. {{{name!r}: {{'value': x}}}}"
                )
        metadata = dict(metadata or {})
        try:  # fail here, not later in the background thread
            json.dumps(metadata, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"checkpoint metadata must be plain JSON: {error}") from error
        args = {name: ocp.args.StandardSave(_as_tree(value)) for name, value in items.items()}
        args[METADATA_ITEM] = ocp.args.JsonSave(metadata)
        lineage = trained_on is not None and (force or self._manager.should_save(step))
        if lineage:
            write_trained_on(self.directory, step, trained_on, process=jax.process_index())
        saved = self._manager.save(step, args=ocp.args.Composite(**args), force=force)
        if lineage:
            trained_on.saved(self.step_path(step))
        return saved

    def step_path(self, step: int) -> str:
        """The path (or URL) of step `step`'s directory, as lineage sidecars name it."""
        return os.fspath(self.directory / str(int(step)))

    def wait_until_finished(self) -> None:
        """Block until every started save is on disk (and old steps are pruned)."""
        self._manager.wait_until_finished()

    # -- reading ------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Steps on disk when this object was opened plus those it saved since, ascending
        (a save still in flight is listed; reading it waits for it)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _step_or_latest(self, step: int | None) -> int:
        self._manager.wait_until_finished()  # never read a step this object is still writing
        steps = self.all_steps()
        if not steps:
            raise CheckpointNotFoundError(
                f"no finished checkpoint in {self.directory} (steps still being written are "
                "ignored)"
            )
        if step is None:
            return steps[-1]
        if step not in steps:
            raise CheckpointNotFoundError(f"no step {step} in {self.directory}; have {steps}")
        return step

    def item_names(self, step: int | None = None) -> list[str]:
        """Names of the array items saved at `step` (default: latest)."""
        step = self._step_or_latest(step)
        step_dir = self.directory / str(step)
        return sorted(p.name for p in step_dir.iterdir() if p.is_dir() and p.name != METADATA_ITEM)

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        """The JSON metadata of `step` (default: latest), without reading any arrays."""
        step = self._step_or_latest(step)
        try:
            restored = self._manager.restore(
                step, args=ocp.args.Composite(**{METADATA_ITEM: ocp.args.JsonRestore()})
            )
        except Exception as error:
            raise self._corrupt(step, error) from error
        return dict(restored[METADATA_ITEM] or {})

    def restore(
        self, items: Mapping[str, Any] | None = None, *, step: int | None = None
    ) -> Restored:
        """Read `step` (default: latest) onto the targets in `items`.

        Each target is an nnx object (restored in place onto its current shardings; an abstract
        module from `nnx.eval_shape` is filled without first allocating it), a tree of
        `jax.ShapeDtypeStruct` / arrays (restored onto their shardings; dtypes are cast to the
        target's), or None (restored as saved, on the default device when the saved devices
        are absent). `items=None` restores every item as saved.
        """
        step = self._step_or_latest(step)
        available = self.item_names(step)
        if items is None:
            items = dict.fromkeys(available)
        missing = sorted(set(items) - set(available))
        if missing:
            raise CheckpointMismatchError(
                f"step {step} in {self.directory} has no item(s) {missing}; it has {available}"
            )
        fallback = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        args = {}
        for name, target in items.items():
            tree = None if target is None else _as_tree(target)
            if tree is not None:
                self._check_structure(step, name, tree)
            args[name] = ocp.args.StandardRestore(tree, fallback_sharding=fallback)
        args[METADATA_ITEM] = ocp.args.JsonRestore()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as error:
            raise self._corrupt(step, error) from error
        out = {}
        for name, target in items.items():
            out[name] = restored[name]
            if target is not None and _is_nnx(target):
                state = nnx.state(target)
                nnx.replace_by_pure_dict(state, restored[name])
                nnx.update(target, state)
                out[name] = target
        return Restored(step=step, items=out, metadata=dict(restored[METADATA_ITEM] or {}))

    def _check_structure(self, step: int, name: str, target: Any) -> None:
        """Compare target paths and shapes with the saved tree before reading any bytes."""
        try:
            saved_tree = ocp.StandardCheckpointHandler().metadata(self._step_dir(step) / name).tree
        except Exception as error:
            raise self._corrupt(step, error) from error
        saved_shapes = {
            _path_str(p): tuple(leaf.shape)
            for p, leaf in jax.tree_util.tree_flatten_with_path(saved_tree)[0]
        }
        target_shapes = {
            _path_str(p): _stored_shape(leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(target)[0]
        }
        problems = [
            f"missing in checkpoint: {p}" for p in sorted(set(target_shapes) - set(saved_shapes))
        ]
        problems += [f"not in target: {p}" for p in sorted(set(saved_shapes) - set(target_shapes))]
        problems += [
            f"{p}: checkpoint shape {saved_shapes[p]} vs target {shape}"
            for p, shape in sorted(target_shapes.items())
            if p in saved_shapes and saved_shapes[p] != shape
        ]
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise CheckpointMismatchError(
                f"item {name!r} of step {step} does not match the target:\n  {shown}{more}"
            )

    def _step_dir(self, step: int) -> epath.Path:
        return epath.Path(self._manager.directory) / str(step)

    def _corrupt(self, step: int, error: Exception) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"cannot read checkpoint step {step} at {self._step_dir(step)}: "
            f"{type(error).__name__}: {error}"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Finish pending saves and release the background threads."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
