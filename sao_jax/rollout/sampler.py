"""KV-cache sampler: jitted prefill and a jitted decode loop over a donated, per-slot cache.

Two levels of API:
- `Sampler.generate(prompts, sampling)`: a batch of prompts of different lengths in, token ids,
  per-token log-probs (temperature 1, what DIS needs), lengths and the policy version out.
- The slot API a continuous-batching worker builds on: `init_state(num_slots, cache_len)`,
  `prefill(state, prompts, slots, sampling)` (refill any slots at any time; `cached=` skips
  a prefix the slot's cache already holds), `extend(...)` (continue a finished slot) and
  `decode(state, num_steps)` (advance every active slot, several tokens per dispatch).
  Both take an optional `token_mask` (a per-row bitmask of allowed ids, for constrained
  decoding: applied to the logits inside the jitted step) and `behaviour=True` (also return
  each token's log-prob under the distribution actually sampled: temperature, top-k, top-p
  and mask applied).

Layout: prompts are right-padded; slot b keeps token p at cache index p, so positions are
exact and slots are independent. Prompt length, batch size and generation length are rounded
up to powers of two ("buckets"), so a long run compiles a handful of shapes, not one per
prompt length. Decoding settings are per-row arrays: changing them never recompiles, and
`update_weights` swaps parameters of the same shapes without recompiling.

Prefill cost is mostly padding when prompts differ in length and few slots refill at once
(a power-of-two bucket of rows x tokens). Two host-side measures cut it, both leaving every
row's tokens and log-probs as they were (rows are independent; see docs/rollout.md):
- `split_prefill`: a load's rows are split into dispatches of similar lengths when that
  encodes fewer padded positions (`plan_prefill`), instead of one [rows, longest] batch;
- `attention_window`: a prefill attends over (and writes back) only the first
  bucket(start + length) cache positions of its slots instead of the whole cache length.

MoE routing is dropless here by default (`capacity_factor=0`), so a token's probability
depends only on its own sequence, never on what else shares the batch.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from sao_jax.models.transformer import Transformer
from sao_jax.rollout.kv_cache import KVCache, init_kv_cache, kv_cache_shardings
from sao_jax.rollout.sampling import (
    SamplingParams,
    allowed_tokens,
    behaviour_logprob,
    sample_tokens,
    token_logprob,
)
from sao_jax.sharding import LogicalRules, named_sharding, state_shardings


@struct.dataclass
class DecodeState:
    """Everything the decode loop carries, one row per slot (B slots, M stop ids per slot).

    tokens: [B] last sampled token (fed at the next step); positions: [B] cache index it goes to;
    active: [B] still generating; num_generated: [B]; max_new_tokens: [B]; seeds: [B] uint32;
    temperature, top_p: [B] float32; top_k: [B] int32; stop_ids: [B, M] int32 (-1 = unused).
    """

    cache: KVCache
    tokens: jax.Array
    positions: jax.Array
    active: jax.Array
    num_generated: jax.Array
    max_new_tokens: jax.Array
    seeds: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    stop_ids: jax.Array


@struct.dataclass
class RowSettings:
    """Per-request decoding settings as arrays [n] (stop_ids [n, M])."""

    max_new_tokens: jax.Array
    seeds: jax.Array
    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    stop_ids: jax.Array


@dataclasses.dataclass(frozen=True)
class SampleResult:
    """Output of `Sampler.generate` for n prompts, padded to the longest request (N).

    tokens: [n, N] int32 generated ids (pad_id after the end); logprobs: [n, N] float32
    log-probs of those tokens under the policy at temperature 1 (0 after the end); lengths: [n]
    generated tokens per row (a stop token counts); finish_reasons: "stop" or "length";
    policy_version: the weights version that produced every token.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    finish_reasons: tuple[str, ...]
    policy_version: int


DEFAULT_SAMPLING = SamplingParams()


def bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return 1 << (max(n, minimum) - 1).bit_length()


