"""Masked token reductions and argument checks shared by every objective.

Every objective divides by `max(sum(mask), 1)` over the whole batch and must stay finite, with
exactly zero gradients, wherever the mask is 0, whatever sits under padding (NaN log-probs from an
out-of-range pad id, stale values, huge log-ratios). The trick is to replace inactive entries by 0
with `jnp.where` *before* any nonlinearity: the cotangent reaching a discarded entry is then 0 times
a finite derivative, never 0 * inf.
"""

from collections.abc import Mapping

import chex
import jax
import jax.numpy as jnp
import numpy as np


def float_mask(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Splits a token mask into float32 weights and a boolean "active" array.

    Args:
      mask: [B, T] bool, int or float; nonzero on tokens the policy generated.

    Returns:
      (weights [B, T] float32, active [B, T] bool).
    """
    weights = jnp.asarray(mask).astype(jnp.float32)
    return weights, weights != 0


def zero_outside(x: jax.Array, active: jax.Array) -> jax.Array:
    """`x` in float32 with every inactive entry set to 0, in value and in gradient.

    Args:
      x: [B, T] any float dtype (bf16 inputs are upcast so sums accumulate in float32).
      active: [B, T] bool.
    """
    return jnp.where(active, jnp.asarray(x).astype(jnp.float32), 0.0)


def token_count(weights: jax.Array) -> jax.Array:
    """`max(sum(weights), 1)`: the token-mean denominator, never 0. Scalar float32."""
    return jnp.maximum(jnp.sum(weights), 1.0)


def masked_sum(x: jax.Array, weights: jax.Array, active: jax.Array) -> jax.Array:
    """`sum(weights * x)` over active entries only (so inf / NaN elsewhere cannot leak). Scalar."""
    return jnp.sum(jnp.where(active, weights * x, 0.0))


def masked_token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Token mean of `x` over the whole batch: `sum(mask * x) / max(sum(mask), 1)`.

    Args:
      x: [B, T] any float dtype; entries where `mask` is 0 are ignored, even if inf or NaN.
      mask: [B, T] bool, int or float.

    Returns:
      Scalar float32; 0 for an all-zero mask.
    """
    weights, active = float_mask(mask)
    return masked_sum(zero_outside(x, active), weights, active) / token_count(weights)


def stop_gradient_metrics(metrics: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Metrics are diagnostics: float32 scalars that never carry gradient."""
    return {
        name: jax.lax.stop_gradient(jnp.asarray(value, jnp.float32))
        for name, value in metrics.items()
    }


def check_token_arrays(fn_name: str, **arrays: jax.Array) -> None:
    """Raises (via chex) unless every named array is [B, T] with one shared shape.

    Rank 2 is required, not just broadcast-compatible: a critic's [B, T, 1] output silently
    broadcasting against a [B, T] mask is the classic bug this catches.
    """
    shapes = ", ".join(f"{name} {tuple(np.shape(value))}" for name, value in arrays.items())
    message = f"{fn_name}: per-token arguments must all be [B, T] with one shape; got {shapes}"
    values = [jnp.asarray(value) for value in arrays.values()]
    chex.assert_rank(values, 2, custom_message=message)
    chex.assert_equal_shape(values, custom_message=message)


def concrete_or_none(value) -> np.ndarray | None:
    """`value` as a float64 numpy array when known at trace time; None when it is traced."""
    if isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value, dtype=np.float64)


def check_hyperparameter(
    fn_name: str,
    name: str,
    value,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
) -> None:
    """Raises ValueError when a concrete hyperparameter lies outside its range.

    Traced values (a schedule passed through `jax.jit`) cannot be checked and are let through.
    """
    concrete = concrete_or_none(value)
    if concrete is None:
        return
    if not np.all(np.isfinite(concrete)):
        raise ValueError(f"{fn_name}: {name} must be finite, got {value!r}")
    if minimum is not None:
        too_low = concrete <= minimum if strict_minimum else concrete < minimum
        if np.any(too_low):
            relation = ">" if strict_minimum else ">="
            raise ValueError(f"{fn_name}: {name} must be {relation} {minimum}, got {value!r}")
    if maximum is not None and np.any(concrete > maximum):
        raise ValueError(f"{fn_name}: {name} must be <= {maximum}, got {value!r}")


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-6) -> jax.Array:
    """(x - mean) / (std + eps) over the masked entries of [R, T] `x`; 0 off the mask."""
    weights = (mask != 0).astype(jnp.float32)
    count = jnp.maximum(jnp.sum(weights), 1.0)
    mean = jnp.sum(x * weights) / count
    std = jnp.sqrt(jnp.sum(jnp.square(x - mean) * weights) / count)
    return jnp.where(weights > 0, (x - mean) / (std + eps), 0.0)
