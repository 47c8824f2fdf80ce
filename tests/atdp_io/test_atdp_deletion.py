"""Store-level deletion and consent withdrawal: selection, erased bytes, audit, bad requests."""

import dataclasses

import pytest
from atdp_factories import NOW, agent_trajectory, stored_bytes

from atdp_io import AccessDenied, AtdpStore, ConsentStatus, PartitionLockedError
from atdp_io.deletion import UnknownTenantError


def _trajectory(trajectory_id, seed, *, session_id="", user_id=None):
    trajectory = agent_trajectory(trajectory_id, seed=seed, expires_at=None)
    task = {**trajectory.header.task, "marker": f"MARKER-{trajectory_id}"}
    if user_id is not None:
        task["user_id"] = user_id
    header = dataclasses.replace(trajectory.header, session_id=session_id, task=task)
    return dataclasses.replace(trajectory, header=header)


@pytest.fixture
def store(tmp_path):
    store = AtdpStore.open(tmp_path, clock=lambda: NOW)
    with store.writer("acme") as writer:
        writer.append(
            [
                _trajectory("a1", 0, session_id="s-a", user_id="alice"),
                _trajectory("a2", 1, session_id="s-b", user_id="alice"),
                _trajectory("b1", 2, session_id="s-b", user_id="bob"),
                _trajectory("r1", 3),  # a rollout: no session, no user
            ]
        )
    with store.writer("globex") as writer:
        writer.append([agent_trajectory("g1", tenant="globex", seed=9, expires_at=None)])
    return store


def _ids(store, tenant="acme"):
    reader = store.reader(tenant, principal=tenant, purpose="inspect")
    reader.refresh()
    return reader.trajectory_ids(closed_only=False)


def _data_bytes(root, tenant="acme"):
    """The partition's record log, payloads, token streams and head (not its audit log)."""
    partition = root / "tenants" / tenant
    arrays = [stored_bytes(partition / name) for name in ("records", "meta", "tokens")]
    return b"".join(arrays) + (partition / "head.json").read_bytes()


def _audit(store, action, tenant="acme"):
    return [e for e in store.audit_log(tenant) if e["action"] == action]


def test_deleting_a_users_data_erases_its_bytes_and_is_audited(store, tmp_path):
    first = tmp_path / "tenants" / "acme"
    tokens = {t: _trajectory(t, s).events[0].llm.input_ids.astype("<i4").tobytes()
              for t, s in (("a1", 0), ("a2", 1), ("b1", 2))}  # fmt: skip
    assert b"MARKER-a1" in stored_bytes(first) and tokens["a1"] in stored_bytes(first)
    deleted = store.delete_trajectories(
        "acme", requested_by="acme", user_id="alice", reason="GDPR erasure #12"
    )
    assert deleted == ["a1", "a2"]
    assert _ids(store) == ["b1", "r1"]
    raw = stored_bytes(first)
    for gone in ("a1", "a2"):
        assert f"MARKER-{gone}".encode() not in raw and tokens[gone] not in raw
    assert b"MARKER-b1" in raw and tokens["b1"] in raw
    (entry,) = _audit(store, "delete")
    assert entry["principal"] == "acme" and entry["allowed"]
    assert entry["detail"]["deleted"] == ["a1", "a2"]
    assert entry["detail"]["user_id"] == "alice"
    assert entry["detail"]["reason"] == "GDPR erasure #12"


def test_selectors_combine_and_an_empty_match_deletes_nothing(store, tmp_path):
    by = {"requested_by": "operator:dpo", "reason": "ticket"}
    assert store.delete_trajectories("acme", session_id="s-b", user_id="bob", **by) == ["b1"]
    head = _data_bytes(tmp_path)
    assert store.delete_trajectories("acme", session_id="s-a", user_id="bob", **by) == []
    assert _data_bytes(tmp_path) == head  # no match: no writer opened, nothing written
    assert store.delete_trajectories("acme", trajectory_ids=["r1", "a2"], **by) == ["r1", "a2"]
    assert _ids(store) == ["a1"]
    assert _ids(store, "globex") == ["g1"]  # another tenant is never touched
    assert [e["detail"]["deleted"] for e in _audit(store, "delete")] == [["b1"], [], ["r1", "a2"]]


