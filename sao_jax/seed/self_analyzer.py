"""The self-evolving analyzer: the current policy writes the skills (SEED stage 2).

All analysis prompts of a call go through the KV-cache sampler in one batched `generate`; the
sampler's weights are refreshed to the learner's after every update (`refresh`) or pulled from
a `WeightPublisher` before each call (`follow`), so skills always come from the latest policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from sao_jax.rollout import Sampler, SamplingParams
from sao_jax.rollout.weights import WeightPublisher, sync_sampler
from sao_jax.seed.analyzers import Analyzer
from sao_jax.seed.records import EpisodeRecord
from sao_jax.seed.templates import analysis_prompt_ids
from sao_jax.tokenizers import Tokenizer

EMPTY_SKILL = "nothing"  # stands in for an empty reply, so every episode gets a skill block


class SelfPolicyAnalyzer(Analyzer):
    """Samples one skill per episode from the policy behind `sampler`.

    Args:
      sampler: a `Sampler` of the policy (its own: the rollout workers' are busy playing).
      tokenizer: the policy's tokenizer.
      max_new_tokens: cap on a skill's tokens.
      temperature: sampling temperature (0: greedy).
      max_actions: actions of the episode the analysis prompt shows (the last ones).
      seed: sampling seed (each call advances it).
    """

    name = "self_policy"

    def __init__(
        self,
        sampler: Sampler,
        tokenizer: Tokenizer,
        *,
        max_new_tokens: int = 48,
        temperature: float = 1.0,
        max_actions: int = 12,
        seed: int = 0,
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.sampler, self.tokenizer = sampler, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.max_actions, self.seed = max_actions, seed
        self._publisher: WeightPublisher | None = None

    @property
    def version(self) -> str:
        return f"policy-v{self.sampler.policy_version}"

    def refresh(self, params, version: int) -> None:
        """Analyse with these weights (a model or its params) from now on."""
        self.sampler.update_weights(params, version)

    def follow(self, publisher: WeightPublisher) -> None:
        """Pull the publisher's latest weights before every `analyze`."""
        self._publisher = publisher

    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        if self._publisher is not None:
            sync_sampler(self.sampler, self._publisher)
        prompts = [
            analysis_prompt_ids(self.tokenizer, r, max_actions=self.max_actions) for r in records
        ]
        sampling = SamplingParams(
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            stop_token_ids=tuple(self.tokenizer.stop_ids),
            seed=self.seed,
        )
        self.seed += 1
        result = self.sampler.generate(prompts, sampling)
        texts = []
        for tokens, length in zip(result.tokens, result.lengths, strict=True):
            text = self.tokenizer.decode(tokens[: int(length)], skip_special_tokens=True).strip()
            texts.append(text or EMPTY_SKILL)
        return texts
