"""Lineage: derived records carry their sources and the strictest of their governance, and a
purge of a source reaches everything derived from it, in any partition, at any depth."""

import dataclasses

import pytest
from atdp_factories import NOW, agent_trajectory
from hypothesis import given, settings
from hypothesis import strategies as st

from atdp_io import (
    AtdpStore,
    Classification,
    ConsentStatus,
    EligibilityPolicy,
    Governance,
    GovernanceUpdate,
    LegalBasis,
    PartitionLockedError,
    RedactionStatus,
    ReviewStatus,
    SchemaError,
    TrajectoryHeader,
    codec,
    lineage,
)
from atdp_io.governance import ineligibility_reason
from atdp_io.lineage import LineageError, strictest_governance
from atdp_io.schema import SourceRef


@st.composite
def governance(draw, tenant="acme"):
    basis = draw(st.sampled_from(LegalBasis))
    consents = list(ConsentStatus)
    if basis == LegalBasis.CONSENT:  # the schema demands a consent status with this basis
        consents.remove(ConsentStatus.NOT_APPLICABLE)
    return Governance(
        tenant=tenant,
        classification=draw(st.sampled_from(Classification)),
        legal_basis=basis,
        consent=draw(st.sampled_from(consents)),
        expires_at=draw(st.none() | st.floats(NOW - 100, NOW + 100)),
        training_eligible=draw(st.booleans()),
        human_review=draw(st.sampled_from(ReviewStatus)),
        redaction=draw(st.sampled_from(RedactionStatus)),
    )


POLICIES = [
    EligibilityPolicy(),
    EligibilityPolicy(require_review_approved=True),
    EligibilityPolicy(
        allowed_classifications=frozenset({Classification.PUBLIC}),
        allowed_redaction=frozenset({RedactionStatus.CLEAN}),
    ),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(governance(), min_size=1, max_size=5), st.randoms())
def test_strictest_governance_is_order_independent(sources, rng):
    shuffled = list(sources)
    rng.shuffle(shuffled)
    assert strictest_governance(shuffled) == strictest_governance(sources)
    # combining in two steps gives the same as at once (derived from derived)
    head = strictest_governance(sources[:1])
    assert strictest_governance([head, *sources[1:]]) == strictest_governance(sources)


@settings(max_examples=300, deadline=None)
@given(st.lists(governance(), min_size=1, max_size=5), st.floats(NOW - 150, NOW + 150))
def test_derived_governance_is_never_less_strict_than_a_source(sources, now):
    derived = strictest_governance(sources)
    assert derived.tenant == "acme"
    for source in sources:
        if source.expires_at is not None:
            assert derived.expires_at is not None and derived.expires_at <= source.expires_at
        assert derived.training_eligible <= source.training_eligible
        for policy in POLICIES:
            # whatever keeps a source out of training keeps the derived record out too
            if ineligibility_reason(source, source.redaction, now, policy) is not None:
                assert ineligibility_reason(derived, derived.redaction, now, policy) is not None
    assert strictest_governance([derived]) == derived  # a single source passes through


def test_strictest_governance_picks_each_most_restrictive_field():
    open_data = Governance(
        tenant="acme",
        classification=Classification.PUBLIC,
        legal_basis=LegalBasis.SYNTHETIC,
        consent=ConsentStatus.NOT_APPLICABLE,
        expires_at=None,
        training_eligible=True,
        human_review=ReviewStatus.APPROVED,
        redaction=RedactionStatus.CLEAN,
    )
    personal = Governance(
        tenant="acme",
        classification=Classification.CONFIDENTIAL,
        legal_basis=LegalBasis.CONSENT,
        consent=ConsentStatus.GRANTED,
        expires_at=NOW + 5,
        training_eligible=True,
        human_review=ReviewStatus.PENDING,
        redaction=RedactionStatus.REDACTED,
    )
    withdrawn = dataclasses.replace(
        personal, consent=ConsentStatus.WITHDRAWN, expires_at=NOW + 50, training_eligible=False
    )
    derived = strictest_governance([open_data, personal, withdrawn])
    assert derived == Governance(
        tenant="acme",
        classification=Classification.CONFIDENTIAL,
        legal_basis=LegalBasis.CONSENT,
        consent=ConsentStatus.WITHDRAWN,
        expires_at=NOW + 5,
        training_eligible=False,
        human_review=ReviewStatus.PENDING,
        redaction=RedactionStatus.REDACTED,
    )