# Fixed cost of one more prefill dispatch, in padded token positions (a dispatch of the tiny
# preset costs ~2 ms on a CPU core, about what 32-64 positions of a batch cost).
SPLIT_COST_TOKENS = 48


def plan_prefill(
    lengths: Sequence[int], min_bucket: int, cache_len: int, split_cost: int = SPLIT_COST_TOKENS
) -> list[list[int]]:
    """Split the rows of one load into dispatches that encode the fewest padded positions.

    A dispatch of k rows of at most L tokens costs bucket(k) x bucket(L) positions (the
    shapes the sampler compiles) plus `split_cost`. Rows are taken longest first and cut into
    consecutive runs (an optimal split of this cost never interleaves lengths), found by
    dynamic programming. Returns lists of row indices, each longest first; one list when
    splitting does not pay.
    """
    n = len(lengths)
    if n == 0:
        raise ValueError("plan_prefill needs at least one row")
    order = sorted(range(n), key=lambda i: -lengths[i])
    best = [0] + [None] * n  # best[j]: cheapest cover of order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            width = min(bucket(lengths[order[i]], min_bucket), cache_len)
            cost = best[i] + bucket(j - i, 1) * width + split_cost
            if best[j] is None or cost < best[j]:
                best[j], cut[j] = cost, i
    groups = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _row_keys(seeds: jax.Array, counters: jax.Array) -> jax.Array:
    return jax.vmap(lambda s, c: jax.random.fold_in(jax.random.key(s), c))(seeds, counters)


def _hits_stop(tokens: jax.Array, stop_ids: jax.Array) -> jax.Array:
    return jnp.any(tokens[:, None] == stop_ids, axis=-1)


def _masked(logits: jax.Array, token_mask: jax.Array | None) -> jax.Array:
    """The logits sampling draws from: disallowed ids at -inf (token_mask None: all)."""
    if token_mask is None:
        return logits
    return jnp.where(allowed_tokens(token_mask, logits.shape[-1]), logits, -jnp.inf)


