"""SEED stage 1 data: label finished episodes with an analyzer and store the skills as ATDP.

The stored skill records (`bank.skill_trajectory`: analysis prompt -> skill tokens) are
behaviour-cloning data: written to the same tenant as acting data (successful episodes, expert
relabels), one `BehaviourCloner` over that tenant fine-tunes the policy jointly on acting and
on analysing (NLL on skill tokens given the episode rendered by the analysis template).
"""

from __future__ import annotations

from collections.abc import Iterable

from atdp_io import AtdpStore, EventKind, Trajectory
from sao_jax.seed.analyzers import Analyzer, Skill
from sao_jax.seed.bank import SKILLS_TENANT, write_skills
from sao_jax.seed.records import EpisodeRecord, from_trajectory
from sao_jax.tokenizers import Tokenizer


def episode_records(trajectories: Iterable[Trajectory]) -> tuple[list[EpisodeRecord], int]:
    """Records of the trajectories that hold at least one LLM call; and how many were skipped."""
    records, skipped = [], 0
    for trajectory in trajectories:
        if not any(e.kind == EventKind.LLM_CALL for e in trajectory.events):
            skipped += 1
            continue
        records.append(from_trajectory(trajectory))
    return records, skipped


def label_and_store(
    store: AtdpStore,
    trajectories: Iterable[Trajectory],
    analyzer: Analyzer,
    tokenizer: Tokenizer,
    *,
    tenant: str = SKILLS_TENANT,
    max_actions: int = 12,
    batch_size: int = 64,
) -> tuple[dict[str, float], list[Skill]]:
    """Analyse every episode (in batches of `batch_size`) and append its skill to `tenant`.

    Returns counters (`episodes`, `skills`, `skipped` (no LLM call), `success_skills`) and the
    skills, one per analysed episode (`Skill.trajectory_id` names it).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    records, skipped = episode_records(trajectories)
    written = successes = 0
    skills: list[Skill] = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        labels = analyzer.analyze(chunk)
        written += len(write_skills(store, chunk, labels, tokenizer, tenant=tenant,
                                    max_actions=max_actions))  # fmt: skip
        successes += sum(s.success for s in labels)
        skills.extend(labels)
    counters = {
        "episodes": float(len(records) + skipped),
        "skills": float(written),
        "skipped": float(skipped),
        "success_skills": float(successes),
    }
    return counters, skills
