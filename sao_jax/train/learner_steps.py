"""The learner's jitted functions, compiled once per (config, model structure, batch shape, mesh).

`learner_steps(spec)` returns
- `prepare(policy_params, policy_frozen, [critic_params, critic_frozen,] batch)` -> advantages,
  behaviour log-probs (and values, returns) plus batch statistics;
- `policy(params, frozen, opt_state, batch, advantages, behaviour_logp)` -> guarded update;
- `critic(params, frozen, opt_state, batch, returns, old_values)` -> guarded update;
- `logprobs(params, frozen, batch)` -> [R, T] (at every position);
- `action_logprobs(params, frozen, batch)` -> [R, T] at the action tokens (the heads where the
  steps run them, 0 elsewhere with an action capacity): the reference policy's log-probs of a
  KL term (`LearnerConfig.kl`), which the learner adds to the batch as `ref_logp`;
- `action_top_logprobs(params, frozen, batch)` -> `logp` [R, T], `top_ids` / `top_logp`
  [R, T, k] at the action tokens (`objectives.action_top_logprobs`, k = `config.opd.top_k`):
  the skill-conditioned teacher of SEED's mode "kl";
- `value_moments(critic_params, critic_frozen, batch)` -> least-squares statistics of the value
  head on the batch's Monte-Carlo returns (`objectives.value_head_moments`);
- `iteration(policy_params, policy_frozen, policy_opt, [critic_params, critic_frozen,
  critic_opt,] batch)` -> one whole learner iteration in one program: `prepare`, the policy
  step(s) (`policy_steps(config)` of them, a `lax.scan`), then `critic.steps` critic steps (a
  `lax.scan`), each a guarded update; returns the new params / optimizer states (the inputs are
  donated) and `{"stats", "policy", "critic"}` (the batch statistics, the last step's metrics of
  each model) plus `policy_skipped` / `critic_skipped`, the number of skipped steps;
- `warmup_iteration(critic_params, critic_frozen, critic_opt, batch)` -> the critic warm-up's
  iteration (values, returns, `critic.steps` critic steps; the policy is not read), same output
  without the policy entries.

`prepare`, `policy` and `critic` called in that order from Python are the step-by-step form of
`iteration` (the same functions traced into one program; `tests/train/test_train_fused_iteration.py`
checks both agree).

With `spec.action_capacity` (K per row, or an `objectives.ActionCapacity` of N per group of
rows) the steps run the LM head and the value head at the action tokens only
(`objectives.ActionPositions`): `behaviour_logp` and `values` are then 0 off the action tokens,
like `advantages` and `returns`.

Functions are cached on a `StepSpec` holding everything they trace, so several learners of one
configuration (seeds of a comparison, a resumed run, tests) share compiled executables. The
cached closures hold no learner and no parameter arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax.losses import (
    adaptive_lambda,
    get_policy_loss,
    linked_gae,
    masked_token_mean,
    masked_whiten,
    trajectory_action_counts,
)
from sao_jax.sharding import LogicalRules
from sao_jax.train import advantages as adv_lib
from sao_jax.train import objectives
from sao_jax.train.algorithms import get_algorithm
from sao_jax.train.config import LearnerConfig
from sao_jax.train.steps import Placement, guarded_update, make_optimizer

# Fields that only steer the Python side, never what is traced (`critic.warmup_steps` and
# `group.size` are set apart below). `critic.steps` and `clip.ppo_epochs` are traced: they are
# the scan lengths of the fused `iteration`.
_LOOP_ONLY_FIELDS = {
    "reset_optimizer_on_sync": False,
    "fused_iteration": True,
    # packing shows in the batch's keys and shapes, which are part of the cache key
    "pack_rows": True,
    "pack_row_multiple": 8,
}


def trace_key(config: LearnerConfig) -> str:
    """The part of a config the jitted functions depend on, as a hashable string."""
    return repr(
        dataclasses.replace(
            config,
            critic=dataclasses.replace(config.critic, warmup_steps=0),
            group=dataclasses.replace(config.group, size=1),
            **_LOOP_ONLY_FIELDS,
        )
    )


@dataclasses.dataclass(frozen=True)
class ModelShardings:
    """Shardings of the learner's states (None entries without a mesh or without a critic)."""

    policy_params: Any
    policy_frozen: Any
    policy_opt: Any
    critic_params: Any
    critic_frozen: Any
    critic_opt: Any


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Cache key of the compiled learner functions (config / shardings ride along, uncompared:
    they follow from the compared fields)."""

    config_key: str
    policy_graphdef: nnx.GraphDef
    critic_graphdef: nnx.GraphDef | None
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    mesh: jax.sharding.Mesh | None
    rules: LogicalRules | None
    action_capacity: int | objectives.ActionCapacity | None
    config: LearnerConfig = dataclasses.field(compare=False, hash=False)
    shardings: ModelShardings = dataclasses.field(compare=False, hash=False)


_CACHE: dict[StepSpec, dict[str, Any]] = {}


def learner_steps(spec: StepSpec) -> dict[str, Any]:
    """The jitted functions for `spec` (built on first use, then shared)."""
    if spec not in _CACHE:
        _CACHE[spec] = _build(spec)
    return _CACHE[spec]


def policy_loss_fn(config: LearnerConfig):
    """The algorithm's policy objective with the ratio bounds it names (`Algorithm.ratio_bounds`)
    bound."""
    algorithm = get_algorithm(config.algorithm)
    if algorithm.ratio_bounds == "dis":
        bounds = {"eps_low": config.dis.eps_low, "eps_high": config.dis.eps_high}
    else:
        bounds = {"eps_low": config.clip.eps_low, "eps_high": config.clip.eps_high}
    return get_policy_loss(algorithm.policy_loss, **bounds)


def policy_steps(config: LearnerConfig) -> int:
    """Policy steps per (non-warm-up) iteration: `clip.ppo_epochs` for a ratio against the
    learner's own old policy (one step would never clip), else one."""
    return (
        config.clip.ppo_epochs if get_algorithm(config.algorithm).behaviour == "old_policy" else 1
    )


