"""Continuous batching over the sampler's slot API, on one engine thread.

Each loop iteration: apply a pending weight swap (then re-prefill the running slots so the rest
of every reply is computed under the new weights), drop cancelled / timed-out requests, prefill
waiting requests into free slots, advance every running slot `decode_steps` tokens in one
jitted dispatch, and push the new tokens to the callers' event loops. A request joins the batch
at the next iteration after it arrives and leaves it the moment it finishes, so the batch stays
full under load. Every token is stamped with the policy version that sampled it.

Long contexts: the KV cache starts at most `INITIAL_CACHE_LENGTH` positions per slot and
grows (powers of two, up to the context length) when a request needs more, so a worker that
advertises 64K positions pays for them only once a long request arrives. A prompt longer than
`prefill_chunk` is encoded in pieces, one per loop iteration (each attends to the cache written
before it), so its attention scores are [chunk, positions so far], never [prompt, prompt], and
the other slots keep decoding between its chunks. A new request is
placed in the slot whose cached tokens share the longest prefix with its prompt
(`prefix_cache.py`), and only the rest of the prompt is encoded.

Admission (validation, AReaL's staleness capacity -> 429) is in `admission.py`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.rollout import DecodeState, Sampler, SamplingParams
from sao_jax.rollout.sampler import bucket
from sao_jax.tokenizers import Tokenizer
from serving.common.errors import ApiError
from serving.worker.admission import staleness_capacity, validate_request
from serving.worker.config import WorkerConfig
from serving.worker.constraints import GrammarCompiler
from serving.worker.generation import Finished, GenerationHandle, GenerationRequest, TextTracker
from serving.worker.metrics import WorkerMetrics
from serving.worker.prefix_cache import SlotContents
from serving.worker.scoring import TopLogprobScorer
from serving.worker.slots import Slot

logger = logging.getLogger(__name__)

# Positions per slot the cache starts with (the context length when that is shorter).
INITIAL_CACHE_LENGTH = 4096


@dataclasses.dataclass
class _Chunking:
    """A prompt being encoded chunk by chunk into its slot: tokens [0, done) are in the cache."""

    prompt: list[int]
    done: int
    max_new: int
    seed: int


@dataclasses.dataclass
class _WeightUpdate:
    params: Any
    version: int
    future: concurrent.futures.Future


def _deactivate(state: DecodeState, keep: jax.Array) -> DecodeState:
    return state.replace(active=state.active & keep)


def _grow(state: DecodeState, empty: DecodeState) -> DecodeState:
    """`state` with its cache [B, K, S, Dh] copied into the first S positions of `empty`'s
    longer one [B, K, S', Dh]."""
    slots = jnp.arange(state.cache.num_slots)
    return state.replace(cache=empty.cache.put_slots(slots, state.cache))


class GenerationEngine:
    """Serves `GenerationRequest`s from many coroutines with one batched sampler."""

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: Tokenizer,
        config: WorkerConfig,
        metrics: WorkerMetrics | None = None,
    ):
        if config.context_length > sampler.config.max_seq_len:
            raise ValueError(
                f"context_length {config.context_length} exceeds the model's max_seq_len "
                f"{sampler.config.max_seq_len}"
            )
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics or WorkerMetrics()
        self.vocab_size = sampler.config.vocab_size
        self._scorer = TopLogprobScorer(sampler)
        self._grammars: GrammarCompiler | None = None  # built at the first grammar request
        think = (tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>"))
        # A thinking budget needs both tags as single tokens; without them it is not applied.
        self._think_ids = None if None in think else think
        self._deactivate = jax.jit(_deactivate, donate_argnums=0)
        self._grow = jax.jit(_grow, donate_argnums=1)  # its cache becomes the new one
        self.cache_length = min(config.context_length, INITIAL_CACHE_LENGTH)
        self.slot_contents = SlotContents(config.num_slots, enabled=config.prefix_cache)
        self._chunking: dict[int, _Chunking] = {}  # slot -> its long prompt's progress
        # Prompt tokens encoded / taken from a slot's cache (engine thread only; tests and
        # benchmarks read them, Prometheus has the same counts).
        self.prefill_tokens = 0
        self.cached_tokens = 0
        self._cv = threading.Condition()
        self._pending: collections.deque[GenerationHandle] = collections.deque()
        self._slots: list[Slot | None] = [None] * config.num_slots
        self._update: _WeightUpdate | None = None
        self._paused = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._base_version = sampler.policy_version
        self.accepted = 0  # requests finished normally (stop / length)
        self.metrics.policy_version.set(sampler.policy_version)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start (or restart after `stop`) the engine thread. A thread a `stop` left still
        finishing its dispatch is waited for first: two threads never share the KV cache."""
        if self._thread is not None and self._stopping:
            self._thread.join()
            self._thread = None
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="generation-engine", daemon=True)
            self._thread.start()

    def warmup(self) -> int:
        """Compile every prefill shape the engine can dispatch (prompt-length buckets up to the
        context x batch-size buckets up to max_prefill_batch, at most num_slots) and the decode
        loop, before serving: otherwise the first request of each new shape waits for XLA. Call
        before `start`; returns the number of shapes run."""
        if self._thread is not None:
            raise RuntimeError("warmup must run before the engine starts")
        sampler, context = self.sampler, self.cache_length
        lengths, length = [], sampler.min_prompt_bucket
        while length < context:
            lengths.append(length)
            length *= 2
        lengths.append(context - 1)
        # a prefill takes at most max_prefill_batch requests, and no more than there are slots
        most = min(self.config.max_prefill_batch, self.config.num_slots)
        batches = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= most]
        if most not in batches:
            batches.append(most)
        state = sampler.init_state(self.config.num_slots, context)
        runs = 0
        for rows in batches:
            for length in lengths:
                prompts = [[self.tokenizer.pad_id] * length] * rows
                sampling = SamplingParams(max_new_tokens=context - length, seed=0)
                state, *_ = sampler.prefill(
                    state, prompts, list(range(rows)), sampling, behaviour=True
                )
                runs += 1
        # The masked kernels (constrained decoding) compile at the first constrained request.
        state, *_ = sampler.decode(state, self.config.decode_steps, behaviour=True)
        del state
        return runs + 1

    def stop(self) -> None:
        """Finish every request as cancelled and stop the engine thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():  # a long dispatch: `start` waits for it to end
                logger.warning("engine thread still finishing a dispatch 60 s after stop")
                return
            self._thread = None

    @property
    def policy_version(self) -> int:
        return self.sampler.policy_version

    # ------------------------------------------------------------------ caller side

    def validate(self, request: GenerationRequest) -> None:
        """400 on requests the model or cache cannot take."""
        validate_request(
            request,
            vocab_size=self.vocab_size,
            context_length=self.config.context_length,
            stop_ids=self._stop_ids(request),
            max_stop_tokens=self.sampler.max_stop_tokens,
        )

    def _capacity(self) -> tuple[int, str]:
        return staleness_capacity(
            running=len(self._pending) + sum(s is not None for s in self._slots),
            max_concurrent=self.config.num_slots + self.config.max_queue,
            accepted=self.accepted,
            versions_since_start=self.sampler.policy_version - self._base_version,
            max_staleness=self.config.max_staleness,
            batch_size=self.config.staleness_batch_size,
        )

    def _compile(self, grammar: str):
        if self._grammars is None:
            backend = getattr(self.tokenizer, "backend", None)
            if backend is None:
                raise ApiError(
                    400,
                    "constrained decoding needs a Hugging Face `tokenizers` tokenizer",
                    param="response_format",
                )
            self._grammars = GrammarCompiler(
                backend.to_str(), self.vocab_size, tuple(self.tokenizer.stop_ids)
            )
        return self._grammars.compile(grammar)

    def submit(self, request: GenerationRequest) -> GenerationHandle:
        """Queue a request (call from an event loop). 400 if invalid (a grammar that does not
        compile included), 429 over capacity. max_tokens above `max_completion_tokens` is
        clamped to it."""
        cap = self.config.max_completion_tokens
        if cap is not None and request.max_tokens > cap:
            request = dataclasses.replace(request, max_tokens=cap)
        self.validate(request)
        handle = GenerationHandle(request, asyncio.get_running_loop())
        if request.grammar is not None:
            handle.constraint = self._compile(request.grammar)
            for token in request.continues:  # the reply so far, from a worker that died
                handle.constraint.consume(token)
        with self._cv:
            if self._stopping:
                raise ApiError(503, "the worker is shutting down", code="shutting_down")
            capacity, limit = self._capacity()
            if capacity <= 0:
                self.metrics.rejected.labels(limit).inc()
                if limit == "staleness":
                    message = (
                        "staleness capacity exhausted: the learner has not caught up with the "
                        "samples generated so far; retry after the next weight update"
                    )
                else:
                    message = "the worker is at capacity (all slots busy and the queue is full)"
                raise ApiError(
                    429, message, code=f"{limit}_capacity_exhausted", headers={"Retry-After": "1"}
                )
            self._pending.append(handle)
            self.metrics.queued.set(len(self._pending))
            self._cv.notify_all()
        return handle

    def pause(self) -> None:
        """Stop dispatching: running requests hold their slots, new ones queue."""
        with self._cv:
            self._paused = True
            self.metrics.paused.set(1)

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self.metrics.paused.set(0)
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def update_weights(self, params: Any, version: int) -> concurrent.futures.Future:
        """Swap in `params` stamped `version` between two decode dispatches; no request is
        dropped. The future resolves to the version once tokens are sampled with it (or to
        the shape error). A newer update queued before an older one is applied replaces it."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if self._update is not None:
                self._update.future.set_exception(
                    RuntimeError(f"superseded by the update to version {version}")
                )
            self._update = _WeightUpdate(params, int(version), future)
            self._cv.notify_all()
        return future

    def status(self) -> dict[str, Any]:
        with self._cv:
            capacity, limit = self._capacity()
            busy = sum(s is not None for s in self._slots)
            return {
                "policy_version": self.sampler.policy_version,
                "paused": self._paused,
                "running": busy,
                "queued": len(self._pending),
                "slots": self.config.num_slots,
                "accepted": self.accepted,
                "capacity": capacity,
                "capacity_limit": limit,
                "context_length": self.config.context_length,
                "cache_length": self.cache_length,
                "prefill_tokens": self.prefill_tokens,
                "prefix_cached_tokens": self.cached_tokens,
            }

    # ------------------------------------------------------------------ engine thread

    def _stop_ids(self, request: GenerationRequest) -> tuple[int, ...]:
        if request.stop_token_ids is None:
            return tuple(self.tokenizer.stop_ids)
        return tuple(request.stop_token_ids)

    def _sampling(self, request: GenerationRequest, max_new: int, seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            max_new_tokens=max_new,
            stop_token_ids=self._stop_ids(request),
            seed=seed,
        )

    def _fresh_state(self) -> DecodeState:
        """An empty KV cache; what `slot_contents` said the old one held is forgotten with
        it (a restarted engine or a failed dispatch must not reuse prefixes it no longer has)."""
        self.slot_contents.clear()
        return self.sampler.init_state(self.config.num_slots, self.cache_length)

    def _run(self) -> None:
        state = self._fresh_state()
        while True:
            with self._cv:
                while not self._stopping and not self._has_work():
                    self._cv.wait(timeout=0.1)
                if self._stopping:
                    break
                update, self._update = self._update, None
                admitted = [] if self._paused else self._take_pending()
                paused = self._paused
            try:
                if update is not None:
                    state = self._apply_update(state, update)
                state = self._reap(state)
                if admitted:
                    state = self._admit(state, admitted)
                if self._chunking and not paused:
                    state = self._advance_chunks(state)
                if admitted or self._chunking:
                    # The first tokens go out now, not after the next decode dispatch (time
                    # to first token is the prefill's, however long the batch's decode is).
                    self._score_top_logprobs(state)
                    self._deliver()
                if not paused and any(s is not None and s.live for s in self._slots):
                    state = self._decode(state)
                self._score_top_logprobs(state)
                self._deliver()
            except Exception as error:  # a device failure must not take the server down
                logger.exception("generation engine iteration failed")
                self._fail_all(f"{type(error).__name__}: {error}")
                self._chunking.clear()
                state = self._fresh_state()
        self._fail_all("the worker is shutting down", reason="cancelled")

    def _has_work(self) -> bool:
        now = time.monotonic()
        if self._update is not None:
            return True
        for handle in self._pending:
            if handle.cancelled or (handle.deadline is not None and now > handle.deadline):
                return True
        for slot in self._slots:
            if slot is not None and (slot.handle.cancelled or _expired(slot.handle, now)):
                return True
        if self._paused:
            return False
        free = any(s is None for s in self._slots)
        return (free and bool(self._pending)) or any(s is not None and s.live for s in self._slots)

    def _take_pending(self) -> list[tuple[int, GenerationHandle, int]]:
        """(slot, handle, prompt tokens that slot already holds) for the requests to admit."""
        free = [i for i, s in enumerate(self._slots) if s is None]
        taken = []
        generation = self.sampler.weights_generation
        while self._pending and free and len(taken) < self.config.max_prefill_batch:
            handle = self._pending.popleft()
            if handle.cancelled:
                self._push(handle, self._finished_unstarted(handle, "cancelled"))
                continue
            prompt = np.asarray(handle.request.input_ids, np.int32)
            index, cached = self.slot_contents.choose(prompt, free, generation)
            free.remove(index)
            taken.append((index, handle, cached))
        self.metrics.queued.set(len(self._pending))
        return taken

    def _reap(self, state: DecodeState) -> DecodeState:
        """Finish cancelled and timed-out requests (queued or running) and free their slots."""
        now = time.monotonic()
        with self._cv:
            kept = collections.deque()
            for handle in self._pending:
                if handle.cancelled:
                    self._push(handle, self._finished_unstarted(handle, "cancelled"))
                elif _expired(handle, now):
                    self._push(handle, self._finished_unstarted(handle, "timeout"))
                else:
                    kept.append(handle)
            self._pending = kept
        stopped = []
        for index, slot in enumerate(self._slots):
            if slot is None or slot.finish is not None:
                continue
            if slot.handle.cancelled:
                reason = "cancelled"
            elif _expired(slot.handle, now):
                reason = "timeout"
            else:
                continue
            if slot.end(reason):
                stopped.append(index)
        return self._deactivate_slots(state, stopped)

    def _deactivate_slots(self, state: DecodeState, indices: list[int]) -> DecodeState:
        if not indices:
            return state
        keep = np.ones((self.config.num_slots,), bool)
        keep[indices] = False
        if self.sampler.mesh is None:
            return self._deactivate(state, keep)
        with jax.set_mesh(self.sampler.mesh):
            return self._deactivate(state, keep)

    def _admit(
        self, state: DecodeState, admitted: list[tuple[int, GenerationHandle, int]]
    ) -> DecodeState:
        now = time.monotonic()
        for index, handle, _ in admitted:
            stop_ids = frozenset(self._stop_ids(handle.request))
            request = handle.request
            tracker = TextTracker(
                self.tokenizer,
                request.stop,
                stop_ids,
                prefix=request.continues,
                sent=request.continued_chars,
            )
            slot = Slot(handle, stop_ids, tracker, admitted_at=now)
            if request.think_budget is not None and self._think_ids is not None:
                slot.start_budget(self._think_ids)
            self._slots[index] = slot
            self.metrics.queue_seconds.observe(now - handle.submitted_at)
        rows = [
            (
                index,
                list(handle.request.input_ids),
                handle.request.max_tokens,
                handle.request.seed,
                cached,
            )
            for index, handle, cached in admitted
        ]
        self.metrics.prompt_tokens.inc(sum(len(r[1]) for r in rows))
        return self._prefill(state, rows)

    def _ensure_cache_length(self, state: DecodeState, needed: int) -> DecodeState:
        """Grow every slot's cache (keeping its contents) to hold `needed` positions."""
        if needed <= self.cache_length:
            return state
        length = min(bucket(needed, 1), self.config.context_length)
        empty = self.sampler.init_state(self.config.num_slots, length)
        if self.sampler.mesh is None:
            state = self._grow(state, empty)
        else:
            with jax.set_mesh(self.sampler.mesh):
                state = self._grow(state, empty)
                # The sampler's kernels take the state in their own layout.
                layout = self.sampler._state_shardings(self.config.num_slots, length)
                state = jax.device_put(state, layout)
        logger.info("KV cache grown from %d to %d positions per slot", self.cache_length, length)
        self.cache_length = length
        return state

    def _prefill_chunk(self, state: DecodeState, index: int, prompt: list[int], start: int):
        """Encode prompt[start:] into slot `index` (positions start..); the sample is dropped
        (max_new_tokens 1 leaves the slot inactive, so no decode step touches it)."""
        generation = self.sampler.weights_generation
        state, *_ = self.sampler.prefill(
            state,
            [prompt],
            [index],
            SamplingParams(max_new_tokens=1),
            cached=[start],
        )
        generation = _unless_swapped(generation, self.sampler.weights_generation)
        self.slot_contents.chunk_prefilled(index, prompt, generation)
        return state

    def _prefill(
        self, state: DecodeState, rows: list[tuple[int, list[int], int, int, int]]
    ) -> DecodeState:
        """rows: (slot, prompt ids, max new tokens, seed, leading prompt tokens the slot's
        cache already holds); samples each slot's next token. A prompt whose uncached part is
        longer than `prefill_chunk` is encoded one chunk per engine iteration instead
        (`_advance_chunks`), so the other slots keep decoding meanwhile."""
        state = self._ensure_cache_length(state, max(len(r[1]) + r[2] for r in rows))
        loads = []
        for index, prompt, max_new, seed, cached in rows:
            self.cached_tokens += cached
            self.metrics.prefix_cached_tokens.inc(cached)
            self.prefill_tokens += len(prompt) - cached
            self.metrics.prefill_tokens.inc(len(prompt) - cached)
            if len(prompt) - cached > self.config.prefill_chunk:
                self._chunking[index] = _Chunking(prompt, cached, max_new, seed)
            else:
                loads.append((index, prompt, max_new, seed, cached))
        return self._prefill_rows(state, loads) if loads else state

    def _advance_chunks(self, state: DecodeState) -> DecodeState:
        """Encode the next chunk of every long prompt; one whose rest fits a chunk is
        prefilled (its first token sampled). Chunks end at multiples of `prefill_chunk`,
        whatever the cached prefix: the shapes (chunk bucket, attention window) are then the
        same for every prompt, and compile once."""
        chunk = self.config.prefill_chunk
        for index, job in list(self._chunking.items()):
            slot = self._slots[index]
            if slot is None or slot.finish is not None:  # cancelled or timed out meanwhile
                del self._chunking[index]
                continue
            end = (job.done // chunk + 1) * chunk
            state = self._prefill_chunk(state, index, job.prompt[:end], job.done)
            job.done = end
            if len(job.prompt) - job.done <= chunk:
                del self._chunking[index]
                row = (index, job.prompt, job.max_new, job.seed, job.done)
                state = self._prefill_rows(state, [row])
        return state

    def _prefill_rows(
        self, state: DecodeState, loads: list[tuple[int, list[int], int, int, int]]
    ) -> DecodeState:
        """One batched prefill of `_prefill`'s rows (each leaving at most a chunk to encode)."""
        version = self.sampler.policy_version
        sampling = [self._sampling(self._slots[r[0]].request, r[2], r[3]) for r in loads]
        mask = self._token_mask([self._slots[r[0]] for r in loads])
        generation = self.sampler.weights_generation
        state, first, logp, _, sampled = self.sampler.prefill(
            state,
            [r[1] for r in loads],
            [r[0] for r in loads],
            sampling,
            cached=[r[4] for r in loads],
            token_mask=mask,
            behaviour=True,
        )
        generation = _unless_swapped(generation, self.sampler.weights_generation)
        stopped = []
        for (index, prompt, *_), token, lp, sp in zip(loads, first, logp, sampled, strict=True):
            self.slot_contents.prefilled(index, prompt, int(token), generation)
            if self._extend(self._slots[index], [int(token)], [float(lp)], version, [float(sp)]):
                stopped.append(index)
        return self._deactivate_slots(state, stopped)

    def _token_mask(self, slots: list[Slot | None]) -> np.ndarray | None:
        """[len(slots), ceil(V / 32)] bitmask: each constrained slot's next allowed ids, every
        id for the others; None when no slot is constrained (the unmasked kernel runs)."""
        words = (self.vocab_size + 31) // 32
        rows = [s.next_mask(words) if s is not None and s.live else None for s in slots]
        if all(row is None for row in rows):
            return None
        mask = np.full((len(slots), words), -1, np.int32)
        for index, row in enumerate(rows):
            if row is not None:
                mask[index] = row
        return mask

    def _decode(self, state: DecodeState) -> DecodeState:
        version = self.sampler.policy_version
        start = time.perf_counter()
        # A grammar's mask holds for one token: while a constrained reply runs, the batch
        # decodes one token per dispatch (the host computes the next masks in between).
        steps = self.config.decode_steps
        if any(s is not None and s.needs_single_steps(steps) for s in self._slots):
            steps = 1
        mask = self._token_mask(self._slots) if steps == 1 else None
        state, tokens, logp, emitted, sampled = self.sampler.decode(
            state, steps, token_mask=mask, behaviour=True
        )
        self.metrics.decode_seconds.observe(time.perf_counter() - start)
        counts = emitted.sum(axis=1)
        for index in np.flatnonzero(counts):
            self.slot_contents.decoded(int(index), tokens[index, : counts[index]].tolist())
        stopped = []
        for index, slot in enumerate(self._slots):
            if slot is None or not slot.live or counts[index] == 0:
                continue
            n = int(counts[index])
            if self._extend(
                slot,
                tokens[index, :n].tolist(),
                logp[index, :n].tolist(),
                version,
                sampled[index, :n].tolist(),
            ):
                stopped.append(index)
        return self._deactivate_slots(state, stopped)

    def _extend(
        self,
        slot: Slot,
        tokens: list[int],
        logprobs: list[float],
        version: int,
        sampled: list[float],
    ) -> bool:
        self.metrics.generated_tokens.inc(len(tokens))
        return slot.extend(tokens, logprobs, version, sampled)

    def _score_top_logprobs(self, state: DecodeState) -> None:
        rows, targets = [], []
        for index, slot in enumerate(self._slots):
            row = None if slot is None else slot.score_row()
            if row is not None:
                rows.append((index, *row))
                targets.append(slot)
        if rows:
            for slot, (ids, values) in zip(targets, self._scorer(state, rows), strict=True):
                slot.add_top(ids, values)

    def _apply_update(self, state: DecodeState, update: _WeightUpdate) -> DecodeState:
        try:
            self.sampler.update_weights(update.params, update.version)
        except Exception as error:
            update.future.set_exception(error)
            return state
        self.metrics.policy_version.set(update.version)
        self.metrics.weight_updates.inc()
        for job in self._chunking.values():  # its chunks so far were the old weights'
            job.done = 0
        live = [i for i, s in enumerate(self._slots) if s is not None and s.live]
        if live and self.config.reprefill_on_update:
            # Recompute the running replies' KV under the new weights, so every later token's
            # log-prob is exactly the new policy's. Fresh seeds: the same seed would replay the
            # random draws of the reply's first token.
            batch = self.config.max_prefill_batch
            for begin in range(0, len(live), batch):
                rows = []
                for index in live[begin : begin + batch]:
                    slot = self._slots[index]
                    request = slot.request
                    seed = (request.seed * 1_000_003 + len(slot.output) + update.version) % 2**32
                    context = list(request.input_ids) + slot.output
                    remaining = request.max_tokens - len(slot.output)
                    rows.append((index, context, remaining, seed, 0))
                state = self._prefill(state, rows)
        update.future.set_result(update.version)
        return state

    # ------------------------------------------------------------------ delivery

    def _deliver(self) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = collections.defaultdict(list)
        for index, slot in enumerate(self._slots):
            if slot is None:
                continue
            events, done = slot.next_events()
            if done:
                self._slots[index] = None
                if slot.finish in ("stop", "length"):
                    with self._cv:
                        self.accepted += 1
                self.metrics.finished.labels(slot.finish).inc()
                self.metrics.request_seconds.observe(slot.age_s())
            if events:
                by_loop[slot.handle.loop].extend((slot.handle, e) for e in events)
        for loop, items in by_loop.items():
            _push_many(loop, items)
        with self._cv:
            self.metrics.running.set(sum(s is not None for s in self._slots))

    def _finished_unstarted(self, handle: GenerationHandle, reason: str) -> Finished:
        self.metrics.finished.labels(reason).inc()
        return Finished(reason, len(handle.request.input_ids), 0, "")

    def _push(self, handle: GenerationHandle, event) -> None:
        _push_many(handle.loop, [(handle, event)])

    def _fail_all(self, message: str, reason: str = "error") -> None:
        self._chunking.clear()
        with self._cv:
            pending, self._pending = list(self._pending), collections.deque()
        for handle in pending:
            self._push(
                handle, Finished(reason, len(handle.request.input_ids), 0, "", error=message)
            )
        for index, slot in enumerate(self._slots):
            if slot is not None:
                event = Finished(
                    reason, len(slot.request.input_ids), len(slot.output), "", error=message
                )
                self._push(slot.handle, event)
                self._slots[index] = None


def _expired(handle: GenerationHandle, now: float) -> bool:
    return handle.deadline is not None and now > handle.deadline


def _push_many(loop: asyncio.AbstractEventLoop, items: list) -> None:
    def push_all() -> None:
        for handle, event in items:
            handle.push(event)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
        loop.call_soon_threadsafe(push_all)


def _unless_swapped(before: int, after: int) -> int:
    """The weights generation to tag KV written by a sampler call: the one it started under,
    or -1 (reusable by nobody) when the weights were swapped during the call -- by a direct
    `Sampler.update_weights` from another thread; `update_weights` here swaps between
    dispatches, on the engine thread."""
    return before if before == after else -1
