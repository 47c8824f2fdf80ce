"""SEED skills are derived data: they name their episode, take its governance, die with it."""

import dataclasses

import pytest
from seed_factories import DEMOS, demo_store, demo_trajectories, first_batch, word_tokenizer

from atdp_io import ConsentStatus, GovernanceUpdate, SourceRef
from atdp_io.lineage import LineageError
from sao_jax.seed import (
    RuleBasedAlfworldAnalyzer,
    from_batch,
    from_trajectory,
    label_and_store,
    load_skills,
    write_skills,
)

NOW = 2_000_000_000.0


@pytest.fixture
def store(tmp_path):
    store = demo_store(tmp_path, num_episodes=3)
    first = demo_trajectories(store, purpose="inspect")[0].trajectory_id
    with store.writer(DEMOS) as writer:  # a shorter retention and a withdrawal on one episode
        writer.annotate(
            GovernanceUpdate(first, NOW - 10, "retention", expires_at=NOW),
            GovernanceUpdate(first, NOW - 9, "user withdrew", consent=ConsentStatus.WITHDRAWN),
        )
    return store


def skill_headers(store, tenant):
    # every stored skill, withdrawn ones too (a training reader would leave those out)
    reader = store.reader(tenant, principal=tenant, purpose="inspect")
    reader.refresh()
    return {i: reader.entry(i).header for i in reader.trajectory_ids()}


def test_stage_one_skills_carry_their_episode_and_its_governance(store):
    episodes = demo_trajectories(store, purpose="inspect")  # the withdrawn one included
    label_and_store(store, episodes, RuleBasedAlfworldAnalyzer(), word_tokenizer(), tenant="sft")
    headers = skill_headers(store, "sft")
    assert len(headers) == len(episodes)
    by_source = {h.derived_from: h for h in headers.values()}
    first = episodes[0].trajectory_id
    header = by_source[(SourceRef(DEMOS, first),)]
    assert header.governance.tenant == "sft"
    assert header.governance.expires_at == NOW  # the episode's updated retention
    assert header.governance.consent == ConsentStatus.WITHDRAWN
    assert {h.derived_from for h in headers.values()} == {
        (SourceRef(DEMOS, e.trajectory_id),) for e in episodes
    }
    # the episode's retention ends: its skill goes with it, the others stay
    assert store.purge_expired(DEMOS, principal=DEMOS, now=NOW) == [first]
    left = skill_headers(store, "sft")
    assert len(left) == len(episodes) - 1
    assert all(h.derived_from != (SourceRef(DEMOS, first),) for h in left.values())


def test_stage_two_skills_from_a_batch_look_their_sources_up(store):
    batch = first_batch(store)
    records = from_batch(batch, word_tokenizer())
    records = [records[k] for k in sorted(records)]
    assert {r.source.tenant for r in records} == {DEMOS} and all(
        r.governance is None for r in records
    )
    skills = RuleBasedAlfworldAnalyzer().analyze(
        [from_trajectory(t) for t in demo_trajectories(store)]
    )
    by_id = {s.trajectory_id: s for s in skills}
    paired = [by_id[r.trajectory_id] for r in records]
    ids = write_skills(store, records, paired, word_tokenizer(), tenant="skills")
    assert len(ids) == len(records)
    sources = {h.derived_from[0]: h.governance for h in skill_headers(store, "skills").values()}
    assert sources == {
        r.source: dataclasses.replace(
            store_governance(store, r.source),
            tenant="skills",
            redaction=sources[r.source].redaction,
        )
        for r in records
    }
    # a source purged after the batch was read: no skill may outlive it
    gone = records[0].source.trajectory_id
    with store.writer(DEMOS) as writer:
        writer.purge([gone], reason="deletion request")
    with pytest.raises(LineageError, match=f"not stored .*{gone}"):
        write_skills(store, records, paired, word_tokenizer(), tenant="skills")
    kept = write_skills(store, records, paired, word_tokenizer(), tenant="skills", skip_purged=True)
    assert len(kept) == len(records) - 1
    assert len(load_skills(store, tenant="skills")) == 2 * len(records) - 1


def store_governance(store, ref):
    reader = store.reader(ref.tenant, principal=ref.tenant)
    reader.refresh()
    return reader.entry(ref.trajectory_id).governance()
