"""The skill bank: hindsight skills stored as ATDP trajectories, loadable, usable as memory.

Each skill is one trajectory in its own tenant (default "skills") holding one LLM call: the
analysis prompt of the episode (`templates.analysis_prompt_ids`) -> the skill's tokens. That
record is both the provenance store (`header.task`: `skill_of` trajectory id, task, task type,
outcome, analyzer name + version, template version, the tagged sentences of a rule-based
skill) and stage-1 training data: NLL on the skill
tokens given the episode is exactly behaviour cloning of this call. Its output log-probs are
zeros, marked `decoding.extra["logprobs"] = "absent"` (never behaviour log-probs).

Serving-time memory: `memory_block(skills, task_type)` renders the "Episode-Level Skill" block
of a task type; `with_skill_memory(messages, ...)` puts it in front of a chat request (the hook
a gateway client or the proxy calls before forwarding).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Sequence

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    AtdpStore,
    DecodingParams,
    Event,
    EventKind,
    Governance,
    LLMCall,
    Outcome,
    ReplayClass,
    Trajectory,
    TrajectoryHeader,
)
from atdp_io import lineage as lineage_lib
from sao_jax.seed.analyzers import Skill
from sao_jax.seed.kinds import SkillPart
from sao_jax.seed.records import EpisodeRecord
from sao_jax.seed.templates import TEMPLATE_VERSION, analysis_prompt_ids, skill_block_text
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import IM_END

SKILLS_TENANT = "skills"
SOURCE = "seed_skill"


def skill_trajectory(
    record: EpisodeRecord,
    skill: Skill,
    tokenizer: Tokenizer,
    *,
    tenant: str = SKILLS_TENANT,
    max_actions: int = 12,
    created_at: float | None = None,
) -> Trajectory:
    """The ATDP record of `skill` written about `record` (analysis prompt -> skill tokens).

    A record read from the store (`record.source`) makes the skill derived data: it names the
    episode in `derived_from` and takes its governance (`atdp_io.lineage`: the skill expires
    with the episode and is purged with it), written to partition `tenant`. A record of no
    stored episode gets synthetic governance.
    """
    if not skill.text.strip():
        raise ValueError(f"empty skill for episode {record.trajectory_id!r}")
    im_end = tokenizer.token_to_id(IM_END)
    prompt = np.asarray(analysis_prompt_ids(tokenizer, record, max_actions=max_actions), np.int32)
    ids = tokenizer.encode(skill.text) + ([im_end] if im_end is not None else [])
    output = np.asarray(ids, np.int32)
    call = LLMCall(
        model_id=skill.analyzer,
        policy_version=0,
        input_ids=prompt,
        output_ids=output,
        output_logprobs=np.zeros(output.shape, np.float32),
        decoding=DecodingParams(
            temperature=0.0, extra={"logprobs": "absent", "policy": "analyzer"}
        ),
        prompt_template_fingerprint=TEMPLATE_VERSION,
        finish_reason="stop",
    )
    event = Event(
        kind=EventKind.LLM_CALL,
        replay=ReplayClass.APPROXIMATE,
        action=Action(ActionKind.MESSAGE, text=skill.text),
        llm=call,
    )
    governance, derived_from = Governance.synthetic(tenant, expires_at=None), ()
    if record.source is not None:
        if record.governance is None:
            raise lineage_lib.LineageError(
                f"skill of {record.source}: the record has no source governance; write it "
                "through write_skills, which looks it up"
            )
        governance = lineage_lib.derived_governance([record.governance], tenant=tenant)
        derived_from = (record.source,)
    header = TrajectoryHeader(
        # every number follows a letter: an all-digit run can read as a phone number to the
        # ATDP redactor
        trajectory_id=f"skill-x{uuid.uuid4().hex[:12]}",
        governance=governance,
        derived_from=derived_from,
        created_at=time.time() if created_at is None else created_at,
        task={
            "source": SOURCE,
            "skill_of": skill.trajectory_id,
            "task": skill.task,
            "task_type": skill.task_type,
            "success": skill.success,
            "analyzer": skill.analyzer,
            "analyzer_version": skill.analyzer_version,
            "template": TEMPLATE_VERSION,
            # a rule-based skill's tagged sentences (kind, text): what it states, per kind
            "parts": [[p.kind, p.text] for p in skill.parts],
        },
    )
    return Trajectory(header, (event,), Outcome(success=skill.success))


def write_skills(
    store: AtdpStore,
    records: Sequence[EpisodeRecord],
    skills: Sequence[Skill],
    tokenizer: Tokenizer,
    *,
    tenant: str = SKILLS_TENANT,
    max_actions: int = 12,
    skip_purged: bool = False,
) -> list[str]:
    """Append the skills (one per record) to `tenant`; returns their trajectory ids.

    Records whose source governance is unknown (decoded from a learner batch) get it from the
    store. A source no longer stored (purged since it was read) raises
    `atdp_io.lineage.LineageError`, or with `skip_purged` its skill is not written (what a
    training loop wants): no skill outlives the episode it was written from.
    """
    if len(records) != len(skills):
        raise ValueError(f"write_skills: {len(records)} records but {len(skills)} skills")
    unknown = [r.source for r in records if r.source is not None and r.governance is None]
    found = lineage_lib.source_governance(store, unknown, missing_ok=skip_purged)
    pairs = []
    for record, skill in zip(records, skills, strict=True):
        if record.source is not None and record.governance is None:
            if record.source not in found:
                continue  # purged meanwhile (skip_purged)
            record = dataclasses.replace(record, governance=found[record.source])
        pairs.append((record, skill))
    trajectories = [
        skill_trajectory(r, s, tokenizer, tenant=tenant, max_actions=max_actions) for r, s in pairs
    ]
    if not trajectories:
        return []
    with store.writer(tenant) as writer:
        return list(writer.append(trajectories))


@dataclasses.dataclass(frozen=True)
class StoredSkill:
    """A skill read back from the bank, with its own ATDP id and creation time."""

    skill: Skill
    bank_id: str
    created_at: float


def load_skills(
    store: AtdpStore,
    *,
    tenant: str = SKILLS_TENANT,
    task_type: str | None = None,
    limit: int | None = None,
) -> list[StoredSkill]:
    """Skills of `tenant`, newest first, optionally of one task type and at most `limit`."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    reader = store.reader(tenant, principal=tenant, purpose="training")
    reader.refresh()
    out = []
    for trajectory_id in reader.trajectory_ids():
        trajectory = reader.read(trajectory_id)
        task = trajectory.header.task
        if task.get("source") != SOURCE:
            continue
        if task_type is not None and task.get("task_type") != task_type:
            continue
        skill = Skill(
            text=trajectory.events[0].action.text,
            trajectory_id=str(task.get("skill_of", "")),
            success=bool(task.get("success")),
            task=str(task.get("task", "")),
            task_type=str(task.get("task_type", "")),
            analyzer=str(task.get("analyzer", "")),
            analyzer_version=str(task.get("analyzer_version", "")),
            parts=tuple(SkillPart(kind, text) for kind, text in task.get("parts") or ()),
        )
        out.append(StoredSkill(skill, trajectory_id, trajectory.header.created_at))
    out.sort(key=lambda s: s.created_at, reverse=True)
    return out[:limit] if limit is not None else out


def memory_block(
    skills: Iterable[StoredSkill | Skill], task_type: str, *, max_skills: int = 3
) -> str | None:
    """The "Episode-Level Skill" block for `task_type` from up to `max_skills` skills (those
    written about successes first, in the given order), or None when the bank has none."""
    chosen = [s.skill if isinstance(s, StoredSkill) else s for s in skills]
    chosen = [s for s in chosen if s.task_type == task_type]
    chosen.sort(key=lambda s: not s.success)
    if not chosen:
        return None
    return skill_block_text(" ".join(s.text for s in chosen[:max_skills]))


def with_skill_memory(
    messages: Sequence[dict], skills: Iterable[StoredSkill | Skill], task_type: str, **kwargs
) -> list[dict]:
    """Chat `messages` with the task type's skill block as a system message in front
    (unchanged when the bank has no skill of that type). The serving hook: call it on a
    request's messages before sending them to the gateway."""
    block = memory_block(skills, task_type, **kwargs)
    messages = [dict(m) for m in messages]
    if block is None:
        return messages
    return [{"role": "system", "content": block}, *messages]
