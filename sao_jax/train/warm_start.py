"""Behaviour cloning (SFT) warm start: NLL of demonstrated action tokens, from ATDP batches.

A tiny model starts from random weights and would never win an episode by chance; a few hundred
steps of cloning the expert's replies give RL a policy that sometimes succeeds. Demonstrations
are ordinary ATDP trajectories (written by the rollout package's demo collector) and arrive
through the same loader as RL data. With a real pretrained checkpoint, skip this.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atdp_io.trained_on import TrainedOn
from sao_jax.models import MoeAuxConfig, Transformer
from sao_jax.models.logprobs import LOGPROB_CHUNK
from sao_jax.sharding import LogicalRules
from sao_jax.train import objectives
from sao_jax.train.config import ALL_PARAMETERS, OptimizerConfig
from sao_jax.train.packing import pack_for_placement, unpack
from sao_jax.train.partition import split_trainable
from sao_jax.train.steps import BATCH_KEYS, Placement, guarded_update, make_optimizer

_COMPILED: dict[tuple, Any] = {}


class BehaviourCloner:
    """SFT of a policy on action tokens with its own AdamW (discarded after the warm start).

    Args:
      policy: the model to train (its arrays are taken over; `policy_module()` gives it back).
      optimizer: learning rate etc. of the cloning phase.
      trainable: regexes of parameters that train (default: all).
      moe_aux: weights of the MoE auxiliary losses (None: `MoeAuxConfig()`).
      context_weight: weight of the NLL of non-action tokens (0: actions only), see
        `objectives.behaviour_cloning_loss`.
      pack_rows, pack_row_multiple: run the backbone on the batches' real tokens only, rows
        packed (`sao_jax.train.packing`; the same loss and metrics as unpacked); the packed row
        count is rounded up to a multiple of `pack_row_multiple` (one compiled step per count:
        cloning batches all hold the same number of turns, so their counts stay within a few
        rows of each other and a run compiles two or three).
      pack_factor: a packed row holds `pack_factor` x the batch's row length, so that
        demonstrated turns longer than half a row still share one (with 1, a batch of 110-180
        token turns in 224-token rows packs almost one turn to a row).
      mesh, rules: optional device mesh and logical-axis rules.
    """

    def __init__(
        self,
        policy: Transformer,
        optimizer: OptimizerConfig,
        *,
        trainable: tuple[str, ...] = ALL_PARAMETERS,
        moe_aux: MoeAuxConfig | None = None,
        chunk_size: int = LOGPROB_CHUNK,
        context_weight: float = 0.0,
        pack_rows: bool = True,
        pack_row_multiple: int = 2,
        pack_factor: int = 2,
        mesh: jax.sharding.Mesh | None = None,
        rules: LogicalRules | None = None,
    ):
        self.placement = Placement(mesh, rules)
        self._optimizer = make_optimizer(optimizer)
        self._graphdef, params, frozen = split_trainable(policy, trainable, name="policy")
        self._param_sh = self.placement.params(params)
        self._frozen_sh = self.placement.params(frozen)
        self.params = self.placement.put(params, self._param_sh)
        self._frozen = self.placement.put(frozen, self._frozen_sh)
        self.opt_state = self.placement.init_optimizer(self._optimizer, self.params)
        self._opt_sh = self.placement.like(self.opt_state)
        self._weights = {"moe_aux": moe_aux or MoeAuxConfig(), "context_weight": context_weight}
        self._chunk_size = chunk_size
        if pack_factor < 1:
            raise ValueError(f"BehaviourCloner: pack_factor must be >= 1, got {pack_factor}")
        self._pack_row_multiple = pack_row_multiple if pack_rows else None
        self._pack_factor = pack_factor
        # Everything the compiled step depends on: cloners of one setup share executables.
        self._key = (
            self._graphdef,
            repr(optimizer),
            tuple(sorted(self._weights.items())),
            chunk_size,
            mesh,
            rules,
        )
        self.steps = 0
        self.skipped_steps = 0
        # The trajectories cloned on since the last checkpoint (`Checkpointer.save(...,
        # trained_on=cloner.trained_on)` writes them next to the step; a caller may share one
        # `TrainedOn` between the phases that train one policy).
        self.trained_on = TrainedOn()

    def policy_module(self) -> Transformer:
        """The cloned policy (its arrays; this cloner must not step afterwards)."""
        return nnx.merge(self._graphdef, self.params, self._frozen)

    def step(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One SFT step on a loader batch; returns host metrics (`nll`, `grad_norm`, ...)."""
        missing = [k for k in BATCH_KEYS if k not in batch]
        if missing:
            raise ValueError(f"BehaviourCloner: batch lacks {missing}")
        device_batch = self._device_batch(batch)
        shapes = tuple(sorted((k, tuple(v.shape)) for k, v in device_batch.items()))
        key = (self._key, shapes)
        if key not in _COMPILED:
            _COMPILED[key] = self._build(dict(shapes))
        self.params, self.opt_state, metrics = _COMPILED[key](
            self.params, self._frozen, self.opt_state, device_batch
        )
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.skipped_steps += int(metrics["skipped"])
        self.steps += 1 - int(metrics["skipped"])
        self.trained_on.add_batch(batch)
        return metrics

    def evaluate(self, batches: Iterable[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """Teacher-forced imitation metrics of the current policy on `batches` (held-out
        demonstrations): `nll` (mean over action tokens), `token_accuracy` (greedy next token
        equals the demonstrated one) and `action_accuracy` (every token of a reply right: the
        greedy reply is exactly the expert's), summed over all batches. Raises ValueError when
        the batches hold no action token."""
        totals = np.zeros(3)  # nll sum, correct tokens, action tokens
        replies = np.zeros(2)  # replies, wrong replies
        for batch in batches:
            device_batch = self._device_batch(batch)
            shapes = tuple(sorted((k, tuple(v.shape)) for k, v in device_batch.items()))
            key = (self._key, "evaluate", shapes)
            if key not in _COMPILED:
                _COMPILED[key] = self._build_evaluate(dict(shapes))
            counts = jax.device_get(_COMPILED[key](self.params, self._frozen, device_batch))
            totals[:3] += [counts["nll_sum"], counts["correct_tokens"], counts["action_tokens"]]
            replies += [counts["replies"], counts["wrong_replies"]]
        if totals[2] == 0:
            raise ValueError("BehaviourCloner.evaluate: the batches hold no action token")
        return {
            "nll": float(totals[0] / totals[2]),
            "token_accuracy": float(totals[1] / totals[2]),
            "action_accuracy": float(1.0 - replies[1] / max(replies[0], 1.0)),
            "replies": float(replies[0]),
        }

    def _device_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        host = {k: np.asarray(batch[k]) for k in BATCH_KEYS}
        if self._pack_row_multiple is not None:
            packed_len = self._pack_factor * host["tokens"].shape[1]
            host.update(
                pack_for_placement(
                    host,
                    self.placement,
                    self._pack_row_multiple,
                    packed_len=packed_len,
                    geometric=False,
                )
            )
        return self.placement.put_batch(host)

    def run(self, batches: Iterator[Mapping[str, np.ndarray]], num_steps: int, callback=None):
        """`num_steps` steps over `batches`; `callback(step, metrics)` after each. Returns the
        last metrics. Raises ValueError when the batches run out first (an `AtdpLoader` epoch
        with `num_epochs=None` never does; it raises `LoaderStarvedError` when it can only
        drop)."""
        metrics: dict[str, float] = {}
        for index in range(num_steps):
            try:
                batch = next(batches)
            except StopIteration:
                none_at_all = (
                    " (none at all: does the loader's rows x seq_len fit the demonstrations? "
                    "it drops longer ones, see loader.stats)"
                    if index == 0
                    else ""
                )
                raise ValueError(
                    f"behaviour cloning ran out of demonstration batches after {index} of "
                    f"{num_steps} steps{none_at_all}; read them with num_epochs=None"
                ) from None
            metrics = self.step(batch)
            if callback is not None:
                callback(index + 1, metrics)
        return metrics

    def _build_evaluate(self, shapes: dict[str, tuple[int, ...]]):
        graphdef = self._graphdef

        def counts(params, frozen, batch):
            return imitation_counts(nnx.merge(graphdef, params, frozen), batch)

        place = Placement(self.placement.mesh, self.placement.rules)
        return place.jit(
            counts,
            (self._param_sh, self._frozen_sh, place.batch(shapes)),
            place.replicated(),
        )

    def _build(self, shapes: dict[str, tuple[int, ...]]):
        graphdef, optimizer, weights, chunk = (
            self._graphdef,
            self._optimizer,
            self._weights,
            self._chunk_size,
        )

        def update(params, frozen, opt_state, batch):
            def loss_fn(p):
                return objectives.behaviour_cloning_loss(
                    nnx.merge(graphdef, p, frozen), batch, chunk_size=chunk, **weights
                )

            return guarded_update(loss_fn, optimizer, params, opt_state)

        place = Placement(self.placement.mesh, self.placement.rules)
        return place.jit(
            update,
            (self._param_sh, self._frozen_sh, self._opt_sh, place.batch(shapes)),
            (self._param_sh, self._opt_sh, place.replicated()),
            donate_argnums=(0, 2),
        )


def imitation_counts(policy: Transformer, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Teacher-forced counts over the action tokens of a batch (scalars, summable over batches).

    A reply is a maximal run of action tokens in a row (one per windowed row; one per turn in a
    concat row). Returns `nll_sum` (-sum log p of the action tokens), `correct_tokens` (greedy
    prediction equals the token), `action_tokens`, `replies` and `wrong_replies` (replies with
    at least one wrong token).
    """
    mask = objectives.action_mask(batch) > 0  # [R, T]; column t is predicted from t - 1
    hidden = unpack(batch, objectives.backbone(policy, batch).hidden)  # [R, T, D]
    logits = policy.logits(hidden)[:, :-1]  # [R, T-1, V]: predictions of tokens 1..T-1
    targets = batch["tokens"][:, 1:]
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    logp = jnp.pad(logp, ((0, 0), (1, 0)))
    correct = jnp.pad(jnp.argmax(logits, axis=-1) == targets, ((0, 0), (1, 0))) & mask
    starts = mask & ~jnp.pad(mask[:, :-1], ((0, 0), (1, 0)))
    rows, length = mask.shape
    run_id = jnp.cumsum(starts, axis=1) + (jnp.arange(rows) * (length + 1))[:, None]
    wrong = (mask & ~correct).astype(jnp.int32)
    wrong_runs = jax.ops.segment_max(
        jnp.where(mask, wrong, 0).reshape(-1), run_id.reshape(-1), num_segments=rows * (length + 1)
    )
    return {
        "nll_sum": -jnp.sum(jnp.where(mask, logp, 0.0)),
        "correct_tokens": jnp.sum(correct),
        "action_tokens": jnp.sum(mask),
        "replies": jnp.sum(starts),
        "wrong_replies": jnp.sum(jnp.maximum(wrong_runs, 0)),
    }
