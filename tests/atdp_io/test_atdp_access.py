"""Tenant isolation: separate partitions, explicit grants, and an audit trail of every access."""

import pytest
from atdp_factories import NOW, agent_trajectory, stored_bytes

from atdp_io import AccessDenied, AtdpStore


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def two_tenants(tmp_path):
    clock = Clock(NOW)
    store = AtdpStore.open(tmp_path, clock=clock)
    for tenant in ("acme", "globex"):
        with store.writer(tenant) as writer:
            writer.append([agent_trajectory(f"{tenant}-1", tenant=tenant, seed=len(tenant))])
    return store, clock


def _entries(store, tenant, **match):
    return [e for e in store.audit_log(tenant) if all(e.get(k) == v for k, v in match.items())]


def test_partitions_are_physically_separate(two_tenants, tmp_path):
    store, _ = two_tenants
    assert store.tenants() == ["acme", "globex"]
    acme_bytes = stored_bytes(tmp_path / "tenants" / "acme")
    globex = agent_trajectory("globex-1", tenant="globex", seed=len("globex"))
    assert globex.events[0].llm.input_ids.astype("<i4").tobytes() not in acme_bytes
    assert b"globex-1" not in acme_bytes


def test_reading_another_tenant_needs_a_grant_and_is_audited(two_tenants):
    store, clock = two_tenants
    with pytest.raises(AccessDenied, match="'globex' has no active grant to read tenant 'acme'"):
        store.reader("acme", principal="globex")
    assert len(_entries(store, "acme", principal="globex", allowed=False)) == 1

    grant = store.grant(
        "acme", "globex", granted_by="acme", purpose="training", expires_at=NOW + 60
    )
    reader = store.reader("acme", principal="globex")
    reader.refresh()
    assert reader.trajectory_ids() == ["acme-1"]
    allowed = _entries(store, "acme", principal="globex", allowed=True, action="read")
    assert [e["grant_id"] for e in allowed] == [grant.grant_id]
    assert _entries(store, "acme", action="grant")[0]["detail"] == {"grantee": "globex"}

    with pytest.raises(AccessDenied):  # a grant is for one purpose
        store.reader("acme", principal="globex", purpose="export")
    clock.now = NOW + 61
    with pytest.raises(AccessDenied):  # and until it expires
        store.reader("acme", principal="globex")
    clock.now = NOW
    store.revoke("acme", grant.grant_id, revoked_by="acme")
    with pytest.raises(AccessDenied):
        store.reader("acme", principal="globex")
    assert [g.revoked_by for g in store.access.grants("acme")] == ["acme"]
    # The grant went one way only.
    with pytest.raises(AccessDenied):
        store.reader("globex", principal="acme")


def test_only_the_owner_or_an_operator_grants(two_tenants):
    store, _ = two_tenants
    with pytest.raises(AccessDenied, match="may not grant access to 'acme'"):
        store.grant("acme", "mallory", granted_by="globex", purpose="training")
    grant = store.grant("acme", "research", granted_by="operator:alice", purpose="training")
    assert grant.granted_by == "operator:alice"
    with pytest.raises(ValueError, match="tenant"):
        store.grant("../acme", "globex", granted_by="operator:alice", purpose="training")


def test_operators_get_counts_not_content(two_tenants):
    store, _ = two_tenants
    reader = store.reader("acme", principal="operator:oncall", purpose="inspect")
    reader.refresh()
    assert reader.trajectory_ids() == ["acme-1"]
    with pytest.raises(AccessDenied, match="no content access"):
        reader.read("acme-1")
    with pytest.raises(AccessDenied):
        store.reader("acme", principal="operator:oncall", purpose="training")
    assert _entries(store, "acme", principal="operator:oncall", action="maintenance")


def test_bad_tenant_ids_never_become_paths(tmp_path):
    store = AtdpStore.open(tmp_path)
    for tenant in ("../escape", "a/b", "", "x" * 65, "operator:root"):
        with pytest.raises(ValueError, match="tenant"):
            store.writer(tenant)
    assert not (tmp_path.parent / "escape").exists()
