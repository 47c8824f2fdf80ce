"""Eligibility, expiry and consent hold on every path that trains or leaves the store.

The loader, training readers (`read`, `read_entries`, `read_training_views`, the listings) and
exports apply one rule at read time (`governance.refusal_reason`, with `now` injectable); an
operator reads ineligible data only through an audited `operator_review` reader.
"""

import dataclasses
import json

import grain
import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import AccessDenied, AtdpStore, ConsentStatus, Governance, ReviewStatus
from atdp_io.cli import main
from atdp_io.governance import IneligibleTrajectoryError
from atdp_io.loader import AtdpLoader, LoaderConfig

ALL = ["ok", "later", "expired", "no_train", "pending", "withdrawn"]


def _trajectory(trajectory_id, seed, **governance):
    base = Governance.synthetic("acme", expires_at=governance.pop("expires_at", None))
    return agent_trajectory(
        trajectory_id, seed=seed, governance=dataclasses.replace(base, **governance)
    )


@pytest.fixture
def store(tmp_path):
    store = AtdpStore.open(tmp_path, clock=lambda: NOW)
    with store.writer("acme") as writer:
        writer.append(
            [
                _trajectory("ok", 0),
                _trajectory("later", 1, expires_at=NOW + 100),
                _trajectory("expired", 2, expires_at=NOW - 10),
                _trajectory("no_train", 3, training_eligible=False),
                _trajectory("pending", 4, human_review=ReviewStatus.PENDING),
                _trajectory("withdrawn", 5),
            ]
        )
    # withdrawn after writing: a governance update, folded in at read time
    assert store.withdraw_consent("acme", requested_by="acme", trajectory_ids=["withdrawn"]) == [
        "withdrawn"
    ]
    return store


def _reader(store, **kwargs):
    reader = store.reader("acme", principal=kwargs.pop("principal", "acme"), **kwargs)
    reader.refresh()
    return reader


def _loaded_ids(store, clock=lambda: NOW):
    loader = AtdpLoader(
        store,
        ["acme"],
        principal="acme",
        config=LoaderConfig(rows=64, seq_len=64, layout="windowed"),
        clock=clock,
        shard=grain.sharding.ShardOptions(0, 1),
    )
    snapshot = loader._snapshot()
    return [item.trajectory_id for item in loader.load_many(snapshot)], loader


def test_training_readers_list_and_read_only_eligible_trajectories(store):
    reader = _reader(store)
    assert reader.trajectory_ids() == ["ok", "later"]
    assert [t.trajectory_id for t in reader.read_entries(reader.entries())] == ["ok", "later"]
    for trajectory_id, reason in [
        ("expired", "expired"),
        ("no_train", "not_training_eligible"),
        ("pending", "human_review"),
        ("withdrawn", "consent"),
    ]:
        with pytest.raises(IneligibleTrajectoryError, match=reason) as caught:
            reader.read(trajectory_id)
        assert caught.value.reasons == {trajectory_id: reason}
    # one refused entry refuses the whole read: nothing is decoded
    every = [reader.entry(t) for t in ALL]
    with pytest.raises(IneligibleTrajectoryError) as caught:
        reader.read_training_views(every)
    assert sorted(caught.value.reasons) == ["expired", "no_train", "pending", "withdrawn"]
    # expiry is checked at read time: `now` is injectable
    assert reader.trajectory_ids(now=NOW + 200) == ["ok"]
    with pytest.raises(IneligibleTrajectoryError, match="expired"):
        reader.read_training_views([reader.entry("later")], now=NOW + 100)
    assert len(reader.read_training_views([reader.entry("later")], now=NOW + 99)) == 1


def test_the_loader_never_yields_an_ineligible_expired_or_withdrawn_trajectory(store):
    ids, loader = _loaded_ids(store)
    assert ids == ["ok", "later"]
    stats = loader.stats.snapshot()
    assert {k: v for k, v in stats.items() if k.startswith("dropped_ineligible")} == {
        "dropped_ineligible_expired": 1,
        "dropped_ineligible_not_training_eligible": 1,
        "dropped_ineligible_human_review": 1,
        "dropped_ineligible_consent": 1,
    }
    # the loader's clock decides expiry, at read time
    assert _loaded_ids(store, clock=lambda: NOW + 200)[0] == ["ok"]
    # the epoch's batches hold exactly the rows of the eligible two
    expected_rows = sum(len(i.rows) for i in loader.load_many(loader._snapshot()))
    before = loader.stats.snapshot().get("rows_emitted", 0)
    batches = list(loader.epoch(shuffle=False))
    assert len(batches) == 1
    assert loader.stats.snapshot()["rows_emitted"] - before == expected_rows > 0
    assert int((batches[0]["segment_ids"] > 0).any(axis=1).sum()) == expected_rows