class Sampler:
    """Batched autoregressive sampling from a `Transformer` with a preallocated KV cache."""

    def __init__(
        self,
        model: Transformer,
        *,
        policy_version: int = 0,
        mesh: jax.sharding.Mesh | None = None,
        rules: LogicalRules | None = None,
        pad_id: int = 0,
        max_stop_tokens: int = 8,
        min_prompt_bucket: int = 16,
        min_new_tokens_bucket: int = 16,
        capacity_factor: float | None = 0.0,
        split_prefill: bool = True,
        attention_window: bool = True,
    ):
        """Args:
        model: the policy; its parameters are taken as the initial weights.
        policy_version: version stamp of those weights.
        mesh: optional device mesh; parameters, cache and rows are then sharded by logical axes
          (`rules`, default `sao_jax.sharding.DEFAULT_RULES`) with explicit jit shardings.
        pad_id: id written after a row's last generated token.
        max_stop_tokens: stop ids per request (M).
        min_prompt_bucket, min_new_tokens_bucket: smallest padded prompt / generation lengths.
        capacity_factor: MoE capacity while sampling (0: dropless; None: the model's own).
        split_prefill: split a load into dispatches of similar prompt lengths when that pads
          less (`plan_prefill`); False: one dispatch per load. An attribute, may be changed
          between calls.
        attention_window: a prefill attends over the bucketed first positions its rows reach
          rather than the whole cache; False: the whole cache. May be changed between calls.
        """
        config = model.config
        if capacity_factor is not None:
            config = config.replace(capacity_factor=capacity_factor)
        self.config = config
        self.graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
        self.mesh, self.rules = mesh, rules
        self.pad_id, self.max_stop_tokens = pad_id, max_stop_tokens
        self.min_prompt_bucket, self.min_new_tokens_bucket = (
            min_prompt_bucket,
            min_new_tokens_bucket,
        )
        params = nnx.state(model)
        self._param_shardings = state_shardings(params, mesh, rules) if mesh is not None else None
        self._structure = jax.tree.structure(params)
        self._abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        self._jitted: dict[tuple, object] = {}
        self.split_prefill, self.attention_window = split_prefill, attention_window
        self.params: nnx.State = params
        self.policy_version = policy_version
        # Bumped by every `update_weights`, even one that keeps the version number: a cache
        # built under an older generation must not be reused (`prefill(cached=...)`).
        self.weights_generation = -1
        self.update_weights(params, policy_version)

    # ----------------------------------------------------------------------------- weights
    def update_weights(self, params: nnx.State | Transformer, version: int) -> None:
        """Swap in new weights (same shapes and dtypes) stamped `version`; never recompiles."""
        if isinstance(params, nnx.Module):
            params = nnx.state(params)
        if jax.tree.structure(params) != self._structure:
            raise ValueError("update_weights: parameter tree differs from the sampler's model")
        for (path, new), old in zip(
            jax.tree.leaves_with_path(params), jax.tree.leaves(self._abstract), strict=True
        ):
            if new.shape != old.shape or new.dtype != old.dtype:
                raise ValueError(
                    f"update_weights: {jax.tree_util.keystr(path)} is {new.shape} {new.dtype}, "
                    f"expected {old.shape} {old.dtype}"
                )
        if self._param_shardings is not None:
            params = jax.device_put(params, self._param_shardings)
        self.params = params
        self.policy_version = int(version)
        self.weights_generation += 1

    def num_compiled(self) -> int:
        """Executables compiled so far (prefill / decode / init per bucketed shape); a value
        that keeps growing in a long run means shapes are not being bucketed."""
        return sum(fn._cache_size() for fn in self._jitted.values())  # type: ignore[attr-defined]

    # ----------------------------------------------------------------------- jitted kernels
    def _model(self, params: nnx.State) -> Transformer:
        return nnx.merge(self.graphdef, params)

    def _init_impl(self, num_slots: int, length: int) -> DecodeState:
        zeros_i = jnp.zeros((num_slots,), jnp.int32)
        return DecodeState(
            cache=init_kv_cache(self.config, num_slots, length),
            tokens=zeros_i,
            positions=zeros_i,
            active=jnp.zeros((num_slots,), bool),
            num_generated=zeros_i,
            max_new_tokens=zeros_i,
            seeds=jnp.zeros((num_slots,), jnp.uint32),
            temperature=jnp.ones((num_slots,), jnp.float32),
            top_k=zeros_i,
            top_p=jnp.ones((num_slots,), jnp.float32),
            stop_ids=jnp.full((num_slots, self.max_stop_tokens), -1, jnp.int32),
        )

    def _prefill_impl(
        self,
        params: nnx.State,
        state: DecodeState,
        tokens: jax.Array,
        lengths: jax.Array,
        starts: jax.Array,
        slots: jax.Array,
        rows: RowSettings,
        token_mask: jax.Array | None,
        window: int,
        behaviour: bool = False,
    ) -> tuple[jax.Array, ...]:
        """Encode `tokens` at `starts` in `slots`; every valid position is below `window`, so
        the slots' first `window` cache positions are all the attention needs."""
        model = self._model(params)
        n, p = tokens.shape
        offsets = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (n, p))
        positions = starts[:, None] + offsets
        segment_ids = (offsets < lengths[:, None]).astype(jnp.int32)
        sub = state.cache.take_slots(slots, window)
        out = model.forward(
            tokens, positions=positions, segment_ids=segment_ids, kv_cache=sub.layers()
        )
        cache = state.cache.put_slots(slots, KVCache.from_layers(out.kv_cache))
        last = jnp.take_along_axis(out.hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
        logits = model.logits(last)
        keys = _row_keys(rows.seeds, jnp.zeros_like(lengths))
        sampled_from = _masked(logits, token_mask)
        first = sample_tokens(sampled_from, keys, rows.temperature, rows.top_k, rows.top_p)
        logp = token_logprob(logits, first)
        finished = _hits_stop(first, rows.stop_ids) | (rows.max_new_tokens <= 1)

        def put(field: jax.Array, value: jax.Array) -> jax.Array:
            return field.at[slots].set(value.astype(field.dtype), mode="drop")

        state = state.replace(
            cache=cache,
            tokens=put(state.tokens, first),
            positions=put(state.positions, starts + lengths),
            active=put(state.active, ~finished),
            num_generated=put(state.num_generated, jnp.ones_like(lengths)),
            max_new_tokens=put(state.max_new_tokens, rows.max_new_tokens),
            seeds=put(state.seeds, rows.seeds),
            temperature=put(state.temperature, rows.temperature),
            top_k=put(state.top_k, rows.top_k),
            top_p=put(state.top_p, rows.top_p),
            stop_ids=put(state.stop_ids, rows.stop_ids),
        )
        if behaviour:
            behaviour_logp = behaviour_logprob(
                sampled_from, first, rows.temperature, rows.top_k, rows.top_p
            )
            return state, first, logp, finished, behaviour_logp
        return state, first, logp, finished

    def _decode_impl(
        self,
        params: nnx.State,
        state: DecodeState,
        token_mask: jax.Array | None,
        num_steps: int,
        behaviour: bool = False,
    ) -> tuple[jax.Array, ...]:
        model = self._model(params)
        b = state.tokens.shape[0]
        out_tokens = jnp.full((b, num_steps), self.pad_id, jnp.int32)
        out_logp = jnp.zeros((b, num_steps), jnp.float32)
        out_emitted = jnp.zeros((b, num_steps), bool)
        out_behaviour = jnp.zeros((b, num_steps), jnp.float32)

        def step(carry):
            state, out_tokens, out_logp, out_emitted, out_behaviour, i = carry
            out = model.forward(
                state.tokens[:, None],
                positions=state.positions[:, None],
                segment_ids=state.active[:, None].astype(jnp.int32),
                kv_cache=state.cache.layers(),
            )
            logits = model.logits(out.hidden[:, 0])
            keys = _row_keys(state.seeds, state.num_generated)
            sampled_from = _masked(logits, token_mask)
            token = sample_tokens(sampled_from, keys, state.temperature, state.top_k, state.top_p)
            logp = token_logprob(logits, token)
            if behaviour:
                blogp = behaviour_logprob(
                    sampled_from, token, state.temperature, state.top_k, state.top_p
                )
                out_behaviour = out_behaviour.at[:, i].set(jnp.where(state.active, blogp, 0.0))
            live = state.active
            generated = state.num_generated + live
            finished = _hits_stop(token, state.stop_ids) | (generated >= state.max_new_tokens)
            state = state.replace(
                cache=KVCache.from_layers(out.kv_cache),
                tokens=jnp.where(live, token, state.tokens),
                positions=state.positions + live,
                num_generated=generated,
                active=live & ~finished,
            )
            out_tokens = out_tokens.at[:, i].set(jnp.where(live, token, self.pad_id))
            out_logp = out_logp.at[:, i].set(jnp.where(live, logp, 0.0))
            out_emitted = out_emitted.at[:, i].set(live)
            return state, out_tokens, out_logp, out_emitted, out_behaviour, i + 1

        def keep_going(carry) -> jax.Array:
            return (carry[-1] < num_steps) & jnp.any(carry[0].active)

        carry = (state, out_tokens, out_logp, out_emitted, out_behaviour, jnp.int32(0))
        state, out_tokens, out_logp, out_emitted, out_behaviour, _ = jax.lax.while_loop(
            keep_going, step, carry
        )
        if behaviour:
            return state, out_tokens, out_logp, out_emitted, out_behaviour
        return state, out_tokens, out_logp, out_emitted

    # ------------------------------------------------------------------ jit with shardings
    def _row_sharding(self, *shape: int):
        axes = ("cache_batch",) + (None,) * (len(shape) - 1)
        return named_sharding(self.mesh, axes, shape, self.rules)

    def _state_shardings(self, num_slots: int, length: int) -> DecodeState:
        row = self._row_sharding(num_slots)
        return DecodeState(
            cache=kv_cache_shardings(self.config, num_slots, length, self.mesh),
            tokens=row,
            positions=row,
            active=row,
            num_generated=row,
            max_new_tokens=row,
            seeds=row,
            temperature=row,
            top_k=row,
            top_p=row,
            stop_ids=self._row_sharding(num_slots, self.max_stop_tokens),
        )

    def _get_jitted(self, kind: str, num_slots: int, length: int, extra: tuple = ()):
        key = (kind, num_slots, length, *extra)
        if key in self._jitted:
            return self._jitted[key]
        kwargs: dict = {}
        if kind == "init":
            fn = lambda: self._init_impl(num_slots, length)  # noqa: E731
        elif kind == "prefill":
            window, masked, behaviour = extra[2:]
            fn = functools.partial(self._prefill_impl, window=window, behaviour=behaviour)
            kwargs["donate_argnums"] = (1,)
        else:
            num_steps, masked, behaviour = extra
            fn = functools.partial(self._decode_impl, num_steps=num_steps, behaviour=behaviour)
            kwargs["donate_argnums"] = (1,)
        if self.mesh is not None:
            state_sh = self._state_shardings(num_slots, length)
            replicated = named_sharding(self.mesh, (), ())
            if kind == "init":
                kwargs["out_shardings"] = state_sh
            elif kind == "prefill":
                n, p = extra[:2]
                mask_sh = self._row_sharding(n, self._mask_words) if masked else None
                outputs = 5 if behaviour else 4
                kwargs["in_shardings"] = (
                    self._param_shardings,
                    state_sh,
                    self._row_sharding(n, p),
                    self._row_sharding(n),
                    self._row_sharding(n),
                    self._row_sharding(n),
                    RowSettings(
                        *(self._row_sharding(n),) * 5, self._row_sharding(n, self.max_stop_tokens)
                    ),
                    mask_sh,
                )
                kwargs["out_shardings"] = (state_sh, *(replicated,) * (outputs - 1))
            else:
                mask_sh = self._row_sharding(num_slots, self._mask_words) if masked else None
                outputs = 5 if behaviour else 4
                kwargs["in_shardings"] = (self._param_shardings, state_sh, mask_sh)
                kwargs["out_shardings"] = (state_sh, *(replicated,) * (outputs - 1))
        jitted = jax.jit(fn, **kwargs)
        if kind == "prefill" and self.mesh is not None and jax.process_count() > 1:
            # In a multi-process job jit refuses host rows for a sharded argument, even on a
            # mesh of this process's own devices (each process samples on its own): place them.
            row_shardings = kwargs["in_shardings"][2:]

            def jitted(params, state, *rows, _jitted=jitted):
                return _jitted(params, state, *jax.device_put(rows, row_shardings))

        self._jitted[key] = jitted
        return self._jitted[key]

    def _call(self, fn, *args):
        if self.mesh is None:
            return fn(*args)
        with jax.set_mesh(self.mesh):
            return fn(*args)

    # ------------------------------------------------------------------------ slot API
    def init_state(self, num_slots: int, cache_len: int) -> DecodeState:
        """An empty decode state: `num_slots` inactive slots of `cache_len` positions each."""
        return self._call(self._get_jitted("init", num_slots, cache_len))

    def _row_settings(self, sampling: Sequence[SamplingParams], n: int) -> RowSettings:
        pad = [sampling[-1]] * (n - len(sampling))
        rows = list(sampling) + pad
        stop = np.full((n, self.max_stop_tokens), -1, np.int32)
        for i, s in enumerate(rows):
            if len(s.stop_token_ids) > self.max_stop_tokens:
                raise ValueError(
                    f"{len(s.stop_token_ids)} stop tokens > max_stop_tokens={self.max_stop_tokens}"
                )
            stop[i, : len(s.stop_token_ids)] = s.stop_token_ids
        return RowSettings(
            max_new_tokens=np.array([s.max_new_tokens for s in rows], np.int32),
            seeds=np.array([s.seed % 2**32 for s in rows], np.uint32),
            temperature=np.array([s.temperature for s in rows], np.float32),
            top_k=np.array([s.top_k for s in rows], np.int32),
            top_p=np.array([s.top_p for s in rows], np.float32),
            stop_ids=stop,
        )

    def prefill(
        self,
        state: DecodeState,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams] = DEFAULT_SAMPLING,
        *,
        cached: Sequence[int] | None = None,
        token_mask: np.ndarray | None = None,
        behaviour: bool = False,
    ) -> tuple[np.ndarray | DecodeState, ...]:
        """Load `prompts` into `slots` (replacing whatever was there) and sample their first token.

        cached: per prompt, how many of its leading tokens the slot's cache already holds at
          positions 0.. (keys and values of exactly those ids, encoded by the current weights:
          the caller keeps track, e.g. the previous turn's prompt of the slot); only the rest
          is encoded. 0 <= cached[i] < len(prompts[i]) (the last token is always encoded: its
          logits give the first sample). None: nothing cached.

        token_mask: [n, ceil(V / 32)] int32 bitmask of the ids each row may sample (bit i % 32
          of word i // 32; llguidance's layout), or None: every id.
        behaviour: also return each first token's log-prob under the distribution sampled.

        `state` is donated: use the returned one. Returns (state, first_tokens [n],
        first_logprobs [n], finished [n] bool[, behaviour_logprobs [n]]).
        """
        return self._load(
            state,
            prompts,
            slots,
            sampling,
            extend=False,
            cached=cached,
            token_mask=token_mask,
            behaviour=behaviour,
        )

    def extend(
        self,
        state: DecodeState,
        continuations: Sequence[Sequence[int]],
        slots: Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams] = DEFAULT_SAMPLING,
        *,
        token_mask: np.ndarray | None = None,
        behaviour: bool = False,
    ) -> tuple[np.ndarray | DecodeState, ...]:
        """Continue finished slots with more tokens (the next turn) and sample again.

        Each slot keeps its cached sequence; its last sampled token (not yet in the cache) and
        then `continuations[i]` are appended, so a multi-turn episode never re-encodes its
        history. Same returns as `prefill` (`token_mask` and `behaviour` likewise); `state` is
        donated.
        """
        return self._load(
            state,
            continuations,
            slots,
            sampling,
            extend=True,
            token_mask=token_mask,
            behaviour=behaviour,
        )

    def _load(
        self,
        state: DecodeState,
        prompts: Sequence[Sequence[int]],
        slots: Sequence[int],
        sampling: SamplingParams | Sequence[SamplingParams],
        *,
        extend: bool,
        cached: Sequence[int] | None = None,
        token_mask: np.ndarray | None = None,
        behaviour: bool = False,
    ) -> tuple[np.ndarray | DecodeState, ...]:
        n = len(prompts)
        if n == 0 or len(slots) != n:
            raise ValueError(f"need one slot per prompt, got {n} prompts and {len(slots)} slots")
        sampling = [sampling] * n if isinstance(sampling, SamplingParams) else list(sampling)
        if len(sampling) != n:
            raise ValueError(f"got {len(sampling)} SamplingParams for {n} prompts")
        if len(set(slots)) != n:
            raise ValueError(f"slots must be distinct, got {list(slots)}")
        num_slots, cache_len = state.cache.num_slots, state.cache.length
        for i, slot in enumerate(slots):
            if not 0 <= slot < num_slots:
                raise ValueError(f"slot {slot} of prompt {i} is outside [0, {num_slots})")
        starts = [0] * n
        if cached is not None:
            cached = [int(c) for c in cached]
            if len(cached) != n:
                raise ValueError(f"got {len(cached)} cached lengths for {n} prompts")
            for i, (c, prompt) in enumerate(zip(cached, prompts, strict=True)):
                if not 0 <= c < len(prompt):
                    raise ValueError(
                        f"cached[{i}]={c} must be in [0, {len(prompt)}): the prompt's last "
                        "token is always encoded"
                    )
            starts = cached
            prompts = [list(prompt[c:]) for prompt, c in zip(prompts, cached, strict=True)]
        if extend:
            active = np.asarray(state.active)[list(slots)]
            if active.any():
                raise ValueError(
                    f"cannot extend slots still generating: {np.asarray(slots)[active]}"
                )
            pending = np.asarray(state.tokens)[list(slots)]
            starts = np.asarray(state.positions)[list(slots)].tolist()
            prompts = [[int(t), *c] for t, c in zip(pending, prompts, strict=True)]
        vocab = self.config.vocab_size
        for i, (prompt, start, s) in enumerate(zip(prompts, starts, sampling, strict=True)):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise ValueError(f"prompt {i} has token ids outside [0, vocab_size={vocab})")
            if start + len(prompt) + s.max_new_tokens - 1 > cache_len:
                raise ValueError(
                    f"prompt {i}: {start} cached + {len(prompt)} prompt + {s.max_new_tokens} new "
                    f"tokens do not fit a cache of {cache_len} positions"
                )
        lengths = [len(p) for p in prompts]
        if self.split_prefill:
            groups = plan_prefill(lengths, self.min_prompt_bucket, cache_len)
        else:
            groups = [list(range(n))]
        if token_mask is not None:
            token_mask = self._check_mask(token_mask, n)
        outputs = []
        for group in groups:  # dispatched back to back; read once all are queued
            state, *out = self._dispatch_prefill(
                state,
                [prompts[i] for i in group],
                [starts[i] for i in group],
                [slots[i] for i in group],
                [sampling[i] for i in group],
                None if token_mask is None else token_mask[group],
                behaviour,
            )
            outputs.append(out)
        first = np.zeros((n,), np.int32)
        logp = np.zeros((n,), np.float32)
        finished = np.zeros((n,), bool)
        behaviour_logp = np.zeros((n,), np.float32)
        for group, out in zip(groups, outputs, strict=True):
            k = len(group)
            first[group] = np.asarray(out[0])[:k]
            logp[group] = np.asarray(out[1])[:k]
            finished[group] = np.asarray(out[2])[:k]
            if behaviour:
                behaviour_logp[group] = np.asarray(out[3])[:k]
        if behaviour:
            return state, first, logp, finished, behaviour_logp
        return state, first, logp, finished

    @property
    def _mask_words(self) -> int:
        return (self.config.vocab_size + 31) // 32

    def _check_mask(self, token_mask: np.ndarray, rows: int) -> np.ndarray:
        token_mask = np.asarray(token_mask)
        if token_mask.shape != (rows, self._mask_words) or token_mask.dtype != np.int32:
            raise ValueError(
                f"token_mask must be int32 [{rows}, {self._mask_words}], got "
                f"{token_mask.dtype} {list(token_mask.shape)}"
            )
        return token_mask

    def _dispatch_prefill(self, state, prompts, starts, slots, sampling, token_mask, behaviour):
        """One jitted prefill of these rows (validated by `_load`); device outputs."""
        n = len(prompts)
        num_slots, cache_len = state.cache.num_slots, state.cache.length
        p = min(bucket(max(len(q) for q in prompts), self.min_prompt_bucket), cache_len)
        window = cache_len
        if self.attention_window:
            reach = max(s + len(q) for s, q in zip(starts, prompts, strict=True))
            window = min(bucket(reach, self.min_prompt_bucket), cache_len)
        rows = bucket(n, 1)
        tokens = np.full((rows, p), self.pad_id, np.int32)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = prompt
        lengths_arr = np.ones((rows,), np.int32)
        lengths_arr[:n] = [len(q) for q in prompts]
        starts_arr = np.zeros((rows,), np.int32)
        starts_arr[:n] = starts
        slots_arr = np.full((rows,), num_slots, np.int32)  # padding rows write nowhere
        slots_arr[:n] = slots
        mask_arr = None
        if token_mask is not None:
            mask_arr = np.full((rows, self._mask_words), -1, np.int32)  # padding: every id
            mask_arr[:n] = token_mask
        key = (rows, p, window, mask_arr is not None, behaviour)
        fn = self._get_jitted("prefill", num_slots, cache_len, key)
        return self._call(
            fn,
            self.params,
            state,
            tokens,
            lengths_arr,
            starts_arr,
            slots_arr,
            self._row_settings(sampling, rows),
            mask_arr,
        )

    def decode(
        self,
        state: DecodeState,
        num_steps: int,
        *,
        token_mask: np.ndarray | None = None,
        behaviour: bool = False,
    ) -> tuple[np.ndarray | DecodeState, ...]:
        """Advance every active slot by up to `num_steps` tokens in one jitted while-loop.

        token_mask: [B, ceil(V / 32)] int32 bitmask of allowed ids per slot (see `prefill`);
          it holds for one token, so it needs num_steps == 1.
        `state` is donated. Returns (state, tokens [B, num_steps], logprobs [B, num_steps],
        emitted [B, num_steps] bool[, behaviour_logprobs [B, num_steps]]); the loop stops
        early once no slot is active.
        """
        num_slots = state.cache.num_slots
        if token_mask is not None:
            if num_steps != 1:
                raise ValueError("a token_mask holds for one step: decode with num_steps=1")
            token_mask = self._check_mask(token_mask, num_slots)
        key = (num_steps, token_mask is not None, behaviour)
        fn = self._get_jitted("decode", num_slots, state.cache.length, key)
        state, *out = self._call(fn, self.params, state, token_mask)
        return (state, *(np.asarray(o) for o in out))

    # ------------------------------------------------------------------------- batch API
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingParams | Sequence[SamplingParams] = DEFAULT_SAMPLING,
    ) -> SampleResult:
        """Sample a continuation of every prompt (a batch of different lengths)."""
        n = len(prompts)
        if n == 0:
            raise ValueError("generate needs at least one prompt")
        sampling = [sampling] * n if isinstance(sampling, SamplingParams) else list(sampling)
        if len(sampling) != n:
            raise ValueError(f"got {len(sampling)} SamplingParams for {n} prompts")
        longest_prompt = max((len(p) for p in prompts), default=0)
        max_new = max(s.max_new_tokens for s in sampling)
        p = bucket(longest_prompt, self.min_prompt_bucket)
        new = bucket(max_new, self.min_new_tokens_bucket)
        slots = bucket(n, 1)
        state = self.init_state(slots, p + new)
        version = self.policy_version
        state, first, first_logp, _ = self.prefill(state, prompts, list(range(n)), sampling)
        # Bucketed step count: the loop exits as soon as every row has finished.
        state, tokens, logp, emitted = self.decode(state, new - 1)
        del state
        tokens, logp, emitted = (
            tokens[:, : max_new - 1],
            logp[:, : max_new - 1],
            emitted[:, : max_new - 1],
        )
        # A slot stays active until it finishes, so its emitted steps are a prefix.
        out_tokens = np.concatenate([first[:, None], tokens[:n]], axis=1)
        out_logp = np.concatenate([first_logp[:, None], logp[:n]], axis=1)
        lengths = 1 + emitted[:n].sum(axis=1)
        live = np.arange(max_new)[None, :] < lengths[:, None]
        out_tokens = np.where(live, out_tokens, self.pad_id).astype(np.int32)
        out_logp = np.where(live, out_logp, 0.0).astype(np.float32)
        reasons = tuple(
            "stop" if out_tokens[i, lengths[i] - 1] in sampling[i].stop_token_ids else "length"
            for i in range(n)
        )
        return SampleResult(out_tokens, out_logp, lengths.astype(np.int32), reasons, version)
