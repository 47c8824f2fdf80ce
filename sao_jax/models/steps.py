"""Jitted forward and next-token training step with explicit in/out shardings.

These are the reference uses of the sharding scheme: parameters keep the shardings they were
created with, batches are split over the data-like mesh axes, and every jitted function names
its input and output shardings. The RL learner builds its own objectives the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sao_jax.models.config import MoeAuxConfig
from sao_jax.models.logprobs import LOGPROB_CHUNK
from sao_jax.models.transformer import Transformer
from sao_jax.sharding import LogicalRules, named_sharding, state_shardings

Metrics = dict[str, jax.Array]


def batch_sharding(
    mesh: jax.sharding.Mesh, shape: tuple[int, ...], rules: LogicalRules | None = None
) -> jax.sharding.NamedSharding:
    """Sharding of a [B, T, ...] batch array: B over the data-like axes, the rest replicated."""
    return named_sharding(mesh, ("batch",) + (None,) * (len(shape) - 1), shape, rules)


def make_forward(
    model: Transformer, mesh: jax.sharding.Mesh | None = None, rules: LogicalRules | None = None
) -> tuple[nnx.State, Callable[[nnx.State, jax.Array], jax.Array]]:
    """(params, forward) with `forward(params, input_ids [B, T]) -> logits [B, T, V]` jitted.

    With a mesh, params are (re)placed on their logical shardings and the function is jitted
    with explicit shardings (tokens split over batch axes, logits over batch and vocab).
    """
    graphdef, params = nnx.split(model)

    def forward(params: nnx.State, input_ids: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, params)(input_ids)

    if mesh is None:
        return params, jax.jit(forward)
    param_sh = state_shardings(params, mesh, rules)
    params = jax.device_put(params, param_sh)
    cache: dict[tuple[int, ...], Callable] = {}

    def sharded(params: nnx.State, input_ids: jax.Array) -> jax.Array:
        shape = tuple(input_ids.shape)
        if shape not in cache:
            logits_shape = (*shape, model.config.vocab_size)
            cache[shape] = jax.jit(
                forward,
                in_shardings=(param_sh, batch_sharding(mesh, shape, rules)),
                out_shardings=named_sharding(
                    mesh, ("batch", None, "act_vocab"), logits_shape, rules
                ),
            )
        with jax.set_mesh(mesh):
            return cache[shape](params, input_ids)

    return params, sharded


def next_token_loss(
    model: Transformer,
    tokens: jax.Array,
    loss_mask: jax.Array,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    moe_aux: MoeAuxConfig | None = None,
) -> tuple[jax.Array, Metrics]:
    """Mean next-token NLL over `loss_mask` plus the weighted MoE auxiliary loss.

    Args:
      tokens: [B, T] int32; position t predicts tokens[t + 1].
      loss_mask: [B, T]; 1 where tokens[t + 1] is a target (the last column is ignored).
      moe_aux: weights of the MoE auxiliary losses (None: `MoeAuxConfig()`).
    Returns:
      (loss, metrics with nll, load_balance_loss, router_z_loss, dropped_fraction).
    """
    out = model.forward(tokens)
    targets = jnp.roll(tokens, -1, axis=1)
    mask = loss_mask.astype(jnp.float32).at[:, -1].set(0.0)
    logp, _ = model.token_logprobs(out.hidden, targets, chunk_size=chunk_size)
    nll = -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    loss = nll + out.aux.weighted_loss(moe_aux or MoeAuxConfig())
    metrics = {
        "nll": nll,
        "load_balance_loss": out.aux.load_balance_loss,
        "router_z_loss": out.aux.router_z_loss,
        "dropped_fraction": out.aux.dropped_fraction,
    }
    return loss, metrics


def make_lm_train_step(
    model: Transformer,
    optimizer: optax.GradientTransformation,
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules: LogicalRules | None = None,
    batch_shape: tuple[int, int] | None = None,
    chunk_size: int = LOGPROB_CHUNK,
) -> tuple[tuple[nnx.State, Any], Callable]:
    """A next-token training step, jitted with explicit shardings, params and optimizer donated.

    Args:
      model: the policy (its current parameters start the run).
      optimizer: an optax transformation.
      mesh: optional mesh; then `batch_shape` ([B, T]) is required to fix the batch sharding.
    Returns:
      ((params, opt_state), step) with
      `step(params, opt_state, tokens [B, T], loss_mask [B, T]) -> (params, opt_state, metrics)`.
    """
    graphdef, params = nnx.split(model)

    def step(params, opt_state, tokens, loss_mask):
        def loss_fn(p):
            return next_token_loss(nnx.merge(graphdef, p), tokens, loss_mask, chunk_size=chunk_size)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, **metrics}

    if mesh is None:
        opt_state = jax.jit(optimizer.init)(params)
        return (params, opt_state), jax.jit(step, donate_argnums=(0, 1))
    if batch_shape is None:
        raise ValueError("make_lm_train_step: batch_shape is required with a mesh")
    param_sh = state_shardings(params, mesh, rules)
    params = jax.device_put(params, param_sh)
    with jax.set_mesh(mesh):
        opt_state = jax.jit(optimizer.init)(params)
    opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)
    data_sh = batch_sharding(mesh, batch_shape, rules)
    replicated = named_sharding(mesh, (), ())
    jitted = jax.jit(
        step,
        in_shardings=(param_sh, opt_sh, data_sh, data_sh),
        out_shardings=(param_sh, opt_sh, replicated),
        donate_argnums=(0, 1),
    )

    def sharded_step(params, opt_state, tokens, loss_mask):
        with jax.set_mesh(mesh):
            return jitted(params, opt_state, tokens, loss_mask)

    return (params, opt_state), sharded_step
