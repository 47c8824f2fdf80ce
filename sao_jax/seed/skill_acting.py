"""Stage-1 acting data with a skill in context: how the policy learns to read a skill.

Stage 2's teacher is the policy itself with an episode's skill block in front of each turn's
prompt (`rescore.skill_injected_batch`). A policy cloned without skills gains nothing from the
block (its teacher-student gap is noise), so stage 1 adds acting turns that carry a block: an
episode the policy played, relabelled by an expert that acts on what the skill states (for
ALFWorld's rule-based skills, the planner: the skill states where the objects are and the
planner's procedure), every turn's prompt prefixed with that episode's skill block exactly as
the learner injects it (the same chat turn, the same cut to `max_skill_tokens`). Mixed with the
plain acting turns, the policy learns to act the same without a skill and to use one when it
is there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from atdp_io import EventKind, Trajectory
from sao_jax.seed.rescore import fit_block

SOURCE = "skill_acting"  # header.task["source"] of the derived trajectories


def with_skill_in_context(
    trajectory: Trajectory,
    block_ids: Sequence[int],
    *,
    max_skill_tokens: int,
) -> Trajectory:
    """`trajectory` with the skill block in front of every LLM call's prompt.

    Args:
      trajectory: a windowed episode (each call's `input_ids` is that turn's whole prompt).
      block_ids: the skill block's token ids (`templates.skill_block_ids`).
      max_skill_tokens: the block budget the learner re-scores with (`rescore.fit_block`).
    Returns:
      the same episode as `<id>-skill` with `header.task["source"] == "skill_acting"`; its
      governance and `derived_from` are `trajectory`'s (an expert relabel's name the episode
      it relabels, so the result is purged with that stored episode).
    """
    if not len(block_ids):
        raise ValueError("with_skill_in_context: empty skill block")
    block, _ = fit_block(list(block_ids), max_skill_tokens)
    prefix = np.asarray(block, np.int32)
    events = []
    for event in trajectory.events:
        if event.kind == EventKind.LLM_CALL:
            prompt = np.concatenate([prefix, np.asarray(event.llm.input_ids, np.int32)])
            event = dataclasses.replace(event, llm=dataclasses.replace(event.llm, input_ids=prompt))
        events.append(event)
    header = dataclasses.replace(
        trajectory.header,
        trajectory_id=f"{trajectory.trajectory_id}-skill",
        task={**(trajectory.header.task or {}), "source": SOURCE},
    )
    return Trajectory(header, tuple(events), trajectory.outcome)