def test_sources_of_several_tenants_or_none_are_refused():
    with pytest.raises(LineageError, match=r"several tenants \['acme', 'globex'\]"):
        strictest_governance(
            [
                Governance.synthetic("acme", expires_at=None),
                Governance.synthetic("globex", expires_at=None),
            ]
        )
    with pytest.raises(LineageError, match="at least one source"):
        strictest_governance([])
    with pytest.raises(LineageError, match=r"sources\[0\]: expected Governance"):
        strictest_governance(["acme"])


# -- the header field ---------------------------------------------------------------------------


def test_headers_without_lineage_store_and_read_as_before():
    header = agent_trajectory("a1").header
    stored = codec.to_json(header)
    assert "derived_from" in stored and stored["derived_from"] == []
    compact = codec.to_json_unchecked(header)
    assert "derived_from" not in compact  # the writer's encoding: bytes of old records unchanged
    old = {k: v for k, v in stored.items() if k != "derived_from"}  # written before lineage
    assert codec.from_json(TrajectoryHeader, old) == header


def test_bad_lineage_is_refused_naming_the_field():
    header = agent_trajectory("a1").header
    with pytest.raises(SchemaError, match=r"header.derived_from\[0\]: expected SourceRef"):
        dataclasses.replace(header, derived_from=("acme/a0",))
    with pytest.raises(SchemaError, match="cannot derive from itself"):
        dataclasses.replace(header, derived_from=(SourceRef("acme", "a1"),))
    with pytest.raises(SchemaError, match="lists a source twice"):
        dataclasses.replace(header, derived_from=(SourceRef("acme", "a0"),) * 2)
    with pytest.raises(SchemaError, match=r"source\.tenant"):
        SourceRef("no/slash", "a0")
    with pytest.raises(SchemaError, match="expected 'tenant/trajectory_id'"):
        SourceRef.parse("a0")
    data = codec.to_json(dataclasses.replace(header, derived_from=(SourceRef("acme", "a0"),)))
    data["derived_from"] = [{"tenant": "acme"}]
    with pytest.raises(SchemaError, match=r"derived_from\[0\].trajectory_id: required"):
        codec.from_json(TrajectoryHeader, data)
    assert SourceRef.parse("acme/run-1/ep/2") == SourceRef("acme", "run-1/ep/2")


# -- a store with derivations -------------------------------------------------------------------


def derived(trajectory_id, sources, *, tenant="acme", expires_at=None):
    """A derived episode; `expires_at=None` on purpose: the cascade must not rely on expiry."""
    trajectory = agent_trajectory(trajectory_id, tenant=tenant, expires_at=expires_at)
    header = dataclasses.replace(trajectory.header, derived_from=tuple(sources))
    return dataclasses.replace(trajectory, header=header)


@pytest.fixture
def store(tmp_path):
    """acme: a1 (expired), a2; a1 -> skill s1 (skills) -> relabel r1 (acme) -> copy c1 (demos);
    a1 -> b1 (acme, same partition); a2 -> s2 (skills)."""
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([agent_trajectory("a1", expires_at=NOW - 1), agent_trajectory("a2")])
        writer.append([derived("b1", [SourceRef("acme", "a1")])])
    with store.writer("skills") as writer:
        writer.append(
            [
                derived("s1", [SourceRef("acme", "a1")], tenant="skills"),
                derived("s2", [SourceRef("acme", "a2")], tenant="skills"),
            ]
        )
    with store.writer("acme") as writer:
        writer.append([derived("r1", [SourceRef("skills", "s1")])])
    with store.writer("demos") as writer:
        writer.append([derived("c1", [SourceRef("acme", "r1")], tenant="demos")])
    return store


def test_descendants_follow_every_level_and_partition(store):
    assert lineage.descendants(store, "acme", ["a1"]) == {
        SourceRef("acme", "b1"),
        SourceRef("skills", "s1"),
        SourceRef("acme", "r1"),
        SourceRef("demos", "c1"),
    }
    assert lineage.descendants(store, "acme", ["a2"]) == {SourceRef("skills", "s2")}
    assert lineage.descendants(store, "acme", ["b1"]) == set()
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    # one partition's reader sees only the derivations inside it
    assert lineage.descendants(reader, "acme", ["a1"]) == {SourceRef("acme", "b1")}
    assert lineage.ancestors(store, "demos", "c1") == {
        SourceRef("acme", "r1"),
        SourceRef("skills", "s1"),
        SourceRef("acme", "a1"),
    }
    with pytest.raises(TypeError, match="AtdpStore or a PartitionReader"):
        lineage.descendants("/tmp", "acme", ["a1"])


def ids(store, tenant):
    reader = store.reader(tenant, principal=tenant)
    reader.refresh()
    return sorted(reader.trajectory_ids())


