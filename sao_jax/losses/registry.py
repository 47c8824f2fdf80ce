"""Policy objectives by config name, behind one call signature for the trainer.

Every registered objective is called as `loss_fn(logp, behaviour_logp, advantages, mask)` and
returns `(loss, metrics)`; hyperparameters are bound once, at lookup. What differs between
algorithms is which log-probs the trainer passes as `behaviour_logp` and how it computes the
advantages, not the call.
"""

import functools
import inspect
from collections.abc import Callable

import jax

from sao_jax.losses.ppo import ppo_clip_loss
from sao_jax.losses.sao import sao_policy_loss

PolicyLoss = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]

# Each comment says what the trainer passes as behaviour_logp and where the advantages come from.
_POLICY_LOSSES: dict[str, PolicyLoss] = {
    # DIS against the rollout log-probs; advantages from the critic via action_only_gae.
    "sao": sao_policy_loss,
    # DIS with group-relative advantages (the GRPO+DIS baseline).
    "grpo_dis": sao_policy_loss,
    # Clipped surrogate against the rollout (behaviour) log-probs, group-relative advantages.
    "grpo": ppo_clip_loss,
    # Clipped surrogate against the pre-update policy, critic advantages.
    "ppo": ppo_clip_loss,
}

POLICY_LOSS_NAMES: tuple[str, ...] = tuple(_POLICY_LOSSES)


def get_policy_loss(name: str, **hyperparameters) -> PolicyLoss:
    """The policy objective registered under `name`, with `hyperparameters` bound.

    Args:
      name: one of `POLICY_LOSS_NAMES`: "sao", "grpo_dis" (both `sao_policy_loss`), "grpo",
        "ppo" (both `ppo_clip_loss`).
      **hyperparameters: keyword-only options of that objective (e.g. `eps_low=0.3`); unset ones
        keep the objective's defaults.

    Returns:
      `loss_fn(logp, behaviour_logp, advantages, mask) -> (loss, metrics)`, all per-token
      arrays [B, T]; `loss` and each metric a float32 scalar. Jittable and differentiable in
      `logp`.

    Raises:
      ValueError: unknown name, or a hyperparameter the objective does not take.
    """
    if name not in _POLICY_LOSSES:
        raise ValueError(f"get_policy_loss: unknown objective {name!r}; known: {POLICY_LOSS_NAMES}")
    objective = _POLICY_LOSSES[name]
    accepted = [
        parameter.name
        for parameter in inspect.signature(objective).parameters.values()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(hyperparameters) - set(accepted))
    if unknown:
        raise ValueError(
            f"get_policy_loss: {name!r} ({objective.__name__}) does not take {unknown}; "
            f"it takes {accepted}"
        )
    return functools.partial(objective, **hyperparameters)
