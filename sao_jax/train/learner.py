"""The SAO learner (and its GRPO, GRPO+DIS and PPO baselines) over ATDP batches.

One iteration on one loader batch (SAO):

    critic values -> action-only GAE (policy: length-adaptive lambda; critic: lambda = 1)
    -> one policy step with the DIS loss -> K critic steps on the same targets

GRPO / GRPO+DIS replace the critic by group-relative returns; PPO takes its ratio against the
learner's own log-probs at the start of the iteration and makes `clip.ppo_epochs` policy steps.
Before the first policy step, `critic.warmup_steps` batches train the critic alone. The whole
iteration runs as one compiled program (the steps under `lax.scan`) with one host read.

The learner never sees a rollout object: batches come from `atdp_io`'s loader. Its policy
version counts policy updates; rollout samples carry the version that produced them, so the
loader's staleness filter reads `learner.policy_version`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atdp_io.trained_on import TrainedOn
from sao_jax.losses import SAMPLED_OPD_MODES
from sao_jax.models import Critic, Transformer
from sao_jax.sharding import LogicalRules
from sao_jax.train import advantages as adv_lib
from sao_jax.train import objectives, packing
from sao_jax.train.algorithms import get_algorithm
from sao_jax.train.config import LearnerConfig
from sao_jax.train.learner_steps import (
    ModelShardings,
    StepSpec,
    learner_steps,
    policy_steps,
    trace_key,
)
from sao_jax.train.partition import split_trainable
from sao_jax.train.steps import BATCH_KEYS, MASK_KEYS, SAMPLING_KEYS, Placement, make_optimizer

Metrics = dict[str, Any]


@dataclasses.dataclass
class LearnerCounters:
    """Progress of a learner, saved in checkpoint metadata.

    policy_version: policy updates applied (the version stamped on published weights).
    """

    iterations: int = 0
    policy_version: int = 0
    critic_steps: int = 0
    warmup_iterations: int = 0
    skipped_policy_steps: int = 0
    skipped_critic_steps: int = 0


class Learner:
    """Trains a policy (and, for GAE algorithms, a critic) on ATDP loader batches.

    Args:
      config: learner config; `config.algorithm` picks SAO / GRPO / GRPO+DIS / PPO.
      policy: the policy to train (its arrays are taken over; use `policy_module()` after).
      critic: the critic; default `Critic.from_policy(policy)` when the algorithm needs one.
      mesh, rules: optional device mesh and logical-axis rules (see `sao_jax.sharding`).
    """

    def __init__(
        self,
        config: LearnerConfig,
        policy: Transformer,
        *,
        critic: Critic | None = None,
        mesh: jax.sharding.Mesh | None = None,
        rules: LogicalRules | None = None,
    ):
        self.config = config
        self.algorithm = get_algorithm(config.algorithm)
        self.placement = Placement(mesh, rules)
        self.counters = LearnerCounters()
        # What the weights trained on since the last checkpoint (saved next to each step). Set
        # `trained_on.parent` to the checkpoint step the starting weights came from, if any.
        self.trained_on = TrainedOn()
        self.model_config = policy.config
        self._policy_optimizer = make_optimizer(config.policy_optimizer)
        self._policy_graphdef, policy_trainable, self._policy_frozen = split_trainable(
            policy, config.policy_trainable, name="policy"
        )
        self._policy_param_sh = self.placement.params(policy_trainable)
        self._policy_frozen_sh = self.placement.params(self._policy_frozen)
        self.policy_params = self.placement.put(policy_trainable, self._policy_param_sh)
        self._policy_frozen = self.placement.put(self._policy_frozen, self._policy_frozen_sh)
        self.policy_opt_state = self.placement.init_optimizer(
            self._policy_optimizer, self.policy_params
        )
        self._policy_opt_sh = self.placement.like(self.policy_opt_state)
        # The KL term's reference: the trainable part of the starting policy (the frozen part
        # never changes, so the policy's serves both).
        self._reference_params = (
            jax.tree.map(jnp.copy, self.policy_params) if config.kl.active else None
        )
        self.critic_params = self.critic_opt_state = None
        if self.algorithm.uses_critic:
            critic = critic if critic is not None else Critic.from_policy(policy)
            self._critic_optimizer = make_optimizer(config.critic_optimizer)
            self._critic_graphdef, critic_trainable, self._critic_frozen = split_trainable(
                critic, config.critic_trainable, name="critic"
            )
            self._critic_param_sh = self.placement.params(critic_trainable)
            self._critic_frozen_sh = self.placement.params(self._critic_frozen)
            self.critic_params = self.placement.put(critic_trainable, self._critic_param_sh)
            self._critic_frozen = self.placement.put(self._critic_frozen, self._critic_frozen_sh)
            self.critic_opt_state = self.placement.init_optimizer(
                self._critic_optimizer, self.critic_params
            )
            self._critic_opt_sh = self.placement.like(self.critic_opt_state)
        elif critic is not None:
            raise ValueError(f"algorithm {self.algorithm.name!r} trains no critic; got one")

    # -- models ---------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        return self.counters.policy_version

    def policy_module(self, *, copy: bool = True) -> Transformer:
        """The current policy as a `Transformer`. `copy=True` gives arrays that later updates
        (which donate their buffers) cannot invalidate: what weight publication needs."""
        params = jax.tree.map(jnp.copy, self.policy_params) if copy else self.policy_params
        return nnx.merge(self._policy_graphdef, params, self._policy_frozen)

    def critic_module(self, *, copy: bool = True) -> Critic:
        if not self.algorithm.uses_critic:
            raise ValueError(f"algorithm {self.algorithm.name!r} has no critic")
        params = jax.tree.map(jnp.copy, self.critic_params) if copy else self.critic_params
        return nnx.merge(self._critic_graphdef, params, self._critic_frozen)

    def reference_module(self, *, copy: bool = True) -> Transformer:
        """The KL term's reference policy (`LearnerConfig.kl`): the policy this learner started
        from, or the one its checkpoint saved."""
        if self._reference_params is None:
            raise ValueError("this learner keeps no reference policy (LearnerConfig.kl is off)")
        params = self._reference_params
        params = jax.tree.map(jnp.copy, params) if copy else params
        return nnx.merge(self._policy_graphdef, params, self._policy_frozen)

    def reset_policy_optimizer(self) -> None:
        """Fresh policy optimizer state (moments and schedule count)."""
        self.policy_opt_state = self.placement.init_optimizer(
            self._policy_optimizer, self.policy_params
        )

    def on_weights_published(self) -> None:
        """Call after publishing weights to rollout workers (resets the optimizer if asked)."""
        if self.config.reset_optimizer_on_sync:
            self.reset_policy_optimizer()

    # -- training -------------------------------------------------------------------------------

    @property
    def in_warmup(self) -> bool:
        return (
            self.algorithm.uses_critic
            and self.counters.warmup_iterations < self.config.critic.warmup_steps
        )

    def iteration(self, batch: Mapping[str, np.ndarray]) -> Metrics:
        """One learner iteration on a loader batch; returns host metrics (floats).

        During critic warm-up the iteration trains the critic only (`phase` = 0); afterwards it
        makes the algorithm's policy step(s) and K critic steps (`phase` = 1). SEED algorithms
        (`algorithm.opd`) need `batch["skill_logp"]` [R, T] (`sao_jax.seed.SeedLearner` adds it).

        With `config.fused_iteration` (the default) the whole iteration is one compiled program
        per phase (`learner_steps`' `iteration` / `warmup_iteration`); otherwise `prepare` and
        each step are jitted apart and queued from Python. Either way the device is read once.
        """
        if self.algorithm.opd and not self.in_warmup and "skill_logp" not in batch:
            raise ValueError(
                f"Learner: algorithm {self.algorithm.name!r} needs batch['skill_logp'] [R, T], "
                "the action tokens re-scored with a skill in context (sao_jax.seed.SeedLearner)"
            )
        if (
            self.algorithm.opd
            and not self.in_warmup
            and self.config.opd.mode not in SAMPLED_OPD_MODES
            and "skill_top_ids" not in batch
        ):
            raise ValueError(
                f"Learner: OpdConfig.mode {self.config.opd.mode!r} needs batch['skill_top_ids'] / "
                "['skill_top_logp'] [R, T, K], the teacher's top k at each action token "
                "(sao_jax.seed.SeedLearner adds them)"
            )
        host = self._host_batch(batch, compact=self.config.pack_rows)
        capacity = self._action_capacity(host)
        warmup = self.in_warmup
        device_batch = self.placement.put_batch(host)
        if not warmup:
            device_batch = self.with_reference_logp(device_batch, capacity)
        fns = self._functions(device_batch, capacity)
        staleness = _staleness(batch, self.counters.policy_version)
        policy_steps_run = 0 if warmup else policy_steps(self.config)
        critic_steps_run = self.config.critic.steps if self.algorithm.uses_critic else 0
        if self.config.fused_iteration:
            metrics, skipped = self._fused_iteration(fns, device_batch, warmup)
        else:
            metrics, skipped = self._stepwise_iteration(fns, device_batch, warmup)
        # The one host read of the iteration: metrics and skip counts together.
        fetched, skipped = jax.device_get((metrics, skipped))
        policy_skips, critic_skips = int(skipped["policy"]), int(skipped["critic"])
        self.counters.skipped_policy_steps += policy_skips
        self.counters.policy_version += policy_steps_run - policy_skips
        self.counters.skipped_critic_steps += critic_skips
        self.counters.critic_steps += critic_steps_run - critic_skips
        if warmup:
            self.counters.warmup_iterations += 1
        self.counters.iterations += 1
        self.trained_on.add_batch(batch, self.counters.policy_version)
        host = {k: float(v) for k, v in fetched.items()}
        host.update(staleness)
        host.update(
            phase=0.0 if warmup else 1.0,
            policy_version=float(self.counters.policy_version),
            skipped_policy_steps=float(self.counters.skipped_policy_steps),
            skipped_critic_steps=float(self.counters.skipped_critic_steps),
        )
        return host

    def with_reference_logp(
        self, device_batch: dict[str, jax.Array], capacity: Any
    ) -> dict[str, jax.Array]:
        """`device_batch` (as the steps take it) plus `ref_logp` [R, T], the reference policy's
        log-probs of its action tokens, when the learner keeps a reference (`config.kl`); as it
        is otherwise. One forward pass of the reference, the heads at the action tokens only
        (`capacity`, as `_action_capacity` gives it)."""
        if self._reference_params is None:
            return device_batch
        fns = self._functions(device_batch, capacity)
        ref_logp = fns["action_logprobs"](self._reference_params, self._policy_frozen, device_batch)
        return {**device_batch, "ref_logp": ref_logp}

    def _fused_iteration(
        self, fns: Mapping[str, Any], device_batch: dict[str, jax.Array], warmup: bool
    ) -> tuple[Metrics, dict[str, Any]]:
        """One compiled program per phase (`learner_steps`' `iteration` / `warmup_iteration`);
        params and optimizer states are donated and replaced. Returns device metrics and skip
        counts."""
        out: dict[str, Any]
        if warmup:
            self.critic_params, self.critic_opt_state, out = fns["warmup_iteration"](
                self.critic_params, self._critic_frozen, self.critic_opt_state, device_batch
            )
        elif self.algorithm.uses_critic:
            (
                self.policy_params,
                self.policy_opt_state,
                self.critic_params,
                self.critic_opt_state,
                out,
            ) = fns["iteration"](
                self.policy_params,
                self._policy_frozen,
                self.policy_opt_state,
                self.critic_params,
                self._critic_frozen,
                self.critic_opt_state,
                device_batch,
            )
        else:
            self.policy_params, self.policy_opt_state, out = fns["iteration"](
                self.policy_params, self._policy_frozen, self.policy_opt_state, device_batch
            )
        metrics: Metrics = {f"batch/{k}": v for k, v in out["stats"].items()}
        for model in ("policy", "critic"):
            metrics.update({f"{model}/{k}": v for k, v in out.get(model, {}).items()})
        skipped = {m: out.get(f"{m}_skipped", 0) for m in ("policy", "critic")}
        return metrics, skipped

    def _stepwise_iteration(
        self, fns: Mapping[str, Any], device_batch: dict[str, jax.Array], warmup: bool
    ) -> tuple[Metrics, dict[str, Any]]:
        """The reference path: `prepare`, each policy step and each critic step as separate
        jitted calls, queued back to back (nothing is read until the caller's one host read)."""
        critic_args = (
            (self.critic_params, self._critic_frozen) if self.algorithm.uses_critic else ()
        )
        prepared = fns["prepare"](
            self.policy_params, self._policy_frozen, *critic_args, device_batch
        )
        metrics: Metrics = {f"batch/{k}": v for k, v in prepared["stats"].items()}
        skipped: dict[str, list[jax.Array]] = {"policy": [], "critic": []}
        if not warmup:
            for _ in range(policy_steps(self.config)):
                self.policy_params, self.policy_opt_state, policy_metrics = fns["policy"](
                    self.policy_params,
                    self._policy_frozen,
                    self.policy_opt_state,
                    device_batch,
                    prepared["advantages"],
                    prepared["behaviour_logp"],
                )
                skipped["policy"].append(policy_metrics["skipped"])
            metrics.update({f"policy/{k}": v for k, v in policy_metrics.items()})
        if self.algorithm.uses_critic:
            for _ in range(self.config.critic.steps):
                self.critic_params, self.critic_opt_state, critic_metrics = fns["critic"](
                    self.critic_params,
                    self._critic_frozen,
                    self.critic_opt_state,
                    device_batch,
                    prepared["returns"],
                    prepared["values"],
                )
                skipped["critic"].append(critic_metrics["skipped"])
            metrics.update({f"critic/{k}": v for k, v in critic_metrics.items()})
        return metrics, {m: sum(flags, start=0) for m, flags in skipped.items()}

    def fit_value_head(
        self, batches: Iterable[Mapping[str, np.ndarray]], *, ridge: float = 1e-2
    ) -> Metrics:
        """Set the critic's value head to the least-squares fit of the batches' Monte-Carlo
        returns on the critic's features (its final hidden states), the backbone unchanged.

        A value head starts at zero, so on returns of scale R (ALFWorld's win is 10) a critic
        needs many Adam steps before V reaches even the mean return, and the first policy
        steps weight actions by their return rather than by their advantage. The ridge
        regression is solved in float64 on the host: (X^T X / N + ridge * s * I') w = X^T y / N,
        X the [features, 1] rows of every action token, s the mean feature variance, I'
        the identity without the bias entry (the bias is not shrunk). Use it once, on rollouts
        of the starting policy, before the critic warm-up steps.

        Returns host metrics: `critic_fit/explained_variance` (on the fitted data),
        `critic_fit/return_mean`, `critic_fit/tokens`, `critic_fit/value_mean`.
        """
        if not self.algorithm.uses_critic:
            raise ValueError(f"algorithm {self.algorithm.name!r} has no critic to fit")
        head = self.critic_params.get("value_head")
        if head is None:
            raise ValueError(
                "Learner.fit_value_head: the value head is frozen (LearnerConfig.critic_trainable "
                "matches no value_head/ parameter)"
            )
        if not ridge >= 0:
            raise ValueError(f"ridge must be >= 0, got {ridge}")
        total: dict[str, np.ndarray] | None = None
        for batch in batches:
            host = self._host_batch(batch)
            device_batch = self.placement.put_batch(host)
            fns = self._functions(device_batch, self._action_capacity(host))
            moments = jax.device_get(
                fns["value_moments"](self.critic_params, self._critic_frozen, device_batch)
            )
            moments = {k: np.asarray(v, np.float64) for k, v in moments.items()}
            total = moments if total is None else {k: total[k] + moments[k] for k in total}
        if total is None or total["count"] < 2:
            raise ValueError(
                "Learner.fit_value_head: the batches hold fewer than 2 action tokens to fit on"
            )
        n = total["count"]
        gram, moment = total["gram"] / n, total["moment"] / n
        dim = gram.shape[0] - 1
        mean = gram[:dim, dim]
        scale = max(float(np.mean(np.diag(gram)[:dim] - mean**2)), 1e-12)
        penalty = np.eye(dim + 1) * ridge * scale
        penalty[dim, dim] = 0.0
        weights = np.linalg.solve(gram + penalty, moment)
        y_mean = total["sum_y"] / n
        y_var = total["sum_yy"] / n - y_mean**2
        mse = total["sum_yy"] / n - 2 * weights @ moment + weights @ gram @ weights
        kernel, bias = head["kernel"], head["bias"]
        kernel.set_value(_like(kernel.get_value(), weights[:dim].reshape(dim, 1)))
        bias.set_value(_like(bias.get_value(), weights[dim:]))
        return {
            "critic_fit/explained_variance": float(1 - mse / y_var) if y_var > 0 else 0.0,
            "critic_fit/return_mean": float(y_mean),
            "critic_fit/tokens": float(n),
            "critic_fit/value_mean": float(mean @ weights[:dim] + weights[dim]),
        }

    def advantages(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """What an iteration would train on, without training: `advantages` and
        `behaviour_logp` [R, T] (plus `values`, `returns` for GAE algorithms), as numpy.

        With `config.head_positions="actions"` (the default) the heads run at the action tokens
        only: `values` and a PPO learner's own `behaviour_logp` are 0 off them."""
        host = self._host_batch(batch)
        device_batch = self.placement.put_batch(host)
        critic_args = (
            (self.critic_params, self._critic_frozen) if self.algorithm.uses_critic else ()
        )
        prepared = self._functions(device_batch, self._action_capacity(host))["prepare"](
            self.policy_params, self._policy_frozen, *critic_args, device_batch
        )
        prepared.pop("stats")
        return {k: np.asarray(v) for k, v in jax.device_get(prepared).items()}

    def policy_logprobs(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """[R, T] log pi(token t | tokens < t) of the current policy (0 in column 0)."""
        device_batch = self._device_batch(batch)
        logp = self._functions(device_batch, None)["logprobs"](
            self.policy_params, self._policy_frozen, device_batch
        )
        return np.asarray(jax.device_get(logp))

    def policy_top_logprobs(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """One forward of the current policy over `batch`: the action tokens' `logp` [R, T] and
        the `config.opd.top_k` most likely tokens there, `top_ids` / `top_logp` [R, T, k]
        (`objectives.action_top_logprobs`; 0 off the action tokens). Device arrays: with
        several processes each reads its own rows (`sao_jax.seed.opd.process_rows`)."""
        host = self._host_batch(batch)
        device_batch = self.placement.put_batch(host)
        return self._functions(device_batch, self._action_capacity(host))["action_top_logprobs"](
            self.policy_params, self._policy_frozen, device_batch
        )

    def _device_batch(
        self, batch: Mapping[str, np.ndarray], *, compact: bool = False
    ) -> dict[str, jax.Array]:
        """The loader batch placed on the devices (`_host_batch`, then the placement)."""
        return self.placement.put_batch(self._host_batch(batch, compact=compact))

    def _host_batch(
        self, batch: Mapping[str, np.ndarray], *, compact: bool = False
    ) -> dict[str, np.ndarray]:
        """The loader batch as the steps take it, on the host: packed with `config.pack_rows`;
        `compact`: without its empty rows (`packing.compact_rows`; an iteration returns only
        metrics, so its rows need not match the loader's)."""
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise ValueError(f"Learner: batch lacks {missing}; expected an atdp_io loader batch")
        host = {k: np.asarray(batch[k]) for k in BATCH_KEYS}
        # tokens sampled under a decoding transform: their log-probs are taken under it
        host.update({k: np.asarray(batch[k]) for k in SAMPLING_KEYS if k in batch})
        if MASK_KEYS[0] in batch:  # and their grammar masks (`atdp_io.token_masks`)
            host.update({k: np.asarray(batch[k]) for k in MASK_KEYS})
            host["mask_table"] = _common_mask_rows(host["mask_table"])
        if self.algorithm.opd and "skill_logp" in batch:
            host["skill_logp"] = np.asarray(batch["skill_logp"], np.float32)
            if "skill_kinds" in batch:  # [R] bitmask of the skill's kinds: per-kind gap metrics
                host["skill_kinds"] = np.asarray(batch["skill_kinds"], np.int32)
            if "skill_top_ids" in batch:  # the teacher's top k (OpdConfig.mode "kl")
                host["skill_top_ids"] = np.asarray(batch["skill_top_ids"], np.int32)
                host["skill_top_logp"] = np.asarray(batch["skill_top_logp"], np.float32)
        if self.algorithm.advantage == "group":
            host["group_id"] = adv_lib.prompt_group_ids(host)
        if compact:
            host = packing.compact_rows(host, self.placement, self.config.pack_row_multiple)
        if jax.process_count() > 1:  # trajectory slots are per host; make them global
            rows = host["traj_index"].shape[0]
            offset = jax.process_index() * rows
            host["traj_index"] = np.where(host["traj_index"] >= 0, host["traj_index"] + offset, -1)
        if self.config.pack_rows:
            host.update(
                packing.pack_for_placement(host, self.placement, self.config.pack_row_multiple)
            )
        return host

    # -- jitted functions -----------------------------------------------------------------------

    def _action_capacity(
        self, batch: Mapping[str, np.ndarray]
    ) -> int | objectives.ActionCapacity | None:
        """The steps' static action-token capacity for the host batch `batch` (as the steps
        get it: `_host_batch`): None with `head_positions="all"`; the per-row K with "rows";
        with "actions" an `ActionCapacity` of one group per block of rows the mesh places on
        one device, sized to the fullest group. The same on every process: it is a compiled
        shape."""
        where = self.config.head_positions
        if where == "all":
            return None
        if where == "actions":
            groups = self.placement.row_shards()
            local_groups = max(1, groups // jax.process_count())
            most = objectives.most_action_tokens_per_group(batch["loss_mask"], local_groups)
        else:
            most = objectives.most_action_tokens_per_row(batch["loss_mask"])
        if jax.process_count() > 1:
            from sao_jax.distributed.host_sync import allgather_numbers

            most = int(allgather_numbers([most]).max())
        if where == "actions":
            rows_per_group = np.shape(batch["loss_mask"])[0] // local_groups
            size = rows_per_group * np.shape(batch["loss_mask"])[1]
            return objectives.ActionCapacity(objectives.bucket_capacity(most, size), groups=groups)
        fixed = self.config.max_action_tokens_per_row
        if fixed is None:
            return objectives.bucket_capacity(most, np.shape(batch["loss_mask"])[1])
        if most > fixed:
            raise ValueError(
                f"Learner: a batch row holds {most} action tokens, more than "
                f"LearnerConfig.max_action_tokens_per_row={fixed}; raise it or set it to None "
                "(capacity from each batch)"
            )
        return fixed

    def _functions(
        self, batch: Mapping[str, jax.Array], action_capacity: int | None
    ) -> dict[str, Any]:
        critic = self.algorithm.uses_critic
        spec = StepSpec(
            config_key=trace_key(self.config),
            policy_graphdef=self._policy_graphdef,
            critic_graphdef=self._critic_graphdef if critic else None,
            shapes=tuple(sorted((k, tuple(v.shape)) for k, v in batch.items())),
            mesh=self.placement.mesh,
            rules=self.placement.rules,
            action_capacity=action_capacity,
            config=self.config,
            shardings=ModelShardings(
                self._policy_param_sh,
                self._policy_frozen_sh,
                self._policy_opt_sh,
                self._critic_param_sh if critic else None,
                self._critic_frozen_sh if critic else None,
                self._critic_opt_sh if critic else None,
            ),
        )
        return learner_steps(spec)

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint_items(self) -> dict[str, Any]:
        """Items for `sao_jax.checkpoint.Checkpointer.save` (models whole, optimizer states)."""
        items: dict[str, Any] = {
            "policy": self.policy_module(copy=False),
            "policy_opt": {"state": self.policy_opt_state},
        }
        if self.algorithm.uses_critic:
            items["critic"] = self.critic_module(copy=False)
            items["critic_opt"] = {"state": self.critic_opt_state}
        if self._reference_params is not None:
            items["reference"] = self.reference_module(copy=False)
        return items

    def checkpoint_metadata(self) -> dict[str, Any]:
        """JSON metadata of the learner's progress (and algorithm, checked on restore)."""
        return {"algorithm": self.algorithm.name, **dataclasses.asdict(self.counters)}

    def save(
        self,
        checkpointer: Any,
        step: int,
        *,
        items: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Save the learner (plus the caller's `items` / `metadata`) as `step` of a Checkpointer.

        The learner's counters go to `metadata["learner"]`, the trajectories trained on since
        the previous save to the step's lineage sidecar (`atdp_io.trained_on`).
        """
        return checkpointer.save(
            step,
            {**self.checkpoint_items(), **(items or {})},
            metadata={"learner": self.checkpoint_metadata(), **(metadata or {})},
            force=force,
            trained_on=self.trained_on,
        )

    def restore(
        self, checkpointer: Any, *, step: int | None = None, items: Mapping[str, Any] | None = None
    ) -> Any:
        """Load the learner from a Checkpointer step (default: latest) written by `save`.

        `items` are the caller's extra restore targets (e.g. `{"train": {"rng": key}}`).
        Returns the `Restored` record (its `items` and `metadata` hold the caller's parts too).
        """
        metadata = checkpointer.metadata(step)
        saved = metadata.get("learner", {}).get("algorithm")
        if saved is not None and saved != self.algorithm.name:
            raise ValueError(
                f"checkpoint is of algorithm {saved!r}, this learner runs {self.algorithm.name!r}"
            )
        if self._reference_params is not None and "reference" not in checkpointer.item_names(step):
            raise ValueError(
                "the checkpoint holds no reference policy (it was saved with LearnerConfig.kl "
                "off), so a KL term has nothing to hold the policy to: resume with kl off "
                "(learner.kl.coef=0 learner.kl.track=false), or start a new run"
            )
        restored = checkpointer.restore({**self.checkpoint_items(), **(items or {})}, step=step)
        policy = restored.items["policy"]
        _, trainable, frozen = split_trainable(policy, self.config.policy_trainable)
        self.policy_params = self.placement.put(trainable, self._policy_param_sh)
        self._policy_frozen = self.placement.put(frozen, self._policy_frozen_sh)
        self.policy_opt_state = self.placement.put(
            restored.items["policy_opt"]["state"], self._policy_opt_sh
        )
        if self.algorithm.uses_critic:
            _, trainable, frozen = split_trainable(
                restored.items["critic"], self.config.critic_trainable
            )
            self.critic_params = self.placement.put(trainable, self._critic_param_sh)
            self._critic_frozen = self.placement.put(frozen, self._critic_frozen_sh)
            self.critic_opt_state = self.placement.put(
                restored.items["critic_opt"]["state"], self._critic_opt_sh
            )
        if self._reference_params is not None:
            _, trainable, _ = split_trainable(
                restored.items["reference"], self.config.policy_trainable
            )
            self._reference_params = self.placement.put(trainable, self._policy_param_sh)
        counters = restored.metadata.get("learner", {})
        fields = {f.name for f in dataclasses.fields(LearnerCounters)}
        self.counters = LearnerCounters(**{k: int(v) for k, v in counters.items() if k in fields})
        self.trained_on = TrainedOn(parent=checkpointer.step_path(restored.step))
        return restored


def _like(reference: jax.Array, value: np.ndarray) -> jax.Array:
    """`value` as an array of `reference`'s dtype and sharding."""
    return jax.device_put(np.asarray(value, reference.dtype), reference.sharding)


def _staleness(batch: Mapping[str, np.ndarray], version: int) -> dict[str, float]:
    """How many policy versions behind the learner the batch's action tokens are (host-side)."""
    versions = np.asarray(batch["versions"])[np.asarray(batch["loss_mask"]) > 0]
    if versions.size == 0:
        return {"batch/staleness_mean": 0.0, "batch/staleness_max": 0.0}
    lag = version - versions.astype(np.int64)
    return {"batch/staleness_mean": float(lag.mean()), "batch/staleness_max": float(lag.max())}


def _common_mask_rows(table: np.ndarray) -> np.ndarray:
    """A batch's `mask_table` [R, M, W] padded to the largest M of any process (the table is a
    compiled shape, like the batch's; one process: as it is)."""
    if jax.process_count() == 1:
        return table
    from sao_jax.distributed.host_sync import allgather_numbers

    most = int(allgather_numbers([table.shape[1]]).max())
    return np.pad(table, ((0, 0), (0, most - table.shape[1]), (0, 0)))