def test_purging_an_expired_source_purges_what_came_from_it(store):
    plan = store.purge_expired("acme", principal="operator:retention", now=NOW, dry_run=True)
    assert sorted(plan) == ["a1", "b1", "r1"]
    assert ids(store, "skills") == ["s1", "s2"]  # a dry run purges nothing
    purged = store.purge_expired("acme", principal="operator:retention", now=NOW)
    assert sorted(purged) == ["a1", "b1", "r1"]
    assert ids(store, "acme") == ["a2"]
    assert ids(store, "skills") == ["s2"]
    assert ids(store, "demos") == []
    entry = store.audit_log("skills")[-1]
    assert entry["action"] == "purge" and entry["purpose"] == "lineage"
    assert entry["detail"]["derived_from_tenant"] == "acme" and entry["detail"]["purged"] == 1
    assert store.purge_expired("acme", principal="operator:retention", now=NOW) == []


def test_a_busy_partition_stops_the_cascade_before_any_source_goes(store, tmp_path):
    other_process = AtdpStore.open(tmp_path)  # its writer is not this store's live writer
    with other_process.writer("demos"), pytest.raises(PartitionLockedError):
        store.purge_expired("acme", principal="operator:retention", now=NOW)
    assert ids(store, "acme") == ["a1", "a2", "b1", "r1"]  # the sources are still there
    assert sorted(store.purge_expired("acme", principal="acme", now=NOW)) == ["a1", "b1", "r1"]
    assert ids(store, "demos") == []


def test_this_process_s_live_writer_carries_the_cascade_into_its_partition(store):
    with store.writer("demos"):  # e.g. a learner writing demos while the schedule purges
        purged = store.purge_expired("acme", principal="operator:retention", now=NOW)
    assert sorted(purged) == ["a1", "b1", "r1"]
    assert ids(store, "demos") == []


def test_deleting_a_source_deletes_what_came_from_it_and_withdrawal_follows_it(store):
    deleted = store.delete_trajectories(
        "acme", requested_by="acme", trajectory_ids=["a1"], reason="user request"
    )
    assert sorted(deleted) == ["a1", "b1", "r1"]
    assert ids(store, "skills") == ["s2"] and ids(store, "demos") == []
    entry = [e for e in store.audit_log("skills") if e["action"] == "delete"][-1]
    assert entry["purpose"] == "lineage" and entry["detail"]["derived_from_tenant"] == "acme"
    assert store.withdraw_consent("acme", requested_by="acme", trajectory_ids=["a2"]) == ["a2"]
    skills = store.reader("skills", principal="operator:ops", purpose="inspect")
    skills.refresh()
    assert skills.entry("s2").governance().consent == ConsentStatus.WITHDRAWN
    assert store.withdraw_consent("acme", requested_by="acme", trajectory_ids=["a2"]) == ["a2"]
    withdrawals = [e for e in store.audit_log("skills") if e["action"] == "withdraw_consent"]
    assert len(withdrawals) == 2


def test_a_live_writer_purges_its_own_partition_s_derivations(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append([agent_trajectory("a1", expires_at=NOW - 1), agent_trajectory("a2")])
        writer.append([derived("b1", [SourceRef("acme", "a1")])])
        writer.append([derived("b2", [SourceRef("acme", "b1")])])  # two levels down
        assert sorted(writer.purge_expired(NOW)) == ["a1", "b1", "b2"]
    assert ids(store, "acme") == ["a2"]


def test_derived_header_takes_the_sources_updates_and_names_them(store):
    with store.writer("acme") as writer:
        writer.annotate(
            GovernanceUpdate("a2", NOW, "user withdrew consent", consent=ConsentStatus.WITHDRAWN)
        )
    reader = store.reader("acme", principal="acme", purpose="inspect")  # training would refuse
    reader.refresh()
    header = lineage.derived_header(
        [reader.read("a2")], tenant="skills", trajectory_id="s9", created_at=NOW
    )
    assert header.derived_from == (SourceRef("acme", "a2"),)
    assert header.governance.tenant == "skills"
    assert header.governance.consent == ConsentStatus.WITHDRAWN
    assert header.governance.expires_at == NOW + 86400
    with pytest.raises(LineageError, match="sets governance"):
        lineage.derived_header([reader.read("a2")], governance=header.governance)


def test_purge_order_goes_level_by_level_and_ends_with_the_sources(store):
    plan = lineage.purge_plan(store, "acme", ["a1"])
    # c1 is three levels down, s1 one; acme's own (r1 two down, b1 one) go with the source
    assert plan == [("demos", ["c1"]), ("skills", ["s1"]), ("acme", ["r1", "b1", "a1"])]
    assert lineage.purge_plan(store, "acme", ["a2", "a2"]) == [
        ("skills", ["s2"]),
        ("acme", ["a2"]),
    ]