def test_a_withdrawal_stops_training_reads_at_once_and_keeps_the_bytes(store, tmp_path):
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    assert reader.trajectory_ids() == ["a1", "a2", "b1", "r1"]
    assert store.withdraw_consent("acme", requested_by="acme", session_id="s-b") == ["a2", "b1"]
    reader.refresh()
    assert reader.trajectory_ids() == ["a1", "r1"]
    assert reader.index.by_id["b1"].governance().consent == ConsentStatus.WITHDRAWN
    assert b"MARKER-b1" in stored_bytes(tmp_path)  # withdrawn, not erased
    # repeating it adds no second annotation, and still reports the ids
    assert store.withdraw_consent("acme", requested_by="acme", trajectory_ids=["b1"]) == ["b1"]
    reader.refresh()
    notes = reader.index.by_id["b1"].annotations
    assert [n.consent for n in notes] == [ConsentStatus.WITHDRAWN]
    assert [e["detail"]["annotated"] for e in _audit(store, "withdraw_consent")] == [2, 0]


def test_requests_go_through_this_processs_live_writer(store):
    with store.writer("acme") as writer:  # e.g. the serving process's writer
        assert store.withdraw_consent("acme", requested_by="acme", user_id="bob") == ["b1"]
        assert store.delete_trajectories(
            "acme", requested_by="acme", trajectory_ids=["a1"], reason="user asked"
        ) == ["a1"]
        writer.add_reward("a2", 1.0)  # the live writer is still usable
    assert _ids(store) == ["a2", "b1", "r1"]


def test_a_writer_in_another_process_makes_a_request_fail_cleanly(store, tmp_path):
    other = AtdpStore.open(tmp_path)  # not this store's writer: another process's, as it were
    with other.writer("acme"), pytest.raises(PartitionLockedError):
        store.delete_trajectories("acme", requested_by="acme", user_id="alice", reason="x")
    assert _ids(store) == ["a1", "a2", "b1", "r1"]
    assert _audit(store, "delete") == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "give session_id, user_id or trajectory_ids"),
        ({"session_id": ""}, ValueError, "session_id must be a non-empty string"),
        ({"user_id": 7}, ValueError, "user_id must be a non-empty string"),
        ({"trajectory_ids": "a1"}, ValueError, "list of strings"),
        ({"trajectory_ids": []}, ValueError, "trajectory_ids is empty"),
        ({"trajectory_ids": ["a1", None]}, ValueError, "non-empty strings"),
        ({"user_id": "alice", "requested_by": None}, ValueError, "requested_by"),
        ({"user_id": "alice", "requested_by": ["acme"]}, ValueError, "requested_by"),
        ({"user_id": "alice", "requested_by": "globex"}, AccessDenied, "may not change"),
        ({"user_id": "alice", "tenant": "nobody"}, UnknownTenantError, "no tenant 'nobody'"),
        ({"user_id": "alice", "tenant": "../acme"}, ValueError, "tenant"),
    ],
)
@pytest.mark.parametrize("operation", ["delete", "withdraw"])
def test_bad_requests_raise_clearly_and_change_nothing(
    store, tmp_path, operation, kwargs, error, match
):
    kwargs = {"requested_by": "acme", **kwargs}
    tenant = kwargs.pop("tenant", "acme")
    before = _data_bytes(tmp_path)
    with pytest.raises(error, match=match):
        if operation == "delete":
            store.delete_trajectories(tenant, reason="r", **kwargs)
        else:
            store.withdraw_consent(tenant, **kwargs)
    assert _ids(store) == ["a1", "a2", "b1", "r1"]
    assert _data_bytes(tmp_path) == before
    assert store.tenants() == ["acme", "globex"]
    denied = [e for e in store.audit_log("acme") if not e["allowed"]]
    assert [e["principal"] for e in denied] == (["globex"] if error is AccessDenied else [])


def test_a_repeated_deletion_is_idempotent(store, tmp_path):
    first = store.delete_trajectories(
        "acme", requested_by="acme", trajectory_ids=["a1", "nope"], reason="user request"
    )
    again = store.delete_trajectories(
        "acme", requested_by="acme", trajectory_ids=["a1", "nope"], reason="retried"
    )
    assert (first, again) == (["a1"], [])
    assert _ids(store) == ["a2", "b1", "r1"]
    assert [e["detail"]["deleted"] for e in _audit(store, "delete")] == [["a1"], []]


def test_a_deletion_needs_a_reason(store):
    with pytest.raises(ValueError, match="reason"):
        store.delete_trajectories("acme", requested_by="acme", user_id="alice", reason=" ")
    assert _ids(store) == ["a1", "a2", "b1", "r1"]
