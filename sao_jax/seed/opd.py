"""SEED stage 2 in the learner: skills from the current policy, re-scoring, the OPD term.

`SeedLearner` is a `Learner` whose iterations first (1) decode each trajectory of the batch,
(2) let the analyzer (normally the current policy, refreshed to the learner's latest weights)
write one skill per trajectory, (3) re-score the same action tokens with that skill's block in
context (`skill_logp`, one jitted forward; with `OpdConfig.mode` "kl" the same forward also keeps
the teacher's top k tokens at each action token, `skill_top_ids` / `skill_top_logp`) and then
(4) run the algorithm's update with `LearnerConfig.opd.weight` times the distillation term added
(`sao_seed` / `grpo_seed`; `sao_jax.train.objectives.opd_loss`).
Inference never sees a skill. Cost metrics: `seed/analysis_seconds`, `seed/rescore_seconds`.
Each row also carries its skill's kinds (`skill_kinds` [R], `sao_jax.seed.kinds`), so the step
reports the teacher-student gap per kind (`policy/opd_gap_<kind>`); `seed/skills_<kind>` is
the share of the iteration's skills that state each kind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import jax
import numpy as np

from sao_jax.losses.seed import SAMPLED_OPD_MODES, SKILL_KINDS
from sao_jax.models import Transformer
from sao_jax.seed.analyzers import Analyzer, Skill
from sao_jax.seed.config import hindsight_rules
from sao_jax.seed.kinds import kind_bits
from sao_jax.seed.records import EpisodeRecord, from_batch, with_task_specs
from sao_jax.seed.rescore import skill_logprobs, skill_top_logprobs
from sao_jax.seed.templates import skill_block_ids
from sao_jax.tokenizers import Tokenizer
from sao_jax.train import Learner, LearnerConfig


class SeedLearner(Learner):
    """A learner that adds SEED's self-distillation term (algorithms `sao_seed`, `grpo_seed`).

    Args:
      config: learner config; `config.algorithm` must be a SEED algorithm (`opd`).
      policy: the policy to train.
      analyzer: writes the skills; an analyzer with `refresh(params, version)` (the
        `SelfPolicyAnalyzer`) is refreshed to the learner's weights before every analysis.
      tokenizer: the policy's tokenizer (decodes batches, encodes skill blocks).
      max_skill_tokens: S, the fixed skill-block budget of re-scored rows.
      think: replies carry `<think>` blocks (how actions are parsed from replies).
      env: the env the batches were played in (its harness reads them back, `from_batch`).
      on_skills: called with each iteration's `(records, skills)` (e.g. to write the skill
        bank with `sao_jax.seed.write_skills`).
      store: the ATDP store the batches come from: each record then gets its game spec from
        the stored trajectory's header (what the rule-based analyzers read); None: records
        carry what the rows hold.
      local_copy: the policy on this process's sampling devices, for the analyzer's refresh
        (`Run.local_copy`; a collective with several processes, which all call `iteration`
        together); None: the learner's policy itself (one process).
      critic, mesh, rules: as for `Learner`.

    Several processes: each brings its own rows (its ATDP partition), decodes, analyses and
    re-scores them; the re-scoring forward is one global program whose output each process
    reads back for its own rows (`process_rows`).
    """

    def __init__(
        self,
        config: LearnerConfig,
        policy: Transformer,
        *,
        analyzer: Analyzer,
        tokenizer: Tokenizer,
        max_skill_tokens: int = 96,
        think: bool = False,
        env: str = "alfworld",
        on_skills: Callable[[list[EpisodeRecord], list[Skill]], None] | None = None,
        store=None,
        local_copy: Callable[[Transformer], Transformer] | None = None,
        **kwargs,
    ):
        super().__init__(config, policy, **kwargs)
        if not self.algorithm.opd:
            raise ValueError(
                f"SeedLearner: algorithm {self.algorithm.name!r} has no OPD term; use sao_seed or "
                "grpo_seed"
            )
        if max_skill_tokens < 4:
            raise ValueError(f"max_skill_tokens must be >= 4, got {max_skill_tokens}")
        self.analyzer, self.tokenizer = analyzer, tokenizer
        self.max_skill_tokens, self.think, self.on_skills = max_skill_tokens, think, on_skills
        self.env, self.store, self.local_copy = env, store, local_copy
        rules = hindsight_rules(env)
        # how untagged (self-written) skills are read: the env's rule sentence forms
        self.kind_patterns = getattr(analyzer, "kind_patterns", None) or (
            rules.kind_patterns if rules is not None else {}
        )
        self.last_skills: list[Skill] = []

    def local_logprobs(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """`policy_logprobs` of this process's rows (with several processes the forward is
        one global program over every process's rows; each reads back its own)."""
        if jax.process_count() == 1:
            return self.policy_logprobs(batch)
        device_batch = self._device_batch(batch)
        logp = self._functions(device_batch, None)["logprobs"](
            self.policy_params, self._policy_frozen, device_batch
        )
        return process_rows(logp)

    def local_top_logprobs(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`policy_top_logprobs` of this process's rows (one global program with several
        processes; each reads back its own rows)."""
        out = self.policy_top_logprobs(batch)
        return {k: process_rows(v) for k, v in out.items()}

    def iteration(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Skills -> skill_logp -> the algorithm's update with the OPD term (see module doc)."""
        if self.in_warmup:  # the policy does not move: no skills needed
            return super().iteration(batch)
        start = time.perf_counter()
        records = from_batch(batch, self.tokenizer, think=self.think, env=self.env)
        if self.store is not None:
            records = with_task_specs(records, self.store)
        refresh = getattr(self.analyzer, "refresh", None)
        if refresh is not None:
            policy = self.policy_module()
            refresh(self.local_copy(policy) if self.local_copy else policy, self.policy_version)
        slots = sorted(records)
        skills = self.analyzer.analyze([records[k] for k in slots])
        analysed = time.perf_counter()
        blocks = {
            k: skill_block_ids(self.tokenizer, s.text) for k, s in zip(slots, skills, strict=True)
        }
        if self.config.opd.mode in SAMPLED_OPD_MODES:
            skill_logp, stats = skill_logprobs(
                self.local_logprobs, batch, blocks, self.max_skill_tokens
            )
            teacher = {"skill_logp": skill_logp}
        else:  # the teacher's whole next-token distribution (its top k) too
            teacher, stats = skill_top_logprobs(
                self.local_top_logprobs, batch, blocks, self.max_skill_tokens
            )
        rescored = time.perf_counter()
        kinds = [s.kinds(self.kind_patterns) for s in skills]
        bits = {k: kind_bits(found) for k, found in zip(slots, kinds, strict=True)}
        traj = np.asarray(batch["traj_index"])
        row_kinds = np.asarray([bits.get(int(k), 0) for k in traj], np.int32)
        metrics = super().iteration({**batch, **teacher, "skill_kinds": row_kinds})
        self.last_skills = skills
        if self.on_skills is not None:
            self.on_skills([records[k] for k in slots], skills)
        metrics.update(
            {
                "seed/analysis_seconds": analysed - start,
                "seed/rescore_seconds": rescored - analysed,
                "seed/skills": float(len(skills)),
                "seed/block_tokens_mean": stats["block_tokens_mean"],
                "seed/truncated_blocks": stats["truncated"],
                **{
                    f"seed/skills_{kind}": sum(kind in found for found in kinds)
                    / max(len(kinds), 1)
                    for kind in SKILL_KINDS
                },
            }
        )
        return metrics


def process_rows(array: jax.Array) -> np.ndarray:
    """This process's rows of a global [R, ...] batch array, in order: the rows it brought
    (`Placement.put_batch` places each process's rows on its own devices)."""
    if array.is_fully_addressable:
        return np.asarray(jax.device_get(array))
    rows: dict[int, np.ndarray] = {}
    for shard in array.addressable_shards:
        start = shard.index[0].start or 0
        for i, row in enumerate(np.asarray(shard.data)):
            rows.setdefault(start + i, row)  # a row replicated on several devices: once
    return np.stack([rows[k] for k in sorted(rows)])
