"""The learner's objectives as functions of models and ATDP batches (traced inside the steps).

Token alignment: a batch row holds tokens [T] and `loss_mask` marks the tokens the policy
generated. Position t - 1 predicts token t, so log-probs, entropies and values are shifted one
step right: `logp[:, t]` is log pi(token t | tokens < t) and `values[:, t]` is the critic's value
of that same state (the prefix before token t). Column 0 predicts nothing and is never an action.

Heads at the action tokens only: an RL batch's action tokens are a few percent of its
positions, and the losses read nothing else, so with `action_capacity=K` the LM head (and the
critic's value head) runs on a static [R, K] set of gathered positions (`ActionPositions`: row r's
action columns in order, padded to K) and the results are scattered back to [R, T], 0 off the
action tokens. On the action tokens the values are those of the full path. A row holding more than
K action tokens makes the results NaN (never a silently dropped token); the learner picks K from
each batch (`action_capacity_for`), so that cannot happen there. `action_capacity=None` runs the
heads everywhere (the reference path; behaviour cloning's context NLL needs it).

Packed batches (`sao_jax.train.packing`): when a batch carries a packed grid, the backbone runs
on it and its outputs are read back at the batch's own [R, T] positions, so every function here
returns the same [R, T] results either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from sao_jax.losses import (
    SAMPLED_OPD_MODES,
    kl_estimate,
    masked_token_mean,
    sao_value_loss,
    seed_distribution_loss,
    seed_gap_by_kind,
    seed_opd_loss,
)
from sao_jax.losses.masked import float_mask, stop_gradient_metrics, zero_outside
from sao_jax.losses.seed import gap_metrics
from sao_jax.models import Backbone, Critic, MoeAux, MoeAuxConfig, Transformer
from sao_jax.models.decoding import chunked_transformed_logprobs
from sao_jax.models.logprobs import (
    LOGPROB_CHUNK,
    chunked_candidate_logprobs,
    chunked_top_logprobs,
)
from sao_jax.train.config import KlConfig, OpdConfig
from sao_jax.train.packing import gather_hidden, packed_inputs, unpack
from sao_jax.train.steps import MASK_KEYS, SAMPLING_KEYS

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def _shift_right(x: jax.Array) -> jax.Array:
    """[R, T] -> [R, T] with column t holding x[:, t - 1] and column 0 zero."""
    return jnp.pad(x[:, :-1], ((0, 0), (1, 0)))


def action_mask(batch: Batch) -> jax.Array:
    """[R, T] float32 loss mask with column 0 cleared (no prediction exists for it)."""
    return batch["loss_mask"].astype(jnp.float32).at[:, 0].set(0.0)


@dataclasses.dataclass(frozen=True)
class ActionCapacity:
    """Where the heads run: at most `per_group` action tokens in each of `groups` blocks of
    consecutive rows (R must be a multiple of `groups`). One group holds the whole batch's
    action tokens in one list; a group per data shard keeps the gathers inside each shard.
    A plain int K is the per-row layout: K per row (a group per row)."""

    per_group: int
    groups: int = 1


@struct.dataclass
class ActionPositions:
    """A batch's action tokens in a static [G, N] layout: G groups of consecutive rows (G = R:
    a group per row), N entries per group.

    row, index: [G, N] int32, the batch row and column of each action token of the group, in
    row-major order, then (the group's first row, 0) as padding; valid: [G, N] bool, True on the
    real entries; overflow: scalar bool, some group holds more than N action tokens (its later
    ones are missing); num_rows: R (static).
    """

    row: jax.Array
    index: jax.Array
    valid: jax.Array
    overflow: jax.Array
    num_rows: int = struct.field(pytree_node=False)

    @property
    def predictors(self) -> jax.Array:
        """[G, N] the columns whose hidden states predict the action tokens (index - 1)."""
        return jnp.maximum(self.index - 1, 0)

    def _local(self, length: int) -> jax.Array:
        """[G, N] positions inside each group's block of rows flattened ([R / G * length])."""
        rows_per_group = self.num_rows // self.row.shape[0]
        return (self.row % rows_per_group) * length + self.index

    def take(self, x: jax.Array) -> jax.Array:
        """x [R, T, ...] at the action tokens -> [G, N, ...] (padding entries read (row, 0)).
        Block by block, like `packing.gather_hidden`."""
        groups, length = self.row.shape[0], x.shape[1]
        blocks = x.reshape(groups, -1, *x.shape[2:])
        return jax.vmap(lambda block, i: block[i])(blocks, self._local(length))

    def to_rows(self, x: jax.Array, length: int) -> jax.Array:
        """[G, N] results at the action tokens -> [R, length], 0 elsewhere; all NaN on overflow.
        Padding entries add exactly 0 and get a zero gradient."""
        groups = self.row.shape[0]
        kept = jnp.where(self.valid, x, jnp.zeros((), x.dtype))
        size = self.num_rows // groups * length
        blocks = jax.vmap(lambda v, i: jnp.zeros((size,), v.dtype).at[i].add(v))(
            kept, self._local(length)
        )
        return jnp.where(self.overflow, jnp.nan, blocks.reshape(self.num_rows, length))


def _group_action_positions(active: jax.Array, n: int) -> jax.Array:
    """[G, P, T] bool -> [G, n] int32: each group's first n True positions (flat, p * T + t) in
    row-major order, then 0. A token's slot is its row's offset plus its rank in the row: two
    short cumulative sums (over T, then over P) where one over P * T would lower, on CPU, to a
    reduce-window of quadratic cost."""
    groups, rows, length = active.shape
    counts = jnp.sum(active, axis=-1, dtype=jnp.int32)  # [G, P]
    row_offset = jnp.cumsum(counts, axis=-1) - counts
    slot = row_offset[..., None] + jnp.cumsum(active, axis=-1, dtype=jnp.int32) - 1
    slot = jnp.where(active & (slot < n), slot, n).reshape(groups, rows * length)
    flat = jnp.arange(rows * length, dtype=jnp.int32)
    scatter = lambda s: jnp.zeros((n + 1,), jnp.int32).at[s].set(flat)  # noqa: E731
    return jax.vmap(scatter)(slot)[:, :n]


def action_positions(mask: jax.Array, capacity: int | ActionCapacity) -> ActionPositions:
    """`ActionPositions` of the nonzero entries of an [R, T] mask.

    `capacity`: an int K, the per-row layout (N = min(K, T) per row); an `ActionCapacity`, N =
    min(per_group, rows per group x T) in each of its groups.
    """
    if isinstance(capacity, ActionCapacity):
        per_group, groups = capacity.per_group, capacity.groups
    else:
        per_group, groups = capacity, mask.shape[0]
    if per_group < 1:
        raise ValueError(f"action capacity must be >= 1, got {per_group}")
    num_rows, length = mask.shape
    if groups < 1 or num_rows % groups:
        raise ValueError(f"{num_rows} batch rows do not split into {groups} groups of rows")
    rows_per_group = num_rows // groups
    active = (mask != 0).reshape(groups, rows_per_group, length)
    n = min(per_group, rows_per_group * length)
    flat = _group_action_positions(active, n)
    counts = jnp.sum(active, axis=(1, 2))
    valid = jnp.arange(n)[None, :] < counts[:, None]
    first_row = (jnp.arange(groups) * rows_per_group)[:, None]
    return ActionPositions(
        row=(first_row + flat // length).astype(jnp.int32),
        index=(flat % length).astype(jnp.int32),
        valid=valid,
        overflow=jnp.any(counts > n),
        num_rows=num_rows,
    )


def action_capacity_for(loss_mask: np.ndarray, *, minimum: int = 8) -> int:
    """Host side: a per-row capacity K that holds every row of the batch, bucketed.

    K is the most action tokens in a row (column 0 excluded, as in `action_mask`) rounded up
    to a multiple of max(minimum, P / 8), P the power of two at or above it, and at most T:
    batches of similar rows share one compiled shape, and above `minimum` at most a fifth of
    the K head positions of the fullest row are padding.
    """
    most = most_action_tokens_per_row(loss_mask)
    return bucket_capacity(most, np.shape(loss_mask)[1], minimum=minimum)


def most_action_tokens_per_row(loss_mask: np.ndarray) -> int:
    """Host side: the largest number of action tokens in one row (column 0 excluded)."""
    mask = np.asarray(loss_mask) != 0
    return int(mask[:, 1:].sum(axis=-1).max(initial=0))


def most_action_tokens_per_group(loss_mask: np.ndarray, groups: int) -> int:
    """Host side: the most action tokens in one of `groups` blocks of consecutive rows (column 0
    excluded), the count an `ActionCapacity` of that many groups must hold."""
    mask = np.asarray(loss_mask) != 0
    if groups < 1 or mask.shape[0] % groups:
        raise ValueError(f"{mask.shape[0]} batch rows do not split into {groups} groups of rows")
    return int(mask[:, 1:].reshape(groups, -1).sum(axis=-1).max(initial=0))


def bucket_capacity(count: int, length: int, *, minimum: int = 8) -> int:
    """`count` rounded up to its bucket (see `action_capacity_for`), within [1, length]."""
    step = max(minimum, (1 << max(count - 1, 0).bit_length()) // 8)
    return max(1, min(length, -(-max(count, 1) // step) * step))


def policy_logprobs(
    policy: Transformer,
    batch: Batch,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    action_capacity: int | ActionCapacity | None = None,
) -> tuple[jax.Array, jax.Array, MoeAux]:
    """(logp [R, T], entropy [R, T], MoE aux): log pi(token t | tokens < t) at temperature 1.

    With the batch's `SAMPLING_KEYS`, an action token sampled under a decoding transform gets
    its log-prob under that transform instead (see `_sampled_logprobs`); the entropy stays
    the plain distribution's. `action_capacity` K: the LM head runs on the action tokens only
    (at most K per row, see the module docstring) and logp / entropy are 0 off them; None: at
    every position.
    """
    out = backbone(policy, batch)
    logp, entropy = head_logprobs(policy, batch, out.hidden, chunk_size, action_capacity)
    return logp, entropy, out.aux


def head_logprobs(
    policy: Transformer,
    batch: Batch,
    hidden: jax.Array,
    chunk_size: int,
    action_capacity: int | ActionCapacity | None,
) -> tuple[jax.Array, jax.Array]:
    """`policy_logprobs`' (logp, entropy) [R, T] from the backbone's hidden states."""
    length = batch["tokens"].shape[1]
    if action_capacity is None:
        targets = jnp.roll(packed_inputs(batch)[0], -1, axis=1)
        logp, entropy = policy.token_logprobs(hidden, targets, chunk_size=chunk_size)
        logp, entropy = unpack(batch, _shift_right(logp)), unpack(batch, _shift_right(entropy))
        at = action_positions(action_mask(batch), length) if SAMPLING_KEYS[0] in batch else None
    else:
        at = action_positions(action_mask(batch), action_capacity)
        # the hidden state before each action token predicts it
        gathered = gather_hidden(batch, hidden, at.row, at.predictors)
        targets = at.take(batch["tokens"])
        logp, entropy = policy.token_logprobs(gathered, targets, chunk_size=chunk_size)
        logp, entropy = at.to_rows(logp, length), at.to_rows(entropy, length)
    if SAMPLING_KEYS[0] in batch:
        logp = _sampled_logprobs(policy, batch, hidden, at, logp, chunk_size)
    return logp, entropy


def _at_actions(batch: Batch, action_capacity: int | ActionCapacity | None) -> ActionPositions:
    """The batch's action tokens (capacity None: every column of a row)."""
    capacity = batch["tokens"].shape[1] if action_capacity is None else action_capacity
    return action_positions(action_mask(batch), capacity)


def _per_candidate_rows(at: ActionPositions, x: jax.Array, length: int) -> jax.Array:
    """[G, N, K] results at the action tokens -> [R, length, K] (0 elsewhere)."""
    return jax.vmap(lambda column: at.to_rows(column, length), in_axes=-1, out_axes=-1)(x)


def action_top_logprobs(
    policy: Transformer,
    batch: Batch,
    k: int,
    *,
    chunk_size: int = LOGPROB_CHUNK,
    action_capacity: int | ActionCapacity | None = None,
) -> dict[str, jax.Array]:
    """One forward: the action tokens' log-probs and the policy's k most likely tokens there.

    Returns `logp` [R, T] (as `policy_logprobs`: under the batch's decoding transforms),
    `top_ids` [R, T, k] int32 and `top_logp` [R, T, k] (the plain temperature-1 distribution
    that predicts each action token, most likely first); 0 off the action tokens. No gradient:
    a teacher's view (SEED's `OpdConfig.mode` "kl").
    """
    out = backbone(policy, batch)
    logp, _ = head_logprobs(policy, batch, out.hidden, chunk_size, action_capacity)
    at = _at_actions(batch, action_capacity)
    hidden = gather_hidden(batch, out.hidden, at.row, at.predictors)
    ids, top = chunked_top_logprobs(hidden, policy.unembedding(), k, chunk_size=chunk_size)
    length = batch["tokens"].shape[1]
    return jax.lax.stop_gradient(
        {
            "logp": logp,
            "top_ids": _per_candidate_rows(at, ids, length).astype(jnp.int32),
            "top_logp": _per_candidate_rows(at, top, length),
        }
    )


def candidate_logprobs(
    policy: Transformer,
    batch: Batch,
    hidden: jax.Array,
    candidates: jax.Array,
    *,
    chunk_size: int,
    action_capacity: int | ActionCapacity | None,
) -> jax.Array:
    """[R, T, K] the policy's log-probs of `candidates` [R, T, K] token ids at the action
    tokens (the distribution that predicts each), from the backbone's `hidden`; 0 elsewhere."""
    at = _at_actions(batch, action_capacity)
    gathered = gather_hidden(batch, hidden, at.row, at.predictors)
    logp = chunked_candidate_logprobs(
        gathered, policy.unembedding(), at.take(candidates), chunk_size=chunk_size
    )
    return _per_candidate_rows(at, logp, batch["tokens"].shape[1])


def sampled_tokens(batch: Batch) -> jax.Array:
    """[R, T] bool: the tokens sampled under a decoding transform (not temperature 1 untruncated,
    or under a grammar mask); all False without the batch's `SAMPLING_KEYS`."""
    if SAMPLING_KEYS[0] not in batch:
        return jnp.zeros(batch["tokens"].shape, bool)
    temperature, top_k, top_p = (batch[k] for k in SAMPLING_KEYS)
    transformed = (temperature != 1.0) | (top_k > 0) | (top_p < 1.0)
    if MASK_KEYS[0] in batch:
        transformed = transformed | (batch[MASK_KEYS[0]] >= 0)
    return transformed


def _sampled_logprobs(
    policy: Transformer,
    batch: Batch,
    hidden: jax.Array,
    at: ActionPositions,
    logp: jax.Array,
    chunk_size: int,
) -> jax.Array:
    """`logp` [R, T] with each action token sampled under a decoding transform replaced by its
    log-prob under that transform (`sao_jax.models.decoding`), so the DIS ratio against the
    sampler's behaviour log-prob is 1 at the sampling weights. Temperature-1 untruncated tokens
    keep the plain head's value, bit for bit. The transformed head runs at every action
    position of the batch (a second LM head pass there, plus a vocabulary sort).

    Token masks (the batch's `MASK_KEYS`, `atdp_io.token_masks`): a token sampled under one
    gets its log-prob under the masked, transformed distribution -- the sampler's, exactly.
    Forced tokens (one allowed id) are not action tokens: the loader leaves them out of the
    loss mask, since their masked probability is 1 under any weights (no gradient, ratio 1)."""
    at_actions = at.take
    masks = {}
    if MASK_KEYS[0] in batch:
        table = batch["mask_table"]
        vocab = policy.unembedding().shape[-1]
        if table.shape[-1] != (vocab + 31) // 32:
            raise ValueError(
                f"mask_table holds {table.shape[-1]}-word bitmasks; the policy's {vocab}-id "
                f"vocabulary needs {(vocab + 31) // 32} (MaskReplay's vocab_size must be the "
                "model's)"
            )
        # each row's table, flattened: entry (row, m) is row * M + m, whatever the action
        # layout (a row per group or several)
        rows, m = table.shape[0], table.shape[1]
        index = at_actions(batch["mask_index"])
        flat = jnp.where(index >= 0, at.row * m + index, -1)
        masks = dict(mask_index=flat, mask_table=table.reshape(rows * m, -1))
    transformed = chunked_transformed_logprobs(
        gather_hidden(batch, hidden, at.row, at.predictors),
        policy.unembedding(),
        at_actions(batch["tokens"]),
        *(at_actions(batch[k]) for k in SAMPLING_KEYS),
        **masks,
        chunk_size=chunk_size,
    )
    rows = at.to_rows(transformed, batch["tokens"].shape[1])
    return jnp.where(sampled_tokens(batch) & (action_mask(batch) > 0), rows, logp)


def backbone(model: Backbone, batch: Batch):
    """The model's `forward` over the batch's tokens (its packed grid when it carries one)."""
    tokens, positions, segment_ids = packed_inputs(batch)
    return model.forward(tokens, positions=positions, segment_ids=segment_ids)


def critic_values(
    critic: Critic, batch: Batch, *, action_capacity: int | ActionCapacity | None = None
) -> tuple[jax.Array, MoeAux]:
    """(values [R, T], MoE aux): V of the state before each token (its prefix).

    `action_capacity` K: the value head runs on the action tokens only and values are 0 off
    them (action-only GAE and the value loss read nothing else); None: at every position.
    """
    out = backbone(critic, batch)
    if action_capacity is None:
        values = critic.value_from_hidden(out.hidden)
        return unpack(batch, _shift_right(values)), out.aux
    at = action_positions(action_mask(batch), action_capacity)
    values = critic.value_from_hidden(gather_hidden(batch, out.hidden, at.row, at.predictors))
    return at.to_rows(values, batch["tokens"].shape[1]), out.aux


def policy_gradient_loss(
    policy: Transformer,
    batch: Batch,
    advantages: jax.Array,
    behaviour_logp: jax.Array,
    policy_loss: Callable[..., tuple[jax.Array, Metrics]],
    *,
    entropy_coef: float,
    moe_aux: MoeAuxConfig,
    chunk_size: int,
    opd: OpdConfig | None = None,
    kl: KlConfig | None = None,
    action_capacity: int | ActionCapacity | None = None,
) -> tuple[jax.Array, Metrics]:
    """The policy objective: `policy_loss(logp, behaviour_logp, A, mask)` + aux - entropy bonus
    (+ a KL penalty towards a reference policy).

    Args:
      advantages, behaviour_logp: [R, T] (behaviour: rollout log-probs or the old policy's).
      policy_loss: a `sao_jax.losses.get_policy_loss(...)` function.
      moe_aux: weights of the policy's MoE auxiliary losses.
      opd: SEED: adds `opd.weight * opd_loss(...)`: `seed_opd_loss` on the sampled tokens
        (modes gated / signed) or `seed_distribution_loss` over the teacher's top k (mode kl)
        with the config's values (None: no such term).
      kl: with `kl.active`, reads `batch["ref_logp"]` [R, T] (the reference policy's log-probs
        of the same tokens, `Learner` adds them) and adds `kl.coef * kl_estimate(logp,
        ref_logp, mask, kl.kind)`; None: no such term.
      action_capacity: K: the LM head runs on at most K action tokens per row (see
        `policy_logprobs`); None: at every position. The loss and gradients are the same.
    Returns:
      (loss, metrics) with the objective's metrics plus `entropy`, `load_balance_loss`,
      `router_z_loss`, `expert_dropped_fraction`, `policy_objective` (before aux terms), and
      with `opd`: `opd_loss`, the term's metrics (`opd_loss`'s) as `opd_*` and
      `opd_diagnostics`';
      with `kl`: `kl_k1`, `kl_k2`, `kl_k3` and `kl_loss` (the weighted term).
    """
    mask = action_mask(batch)
    out = backbone(policy, batch)
    aux = out.aux
    logp, entropy = head_logprobs(policy, batch, out.hidden, chunk_size, action_capacity)

    def objective_fn(x):
        return policy_loss(x, behaviour_logp, advantages, mask)

    objective, metrics = objective_fn(logp)
    mean_entropy = masked_token_mean(entropy, mask)
    loss = objective + aux.weighted_loss(moe_aux) - entropy_coef * mean_entropy
    metrics = dict(metrics)
    if SAMPLING_KEYS[0] in batch:
        # greedy tokens are a point mass: ratio 1 while still the argmax, no gradient
        greedy = (batch[SAMPLING_KEYS[0]] <= 0).astype(jnp.float32)
        metrics["greedy_token_frac"] = masked_token_mean(greedy, mask)
    if opd is not None:
        head = dict(chunk_size=chunk_size, action_capacity=action_capacity)
        opd_value, opd_metrics = opd_loss(policy, batch, out.hidden, logp, opd, **head)
        loss = loss + opd.weight * opd_value
        metrics["opd_loss"] = opd_value
        metrics.update({f"opd_{k}": v for k, v in opd_metrics.items()})
        metrics.update(opd_diagnostics(logp, batch, mask, opd, objective_fn))
    if kl is not None and kl.active:
        if "ref_logp" not in batch:
            raise ValueError(
                "policy_gradient_loss: a KL term needs batch['ref_logp'] [R, T], the reference "
                "policy's log-probs of the batch's tokens"
            )
        kl_value, kl_metrics = kl_estimate(logp, batch["ref_logp"], mask, kl.kind)
        if kl.coef > 0:  # tracking alone adds nothing (not even a 0 * inf)
            loss = loss + kl.coef * kl_value
        metrics.update(kl_metrics, kl_loss=jax.lax.stop_gradient(kl.coef * kl_value))
    metrics.update(
        policy_objective=objective,
        entropy=jax.lax.stop_gradient(mean_entropy),
        load_balance_loss=aux.load_balance_loss,
        router_z_loss=aux.router_z_loss,
        expert_dropped_fraction=aux.dropped_fraction,
    )
    return loss, metrics


def opd_loss(
    policy: Transformer,
    batch: Batch,
    hidden: jax.Array,
    logp: jax.Array,
    opd: OpdConfig,
    *,
    chunk_size: int,
    action_capacity: int | ActionCapacity | None,
) -> tuple[jax.Array, Metrics]:
    """SEED's distillation term (unweighted) and its metrics.

    Sampled-token modes: `seed_opd_loss(logp, batch["skill_logp"], mask, ...)`. Mode "kl":
    `seed_distribution_loss` of the policy's log-probs of the teacher's top k
    (`batch["skill_top_ids"]`, from `hidden`) against the teacher's (`batch["skill_top_logp"]`),
    plus the sampled tokens' gap metrics (`gap_metrics` of skill_logp - logp).
    """
    mask = action_mask(batch)
    if opd.mode in SAMPLED_OPD_MODES:
        return seed_opd_loss(
            logp, batch["skill_logp"], mask, beta=opd.beta, mode=opd.mode, clip=opd.clip
        )
    missing = [k for k in ("skill_top_ids", "skill_top_logp") if k not in batch]
    if missing:
        raise ValueError(
            f"opd_loss: OpdConfig.mode 'kl' needs batch {missing} [R, T, K], the teacher's top k "
            "at each action token (sao_jax.seed.SeedLearner adds them)"
        )
    student = candidate_logprobs(
        policy,
        batch,
        hidden,
        batch["skill_top_ids"],
        chunk_size=chunk_size,
        action_capacity=action_capacity,
    )
    value, metrics = seed_distribution_loss(student, batch["skill_top_logp"], mask)
    weights, active = float_mask(mask)
    delta = zero_outside(batch["skill_logp"], active) - zero_outside(logp, active)
    metrics.update(gap_metrics(jax.lax.stop_gradient(delta), weights, active))
    return value, stop_gradient_metrics(metrics)


def opd_diagnostics(
    logp: jax.Array,
    batch: Batch,
    mask: jax.Array,
    opd: OpdConfig,
    objective_fn: Callable[[jax.Array], tuple[jax.Array, Metrics]],
) -> Metrics:
    """SEED's per-batch diagnostics beyond `seed_opd_loss`'s own (no gradient, cheap).

    `opd_gap_<kind>` / `opd_kind_share_<kind>` (`seed_gap_by_kind`) when the batch carries
    `skill_kinds` [R]; `opd_token_grad_share`: |d(weight * L_opd)/d logp| over
    |d(L_RL + weight * L_opd)/d logp|, both gradients taken with respect to the action tokens'
    log-probs [R, T] (elementwise, no backward pass through the model; above 1 when the two
    terms pull against each other), and `opd_token_grad_cos`, the cosine between the OPD and
    the RL term's gradients there (0 when either is zero). The share is an estimate of
    the OPD term's share of the parameter gradient (both are pulled back through the same
    Jacobian d logp / d params, which can stretch them differently; the entropy bonus and the
    MoE aux losses are left out). `OpdConfig.grad_share` measures the parameter-space share.
    """
    metrics = {}
    if "skill_kinds" in batch:
        kinds = seed_gap_by_kind(logp, batch["skill_logp"], mask, batch["skill_kinds"])
        metrics.update({f"opd_{k}": v for k, v in kinds.items()})
    if opd.mode not in SAMPLED_OPD_MODES:  # the KL's gradient is not on the sampled log-probs
        return metrics
    point = jax.lax.stop_gradient(logp)

    def opd_term(x):
        value, _ = seed_opd_loss(
            x, batch["skill_logp"], mask, beta=opd.beta, mode=opd.mode, clip=opd.clip
        )
        return opd.weight * value

    opd_grad = jax.grad(opd_term)(point)
    rl_grad = jax.grad(lambda x: objective_fn(x)[0])(point)
    total = jnp.linalg.norm(rl_grad + opd_grad)
    opd_norm, rl_norm = jnp.linalg.norm(opd_grad), jnp.linalg.norm(rl_grad)
    share = opd_norm / jnp.maximum(total, 1e-30)
    cosine = jnp.sum(opd_grad * rl_grad) / jnp.maximum(opd_norm * rl_norm, 1e-30)
    metrics["opd_token_grad_share"] = jax.lax.stop_gradient(jnp.where(total > 0, share, 0.0))
    metrics["opd_token_grad_cos"] = jax.lax.stop_gradient(cosine)
    return metrics


def opd_gradient_norm(
    policy_fn: Callable[[object], Transformer],
    params,
    batch: Batch,
    opd: OpdConfig,
    *,
    chunk_size: int,
    action_capacity: int | ActionCapacity | None = None,
) -> jax.Array:
    """|grad_params (opd.weight * opd_loss)|: the OPD term's own parameter gradient norm
    (one more forward and backward pass of the policy; `OpdConfig.grad_share`). Divided by the
    update's `grad_norm` it is the term's share of the policy gradient."""

    def term(p):
        policy = policy_fn(p)
        out = backbone(policy, batch)
        logp, _ = head_logprobs(policy, batch, out.hidden, chunk_size, action_capacity)
        head = dict(chunk_size=chunk_size, action_capacity=action_capacity)
        return opd.weight * opd_loss(policy, batch, out.hidden, logp, opd, **head)[0]

    grads = jax.grad(term)(params)
    return jax.lax.stop_gradient(
        jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
    )


def value_loss(
    critic: Critic,
    batch: Batch,
    returns: jax.Array,
    old_values: jax.Array,
    *,
    value_clip: float | None,
    moe_aux: MoeAuxConfig,
    action_capacity: int | ActionCapacity | None = None,
    with_values: bool = False,
) -> tuple[jax.Array, Metrics]:
    """`sao_value_loss` of the critic on [R, T] `returns` (optionally clipped around
    `old_values`) plus the critic's own MoE aux loss (`action_capacity`: see `critic_values`).

    `old_values` None with a `value_clip`: clip around this forward's own values (the first
    step on a batch, whose targets came before any update). `with_values`: the metrics also
    hold `values` [R, T], this forward's predictions (stop-gradient): the learner reads the
    batch's values off its first critic step instead of running the critic once more.
    """
    mask = action_mask(batch)
    values, aux = critic_values(critic, batch, action_capacity=action_capacity)
    if value_clip is not None and old_values is None:
        old_values = jax.lax.stop_gradient(values)
    loss, metrics = sao_value_loss(
        values,
        returns,
        mask,
        old_values=old_values if value_clip is not None else None,
        value_clip=value_clip,
    )
    metrics = dict(metrics)
    if with_values:
        metrics["values"] = jax.lax.stop_gradient(values)
    metrics.update(load_balance_loss=aux.load_balance_loss, router_z_loss=aux.router_z_loss)
    return loss + aux.weighted_loss(moe_aux), metrics


def value_head_moments(
    critic: Critic,
    batch: Batch,
    returns: jax.Array,
    *,
    action_capacity: int | ActionCapacity | None = None,
) -> dict[str, jax.Array]:
    """Sufficient statistics of the least-squares value head on `batch`'s action tokens.

    With x_t = [h_t, 1] the critic's final hidden state of the state before action token t
    (bias column appended) and y_t = `returns[:, t]`, over the action tokens:
    `gram` = sum x x^T [D + 1, D + 1], `moment` = sum x y [D + 1], `sum_y`, `sum_yy`, `count`
    (float32). Summed over batches and solved, they give the head minimising the critic's
    token-mean squared error with the backbone fixed (`Learner.fit_value_head`).
    """
    mask = action_mask(batch)
    at = action_positions(mask, action_capacity or mask.shape[1])
    hidden = gather_hidden(batch, backbone(critic, batch).hidden, at.row, at.predictors)
    weight = at.valid.astype(jnp.float32)
    target = at.take(returns.astype(jnp.float32))
    features = jnp.concatenate(
        [hidden.astype(jnp.float32), jnp.ones((*hidden.shape[:-1], 1), jnp.float32)], axis=-1
    )
    weighted = features * weight[..., None]
    return {
        "gram": jnp.einsum("rkd,rke->de", weighted, features),
        "moment": jnp.einsum("rkd,rk->d", weighted, target),
        "sum_y": jnp.sum(weight * target),
        "sum_yy": jnp.sum(weight * target * target),
        "count": jnp.sum(weight),
    }


def behaviour_cloning_loss(
    policy: Transformer,
    batch: Batch,
    *,
    moe_aux: MoeAuxConfig,
    chunk_size: int,
    context_weight: float = 0.0,
) -> tuple[jax.Array, Metrics]:
    """Mean NLL of the action tokens (SFT on demonstrations) plus the MoE aux loss.

    `context_weight` > 0 adds that weight times the mean NLL of the other real tokens (prompts,
    observations, admissible-command lists): a language-modelling signal on every token that
    teaches a small model from scratch to read and copy the prompt far sooner than the few
    action tokens alone.
    """
    mask = action_mask(batch)
    logp, entropy, aux = policy_logprobs(policy, batch, chunk_size=chunk_size)
    nll = -masked_token_mean(logp, mask)
    context = (batch["segment_ids"] > 0).astype(jnp.float32).at[:, 0].set(0.0) * (1.0 - mask)
    context_nll = -masked_token_mean(logp, context)
    metrics = {
        "nll": nll,
        "context_nll": context_nll,
        "entropy": masked_token_mean(entropy, mask),
        "num_tokens": jnp.sum(mask),
        "load_balance_loss": aux.load_balance_loss,
        "router_z_loss": aux.router_z_loss,
    }
    loss = nll + context_weight * context_nll + aux.weighted_loss(moe_aux)
    return loss, metrics