def _repeat(step, steps: int, params: Any, opt_state: Any) -> tuple[Any, Any, Any, jax.Array]:
    """`steps` guarded updates `step(params, opt_state) -> (params, opt_state, metrics)` under
    `lax.scan`: returns the params, the optimizer state, the last step's metrics and how many
    steps were skipped."""

    def body(carry, _):
        params, opt_state, metrics = step(*carry)
        return (params, opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(body, (params, opt_state), length=steps)
    last = jax.tree.map(lambda x: x[-1], metrics)
    return params, opt_state, last, jnp.sum(metrics["skipped"])


def _build(spec: StepSpec) -> dict[str, Any]:
    config, sh = spec.config, spec.shardings
    algorithm = get_algorithm(config.algorithm)
    place = Placement(spec.mesh, spec.rules)
    shapes = dict(spec.shapes)
    batch_sh = place.batch(shapes)
    token_sh = place.rows(shapes["tokens"])
    rep = place.replicated()
    policy_graphdef, critic_graphdef = spec.policy_graphdef, spec.critic_graphdef
    policy_optimizer = make_optimizer(config.policy_optimizer)
    policy_loss = policy_loss_fn(config)
    capacity = spec.action_capacity
    opd = config.opd if algorithm.opd else None
    kl = config.kl if config.kl.active else None

    def behaviour_logprobs(policy_params, policy_frozen, batch):
        if algorithm.behaviour != "old_policy":
            return batch["rollout_logp"].astype(jnp.float32)
        policy = nnx.merge(policy_graphdef, policy_params, policy_frozen)
        logp, _, _ = objectives.policy_logprobs(
            policy, batch, chunk_size=config.logprob_chunk_size, action_capacity=capacity
        )
        return jax.lax.stop_gradient(logp)

    def targets(critic_state, batch, values=None):
        """Advantages (plus values and returns for GAE) and the batch statistics; `values`
        [R, T]: the critic's predictions when the caller has them already."""
        mask = objectives.action_mask(batch)
        out = {}
        stats = batch_stats(batch, mask)
        valid = batch["traj_index"] >= 0
        if algorithm.advantage == "gae":
            if values is None:
                critic = nnx.merge(critic_graphdef, *critic_state)
                values, _ = objectives.critic_values(critic, batch, action_capacity=capacity)
            values = jnp.where(mask > 0, values, 0.0)
            link = dict(
                rewards=batch["rewards"],
                values=values,
                mask=mask,
                traj_index=batch["traj_index"],
                turn_index=batch["turn_index"],
                gamma=config.gae.gamma,
            )
            if config.gae.policy_lam is None:
                lengths = trajectory_action_counts(mask, batch["traj_index"])
                lam = adaptive_lambda(lengths, config.gae.lam_alpha)
            else:
                lam = jnp.full(valid.shape, config.gae.policy_lam, jnp.float32)
            advantages, _ = linked_gae(**link, lam=lam)
            if config.critic.lam == 1.0:
                # lambda = 1 returns are the discounted reward-to-go whatever V is; computing
                # them without V keeps them exact (A + V would carry V's rounding).
                _, returns = linked_gae(**dict(link, values=jnp.zeros_like(values)))
            else:
                _, returns = linked_gae(**link, lam=config.critic.lam)
            if config.gae.normalize_advantages:
                advantages = masked_whiten(advantages, mask)
            out.update(values=values, returns=returns)
            stats["policy_lambda"] = _row_mean(lam, valid)
        else:
            advantages, group_size = adv_lib.grouped_advantages(
                batch["rewards"],
                mask,
                batch["traj_index"],
                batch["group_id"],
                normalize_std=config.group.normalize_std,
            )
            stats["group_size_mean"] = _row_mean(group_size, valid)
        out["advantages"] = advantages
        stats["advantage_mean"] = masked_token_mean(advantages, mask)
        stats["advantage_abs_mean"] = masked_token_mean(jnp.abs(advantages), mask)
        return out, stats

    def prepare(policy_params, policy_frozen, *rest):
        *critic_state, batch = rest
        out, stats = targets(critic_state, batch)
        out["behaviour_logp"] = behaviour_logprobs(policy_params, policy_frozen, batch)
        out["stats"] = stats
        return out

    def policy_update(params, frozen, opt_state, batch, advantages, behaviour_logp):
        def loss_fn(p):
            return objectives.policy_gradient_loss(
                nnx.merge(policy_graphdef, p, frozen),
                batch,
                advantages,
                behaviour_logp,
                policy_loss,
                entropy_coef=config.entropy_coef,
                chunk_size=config.logprob_chunk_size,
                opd=opd,
                kl=kl,
                action_capacity=capacity,
                moe_aux=config.moe,
            )

        new_params, new_opt_state, metrics = guarded_update(
            loss_fn, policy_optimizer, params, opt_state
        )
        if opd is not None and opd.grad_share:  # SEED diagnostics: one more backward pass
            opd_norm = objectives.opd_gradient_norm(
                lambda p: nnx.merge(policy_graphdef, p, frozen),
                params,
                batch,
                opd,
                chunk_size=config.logprob_chunk_size,
                action_capacity=capacity,
            )
            metrics["opd_grad_share"] = opd_norm / jnp.maximum(metrics["grad_norm"], 1e-30)
        return new_params, new_opt_state, metrics

    def logprobs(params, frozen, batch):
        policy = nnx.merge(policy_graphdef, params, frozen)
        return objectives.policy_logprobs(policy, batch, chunk_size=config.logprob_chunk_size)[0]

    def action_logprobs(params, frozen, batch):
        policy = nnx.merge(policy_graphdef, params, frozen)
        logp, _, _ = objectives.policy_logprobs(
            policy, batch, chunk_size=config.logprob_chunk_size, action_capacity=capacity
        )
        return logp

    def action_top_logprobs(params, frozen, batch):
        policy = nnx.merge(policy_graphdef, params, frozen)
        return objectives.action_top_logprobs(
            policy,
            batch,
            config.opd.top_k,
            chunk_size=config.logprob_chunk_size,
            action_capacity=capacity,
        )

    fns: dict[str, Any] = {}
    policy_in = (sh.policy_params, sh.policy_frozen)
    critic_in = (sh.critic_params, sh.critic_frozen) if algorithm.uses_critic else ()
    fns["logprobs"] = place.jit(logprobs, (*policy_in, batch_sh), token_sh)
    fns["action_logprobs"] = place.jit(action_logprobs, (*policy_in, batch_sh), token_sh)
    fns["action_top_logprobs"] = place.jit(
        action_top_logprobs,
        (*policy_in, batch_sh),
        None
        if place.mesh is None
        else {
            "logp": token_sh,
            **dict.fromkeys(
                ("top_ids", "top_logp"), place.rows((*shapes["tokens"], config.opd.top_k))
            ),
        },
    )
    prepared_sh = None
    if place.mesh is not None:
        prepared_sh = {"behaviour_logp": token_sh, "advantages": token_sh, "stats": rep}
        if algorithm.uses_critic:
            prepared_sh.update(values=token_sh, returns=token_sh)
    fns["prepare"] = place.jit(prepare, (*policy_in, *critic_in, batch_sh), prepared_sh)
    fns["policy"] = place.jit(
        policy_update,
        (*policy_in, sh.policy_opt, batch_sh, token_sh, token_sh),
        (sh.policy_params, sh.policy_opt, rep),
        donate_argnums=(0, 2),
    )
    if algorithm.uses_critic:
        critic_optimizer = make_optimizer(config.critic_optimizer)

        def critic_update(params, frozen, opt_state, batch, returns, old_values, **kw):
            def loss_fn(p):
                return objectives.value_loss(
                    nnx.merge(critic_graphdef, p, frozen),
                    batch,
                    returns,
                    old_values,
                    value_clip=config.critic.value_clip,
                    action_capacity=capacity,
                    moe_aux=config.moe,
                    **kw,
                )

            return guarded_update(loss_fn, critic_optimizer, params, opt_state)

        fns["critic"] = place.jit(
            critic_update,
            (*critic_in, sh.critic_opt, batch_sh, token_sh, token_sh),
            (sh.critic_params, sh.critic_opt, rep),
            donate_argnums=(0, 2),
        )

        def value_moments(params, frozen, batch):
            # Monte-Carlo targets (lambda = 1, V-free) whatever `critic.lam` is: the fit is
            # what the critic starts from, before any value it could bootstrap from exists.
            mask = objectives.action_mask(batch)
            _, returns = linked_gae(
                rewards=batch["rewards"],
                values=jnp.zeros_like(mask),
                mask=mask,
                traj_index=batch["traj_index"],
                turn_index=batch["turn_index"],
                gamma=config.gae.gamma,
                lam=1.0,
            )
            critic = nnx.merge(critic_graphdef, params, frozen)
            return objectives.value_head_moments(critic, batch, returns, action_capacity=capacity)

        fns["value_moments"] = place.jit(value_moments, (*critic_in, batch_sh), rep)

    def critic_phase(critic_params, critic_frozen, critic_opt, prepared, batch, steps=None):
        def step(params, opt_state):
            return critic_update(
                params, critic_frozen, opt_state, batch, prepared["returns"], prepared["values"]
            )

        steps = config.critic.steps if steps is None else steps
        return _repeat(step, steps, critic_params, critic_opt)

    # With Monte-Carlo critic targets (lambda = 1: V-free returns), the first critic step needs
    # nothing from the batch's values, and its own forward pass computes exactly those values
    # (the critic has not moved yet): the fused iteration takes them from there instead of a
    # forward pass of its own (one critic forward of the 2K + 3 passes an SAO iteration runs).
    reuse_first_critic_forward = algorithm.uses_critic and config.critic.lam == 1.0

    def first_critic_step(critic_params, critic_frozen, critic_opt, batch):
        """One critic step on V-free returns: (params, opt state, metrics, skipped, the values
        [R, T] its forward pass computed before the update)."""
        mask = objectives.action_mask(batch)
        _, returns = linked_gae(
            rewards=batch["rewards"],
            values=jnp.zeros_like(mask),
            mask=mask,
            traj_index=batch["traj_index"],
            turn_index=batch["turn_index"],
            gamma=config.gae.gamma,
            lam=1.0,
        )
        params, opt_state, metrics = critic_update(
            critic_params, critic_frozen, critic_opt, batch, returns, None, with_values=True
        )
        values = metrics.pop("values")
        return params, opt_state, metrics, metrics["skipped"], values

    def critic_first_then_rest(critic_state, batch):
        """The first critic step and the batch's targets from its values; returns (prepared,
        stats, rest) with `rest()` -> (params, opt state, last metrics, skipped) after the
        remaining K - 1 critic steps (called after the policy step, which reads `prepared`)."""
        critic_params, critic_frozen, critic_opt = critic_state
        critic_params, critic_opt, first_metrics, first_skipped, values = first_critic_step(
            critic_params, critic_frozen, critic_opt, batch
        )
        prepared, stats = targets(None, batch, values=values)

        def rest():
            if config.critic.steps == 1:
                return critic_params, critic_opt, first_metrics, first_skipped
            params, opt, metrics, skipped = critic_phase(
                critic_params, critic_frozen, critic_opt, prepared, batch,
                steps=config.critic.steps - 1,
            )  # fmt: skip
            return params, opt, metrics, skipped + first_skipped

        return prepared, stats, rest

    def iteration(policy_params, policy_frozen, policy_opt, *rest):
        *critic_state, batch = rest
        if reuse_first_critic_forward:
            prepared, stats, finish_critic = critic_first_then_rest(critic_state, batch)
        else:
            prepared, stats = targets(critic_state[:2], batch)
        behaviour = behaviour_logprobs(policy_params, policy_frozen, batch)

        def step(params, opt_state):
            return policy_update(
                params, policy_frozen, opt_state, batch, prepared["advantages"], behaviour
            )

        policy_params, policy_opt, policy_metrics, policy_skipped = _repeat(
            step, policy_steps(config), policy_params, policy_opt
        )
        out = {"stats": stats, "policy": policy_metrics, "policy_skipped": policy_skipped}
        if not algorithm.uses_critic:
            return policy_params, policy_opt, out
        if reuse_first_critic_forward:
            critic_params, critic_opt, critic_metrics, critic_skipped = finish_critic()
        else:
            critic_params, critic_frozen, critic_opt = critic_state
            critic_params, critic_opt, critic_metrics, critic_skipped = critic_phase(
                critic_params, critic_frozen, critic_opt, prepared, batch
            )
        out.update(critic=critic_metrics, critic_skipped=critic_skipped)
        return policy_params, policy_opt, critic_params, critic_opt, out

    policy_state = (sh.policy_params, sh.policy_frozen, sh.policy_opt)
    if algorithm.uses_critic:
        critic_state = (sh.critic_params, sh.critic_frozen, sh.critic_opt)
        fns["iteration"] = place.jit(
            iteration,
            (*policy_state, *critic_state, batch_sh),
            (sh.policy_params, sh.policy_opt, sh.critic_params, sh.critic_opt, rep),
            donate_argnums=(0, 2, 3, 5),
        )

        def warmup_iteration(critic_params, critic_frozen, critic_opt, batch):
            if reuse_first_critic_forward:
                _, stats, finish_critic = critic_first_then_rest(
                    (critic_params, critic_frozen, critic_opt), batch
                )
                critic_params, critic_opt, critic_metrics, critic_skipped = finish_critic()
            else:
                prepared, stats = targets((critic_params, critic_frozen), batch)
                critic_params, critic_opt, critic_metrics, critic_skipped = critic_phase(
                    critic_params, critic_frozen, critic_opt, prepared, batch
                )
            out = {"stats": stats, "critic": critic_metrics, "critic_skipped": critic_skipped}
            return critic_params, critic_opt, out

        fns["warmup_iteration"] = place.jit(
            warmup_iteration,
            (*critic_state, batch_sh),
            (sh.critic_params, sh.critic_opt, rep),
            donate_argnums=(0, 2),
        )
    else:
        fns["iteration"] = place.jit(
            iteration,
            (*policy_state, batch_sh),
            (sh.policy_params, sh.policy_opt, rep),
            donate_argnums=(0, 2),
        )
    return fns


def _row_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(valid, x, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def batch_stats(batch: Mapping[str, jax.Array], mask: jax.Array) -> dict[str, jax.Array]:
    """Scalar facts about a batch: trajectories, rows, action tokens, mean return, success."""
    valid = batch["traj_index"] >= 0
    returns = adv_lib.trajectory_returns(batch["rewards"], batch["traj_index"])
    same = batch["traj_index"][:, None] == batch["traj_index"][None, :]
    earlier = jnp.tril(jnp.ones(same.shape, bool), k=-1)
    first = valid & ~jnp.any(same & earlier, axis=-1)
    num_traj = jnp.maximum(jnp.sum(first), 1)
    return {
        "trajectories": jnp.sum(first).astype(jnp.float32),
        "rows": jnp.sum(valid).astype(jnp.float32),
        "action_tokens": jnp.sum(mask),
        "return_mean": jnp.sum(jnp.where(first, returns, 0.0)) / num_traj,
        "success_rate": jnp.sum(first & (returns > 0)) / num_traj,
    }
