"""Jitted learner steps with explicit shardings: forward passes, advantages and guarded updates.

Every step is a pure function of (trainable params, frozen params, optimizer state, batch),
jitted once for the fixed batch shape. With a mesh, parameters and optimizer states keep the
shardings their logical axes give (`sao_jax.sharding`), batch arrays are split over the
data-like axes, and the same code runs on one CPU or a pod slice. Updated params and optimizer
states are donated.

A non-finite loss or gradient norm skips the update inside the jitted step: params and optimizer
state come back unchanged (selected with `jnp.where`, so no NaN ever reaches the weights) and
the step reports `skipped = 1`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from atdp_io.rows import SAMPLING_KEYS as SAMPLING_KEYS
from atdp_io.token_masks import MASK_KEYS as MASK_KEYS
from sao_jax.models.steps import batch_sharding
from sao_jax.sharding import LogicalRules, named_sharding, state_shardings
from sao_jax.train.config import OptimizerConfig

Metrics = dict[str, jax.Array]

# Loader batch arrays the steps read: [R, T] token arrays, then [R] row arrays.
BATCH_KEYS = (
    "tokens",
    "loss_mask",
    "rollout_logp",
    "rewards",
    "versions",
    "positions",
    "segment_ids",
    "traj_index",
    "turn_index",
)
# Optional [R, T] keys (`SAMPLING_KEYS`, from atdp_io.rows): the decoding transform each action
# token was sampled under; absent, every token was sampled at temperature 1. Optional
# `MASK_KEYS` (`mask_index` [R, T], `mask_table` [R, M, W], from atdp_io.token_masks): the
# grammar mask of each constrained action token; present only with the sampling keys.


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW after global-norm clipping; the rate warms up linearly to its peak, then stays
    constant or (with `decay_steps`) follows a cosine down to `final_fraction` of the peak."""
    schedule = learning_rate_schedule(config)
    adamw = optax.adamw(
        schedule, b1=config.b1, b2=config.b2, eps=config.eps, weight_decay=config.weight_decay
    )
    if config.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
    return adamw


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule | float:
    """The rate per optimizer step of `config` (a constant when there is no warm-up or decay)."""
    peak = config.learning_rate
    if config.warmup_steps == 0 and config.decay_steps == 0:
        return peak
    parts, boundaries = [], []
    if config.warmup_steps > 0:
        parts.append(optax.linear_schedule(0.0, peak, config.warmup_steps))
        boundaries.append(config.warmup_steps)
    if config.decay_steps > 0:
        parts.append(optax.cosine_decay_schedule(peak, config.decay_steps, config.final_fraction))
    else:
        parts.append(optax.constant_schedule(peak))
    return optax.join_schedules(parts, boundaries)


def guarded_update(
    loss_fn: Callable[[nnx.State], tuple[jax.Array, Metrics]],
    optimizer: optax.GradientTransformation,
    params: nnx.State,
    opt_state: Any,
) -> tuple[nnx.State, Any, Metrics]:
    """One optimizer step of `loss_fn` that is skipped when the loss or a gradient is not finite.

    Returns (params, opt_state, metrics); metrics add `loss`, `grad_norm` (before clipping) and
    `skipped` (1.0 when the update was dropped, leaving params and opt_state as they were).
    """
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
    params = jax.tree.map(keep, new_params, params)
    opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    metrics = dict(
        metrics, loss=loss, grad_norm=grad_norm, skipped=1.0 - finite.astype(jnp.float32)
    )
    return params, opt_state, metrics


class Placement:
    """Where arrays live: a mesh (with logical-axis rules) or the default device.

    `jit(fn, in_shardings, out_shardings, donate)` jits with explicit shardings under a mesh and
    plainly without one; shardings are built lazily so the unsharded path needs none.
    """

    def __init__(self, mesh: jax.sharding.Mesh | None = None, rules: LogicalRules | None = None):
        self.mesh = mesh
        self.rules = rules

    def params(self, state: nnx.State) -> Any:
        return None if self.mesh is None else state_shardings(state, self.mesh, self.rules)

    def like(self, tree: Any) -> Any:
        """Shardings of concrete arrays (e.g. an optimizer state initialised under the mesh)."""
        return None if self.mesh is None else jax.tree.map(lambda x: x.sharding, tree)

    def replicated(self) -> Any:
        return None if self.mesh is None else named_sharding(self.mesh, (), ())

    def rows(self, shape: tuple[int, ...]) -> Any:
        return None if self.mesh is None else batch_sharding(self.mesh, shape, self.rules)

    def row_shards(self) -> int:
        """How many blocks the batch axis is split into across the mesh (1 without one)."""
        if self.mesh is None:
            return 1
        devices = self.mesh.devices.size
        return devices // self.rows((devices,)).shard_shape((devices,))[0]

    def batch(self, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        return None if self.mesh is None else {k: self.rows(s) for k, s in shapes.items()}

    def put(self, tree: Any, shardings: Any) -> Any:
        """Place `tree` on `shardings` (without a mesh: committed to the first device, so that
        fresh, restored and updated states all present one signature to the jit cache)."""
        if self.mesh is None:
            return jax.device_put(tree, jax.devices()[0])
        return jax.device_put(tree, shardings)

    def put_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host-local numpy batch -> global device arrays split over the batch axes.

        With several processes each contributes its own rows (`make_array_from_process_local_data`).
        """
        if self.mesh is None:
            return {k: jnp.asarray(v) for k, v in batch.items()}
        out = {}
        for key, value in batch.items():
            global_shape = (value.shape[0] * jax.process_count(), *value.shape[1:])
            out[key] = jax.make_array_from_process_local_data(
                self.rows(global_shape), np.asarray(value), global_shape
            )
        return out

    def jit(
        self,
        fn: Callable,
        in_shardings: Any,
        out_shardings: Any,
        donate_argnums: tuple[int, ...] = (),
    ) -> Callable:
        if self.mesh is None:
            return jax.jit(fn, donate_argnums=donate_argnums)
        jitted = jax.jit(
            fn,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            donate_argnums=donate_argnums,
        )
        mesh = self.mesh

        def call(*args):
            with jax.set_mesh(mesh):
                return jitted(*args)

        return call

    def init_optimizer(self, optimizer: optax.GradientTransformation, params: nnx.State) -> Any:
        """Optimizer state created on the params' shardings (moments sharded like params)."""
        if self.mesh is None:
            return self.put(jax.jit(optimizer.init)(params), None)
        with jax.set_mesh(self.mesh):
            return jax.jit(optimizer.init)(params)
