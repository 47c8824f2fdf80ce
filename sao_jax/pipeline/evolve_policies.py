"""The policies of an evolution run: what each `PolicyRef` means, and how new ones are made.

`PolicyBook` maps a composite's `PolicyRef.version` to weights (the empty ref is the served
clone). It is the control plane's view of the policy surface:

- `serve(worker, ref)` swaps the worker to a tenant's policy before that tenant's window (one
  worker serves one policy at a time, so the experiment plays the tenants in turn; the worker
  stamps every token with the integer id of the weights that sampled it);
- `reply(messages, ref, choices)` is the gate's replay agent: greedy decoding of the
  composite's messages under that policy, directly on the model (not through the gateway, which
  would apply the tenant's composite a second time); with the harness's reply choices, under the
  same grammar mask the worker would apply to that choice list;
- `model_for(ref)` feeds the gate's re-scoring (`serving.control.rescoring.model_scorer`);
- `window_trainer(...)` is the `train_fn` of policy candidates: SAO iterations of the online
  learner on the window's recorded rows (`reward_sign=-1`: the planted update on corrupted,
  sign-flipped rewards).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from atdp_io import Trajectory
from atdp_io.mask_replay import MaskReplay
from atdp_io.rows import SAMPLING_KEYS, pack_batch, training_view, trajectory_rows
from sao_jax.models import Transformer
from sao_jax.rollout import Sampler
from sao_jax.rollout.sampler import bucket
from sao_jax.rollout.sampling import SamplingParams
from sao_jax.train import Learner, LearnerConfig
from serving.control.composite import PolicyRef
from serving.control.proposers import TrainFn
from serving.control.store import ControlError
from serving.proxy.grammars import choice_grammar
from serving.worker.constraints import GrammarCompiler


def copied(model: Transformer) -> Transformer:
    """A copy of `model` whose arrays no later update can donate away."""
    graphdef, state = nnx.split(model)
    return nnx.merge(graphdef, jax.tree.map(jnp.copy, state))


class PolicyBook:
    """PolicyRef version label -> weights, and the integer id the worker stamps them with."""

    def __init__(self, base: Transformer, tokenizer, *, max_new_tokens: int):
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.models: dict[str, Transformer] = {"": base}
        self.ids: dict[str, int] = {"": 0}
        self.sources: dict[str, frozenset[str]] = {"": frozenset()}  # tenants it learned from
        self.sampler = Sampler(base, pad_id=tokenizer.pad_id)
        self._sampler_holds = ""
        self._grammars: GrammarCompiler | None = None  # compiled on the first choice list
        self._mask_replay: MaskReplay | None = None  # built on the first masked window

    def add(self, label: str, model: Transformer, sources: Sequence[str] = ()) -> PolicyRef:
        """Register new weights under `label`, learned from the tenants `sources`; the
        `PolicyRef` that names them."""
        if label in self.models:
            raise ControlError(f"policy {label!r} is already registered")
        self.models[label] = model
        self.sources[label] = frozenset(sources)
        self.ids[label] = len(self.ids)
        return PolicyRef(label, f"memory:{label}")

    @property
    def vocab_size(self) -> int:
        """The policies' logits width (masks are this wide)."""
        return self.sampler.config.vocab_size

    @property
    def mask_replay(self) -> MaskReplay:
        """Rebuilds the grammar masks of calls served under a choice list (one per book: it
        keeps llguidance's view of the tokenizer, which is slow to build)."""
        if self._mask_replay is None:
            self._mask_replay = MaskReplay.from_tokenizer(self.tokenizer, self.vocab_size)
        return self._mask_replay

    def model_for(self, ref: PolicyRef) -> Transformer:
        try:
            return self.models[ref.version]
        except KeyError:
            raise ControlError(f"unknown policy {ref.version!r}: not made in this run") from None

    def serve(self, worker, ref: PolicyRef) -> int:
        """Swap the worker's weights to `ref`'s (nothing when it serves them already); the id
        its tokens are stamped with."""
        model, version = self.model_for(ref), self.ids[ref.version]
        if worker.sampler.policy_version != version:
            worker.engine.update_weights(nnx.state(model), version).result()
        return version

    def reply(
        self,
        messages: Sequence[Mapping[str, Any]],
        ref: PolicyRef,
        choices: Sequence[str] | None = None,
    ) -> str:
        """Greedy reply of `ref`'s policy to `messages` (the replay agent), kept to `choices`
        (the grammar the data proxy writes for a choice list) when given."""
        if ref.version != self._sampler_holds:
            self.sampler.update_weights(nnx.state(self.model_for(ref)), self.ids[ref.version])
            self._sampler_holds = ref.version
        prompt = self.tokenizer.encode_chat(messages)
        sampling = SamplingParams(
            temperature=0.0,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(self.tokenizer.stop_ids),
        )
        if choices:
            ids = self._masked_greedy(prompt, sampling, choice_grammar(choices, self.tokenizer))
        else:
            result = self.sampler.generate([prompt], sampling)
            ids = result.tokens[0][: int(result.lengths[0])].tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _masked_greedy(
        self, prompt: list[int], sampling: SamplingParams, grammar: str
    ) -> list[int]:
        """Greedy tokens under `grammar`'s mask, one token per dispatch as the worker decodes a
        constrained slot (the mask after each token from the same llguidance matcher)."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(
                self.tokenizer.backend.to_str(),
                self.vocab_size,
                tuple(self.tokenizer.stop_ids),
            )
        constraint = self._grammars.compile(grammar)
        length = bucket(len(prompt), self.sampler.min_prompt_bucket) + bucket(
            sampling.max_new_tokens, self.sampler.min_new_tokens_bucket
        )
        state = self.sampler.init_state(1, length)
        state, first, _, finished = self.sampler.prefill(
            state, [prompt], [0], [sampling], token_mask=constraint.bitmask()[None]
        )
        tokens, done = [int(first[0])], bool(finished[0])
        while not done and len(tokens) < sampling.max_new_tokens:
            constraint.consume(tokens[-1])
            state, step, _, emitted = self.sampler.decode(
                state, 1, token_mask=constraint.bitmask()[None]
            )
            if not emitted[0, 0]:
                break
            tokens.append(int(step[0, 0]))
            done = tokens[-1] in sampling.stop_token_ids
        return tokens


@dataclasses.dataclass
class WindowTrainer:
    """`train_fn` of policy candidates: `steps` learner iterations on the window's rows
    (`rows` x `seq_len`, longer rows and episodes past the batch left out), starting from the
    current policy with fresh optimiser and critic; `reward_sign` -1 flips every reward (the
    planted corruption). Each call registers the result in `book` as `<name>-<n>`.

    With `fit_baseline` (algorithms with a critic) the fresh critic's value head is first
    fitted to the window's own returns (`Learner.fit_value_head`, as the RL phase fits it on
    its warm-up rollouts): a zero value head would weight every action by its return instead of
    its advantage, so a window of refused-command loops (-1 a step) pushes down every token of
    those games at once. Off by default all the same: on the ALFWorld evolution windows at
    the default rate (1e-3, 8 steps) fitted candidates replayed worse than unfitted ones.
    `metrics` keeps the fit's and the last iteration's figures."""

    book: PolicyBook
    learner: LearnerConfig
    rows: int
    seq_len: int
    steps: int
    name: str = "sao_window"
    reward_sign: float = 1.0
    fit_baseline: bool = False
    trained: int = 0
    metrics: dict = dataclasses.field(default_factory=dict)

    @property
    def __name__(self) -> str:  # the candidate's provenance names its train_fn
        return self.name

    def batch(self, trajectories: Sequence[Trajectory]) -> dict:
        groups, used = [], 0
        # calls sampled under a grammar mask (a harness's reply choices) train with the masked
        # ratio: their masks are rebuilt from the recorded grammar first
        replay = self.book.mask_replay
        for trajectory in trajectories:
            rows, _ = trajectory_rows(replay.view(training_view(trajectory)), "windowed")
            rows = [r for r in rows if r.length <= self.seq_len]
            if rows and used + len(rows) <= self.rows:
                groups.append(rows)
                used += len(rows)
        if not groups:
            raise ControlError("no row of the window fits a policy batch")
        batch = pack_batch(groups, self.rows, self.seq_len, self.book.tokenizer.pad_id)
        batch["rewards"] = batch["rewards"] * self.reward_sign
        # A greedy window's actions have log-prob 0 under the greedy transform the batch
        # records, so they would train nothing; they train as samples of the plain policy
        # (under their grammar mask, if they had one: the mask keys stay).
        for key, identity in zip(SAMPLING_KEYS, (1.0, 0, 1.0), strict=True):
            if key in batch:
                batch[key] = np.full_like(batch[key], identity)
        return batch

    def __call__(self, trajectories: Sequence[Trajectory], policy: PolicyRef) -> PolicyRef:
        batch = self.batch(trajectories)
        learner = Learner(self.learner, copied(self.book.model_for(policy)))
        metrics = {}
        if self.fit_baseline and learner.algorithm.uses_critic:
            metrics.update(learner.fit_value_head([batch]))
        for _ in range(self.learner.critic.warmup_steps + self.steps):  # critic-only first
            metrics.update(learner.iteration(batch))
        self.metrics = metrics
        self.trained += 1
        sources = {t.header.governance.tenant for t in trajectories}
        label = f"{self.name}-{self.trained}"
        return self.book.add(label, learner.policy_module(copy=True), sorted(sources))


def window_trainer(
    book: PolicyBook,
    learner: LearnerConfig,
    *,
    rows: int,
    seq_len: int,
    steps: int,
    learning_rate: float,
    name: str = "sao_window",
    reward_sign: float = 1.0,
    fit_baseline: bool = False,
    critic_warmup_steps: int = 0,
) -> TrainFn:
    """A `WindowTrainer` with the given learning rate, its value head fitted to the window's
    returns (`fit_baseline`) and `critic_warmup_steps` critic-only iterations before the
    `steps` policy iterations."""
    config = dataclasses.replace(
        learner,
        policy_optimizer=dataclasses.replace(learner.policy_optimizer, learning_rate=learning_rate),
        critic=dataclasses.replace(learner.critic, warmup_steps=critic_warmup_steps),
    )
    return WindowTrainer(book, config, rows, seq_len, steps, name, reward_sign, fit_baseline)