def test_a_consent_withdrawn_after_reading_keeps_the_trajectory_out_of_the_batch(store):
    _, loader = _loaded_ids(store)
    items = loader.load_many(loader._snapshot())
    assert [i.trajectory_id for i in items] == ["ok", "later"]
    before = loader.stats.snapshot()["dropped_ineligible_consent"]
    store.withdraw_consent("acme", requested_by="operator:dpo", trajectory_ids=["later"])
    assert loader.still_allowed(items) == [True, False]
    assert loader.stats.snapshot()["dropped_ineligible_consent"] == before + 1


def test_exports_hold_back_expired_and_withdrawn_data_and_eligible_only_what_trains(store):
    reader = _reader(store, purpose="export")
    assert reader.trajectory_ids() == ["ok", "later", "no_train", "pending"]
    assert [e.trajectory_id for e in reader.eligible_entries()] == ["ok", "later"]
    assert [e.trajectory_id for e in reader.eligible_entries(now=NOW + 100)] == ["ok"]
    for trajectory_id, reason in [("expired", "expired"), ("withdrawn", "consent")]:
        with pytest.raises(IneligibleTrajectoryError, match=reason):
            reader.read(trajectory_id)
    assert reader.read("pending").trajectory_id == "pending"  # leaves, not for training
    # a purpose that neither trains nor exports (a session served back) still ends at expiry
    other = _reader(store, purpose="inspect")
    assert other.trajectory_ids() == [t for t in ALL if t != "expired"]


def test_the_cli_export_applies_the_same_rule(store, tmp_path):
    out = tmp_path / "out.jsonl"
    args = ["export", str(tmp_path), "--principal", "acme", "--out", str(out), "--now", str(NOW)]

    def exported(*extra):
        assert main([*args, *extra]) == 0
        return [json.loads(line)["trajectory"]["header"]["trajectory_id"] for line in open(out)]

    assert exported() == ["ok", "later", "no_train", "pending"]
    assert exported("--eligible-only") == ["ok", "later"]


def test_a_denied_consent_is_held_back_from_exports(tmp_path):
    store = AtdpStore.open(tmp_path, clock=lambda: NOW)
    with store.writer("acme") as writer:
        writer.append([_trajectory("denied", 0, consent=ConsentStatus.DENIED)])
    assert _reader(store, purpose="export").trajectory_ids() == []
    assert _reader(store, purpose="inspect").trajectory_ids() == ["denied"]


def test_operators_read_ineligible_data_only_through_an_audited_review(store):
    with pytest.raises(AccessDenied):  # an operator has no content access otherwise
        _reader(store, principal="operator:dpo", purpose="training")
    with pytest.raises(ValueError, match="reason"):
        _reader(store, principal="operator:dpo", purpose="operator_review")
    with pytest.raises(AccessDenied, match="operators only"):
        _reader(store, principal="acme", purpose="operator_review", reason="mine")
    review = _reader(store, principal="operator:dpo", purpose="operator_review", reason="T-7")
    assert review.trajectory_ids() == ALL
    read = review.read_entries([review.entry(t) for t in ("ok", "expired", "withdrawn")])
    assert [t.trajectory_id for t in read] == ["ok", "expired", "withdrawn"]
    review.read("ok")  # nothing exceptional: not audited per read
    audit = store.audit_log("acme")
    opened = [(e["principal"], e["allowed"]) for e in audit if e["action"] == "operator_review"]
    assert opened == [("acme", False), ("operator:dpo", True)]
    (exception,) = [e for e in audit if e["action"] == "operator_read_ineligible"]
    assert exception["principal"] == "operator:dpo"
    assert exception["detail"]["reason"] == "T-7"
    assert exception["detail"]["trajectories"] == {"expired": "expired", "withdrawn": "consent"}
