"""Promotion, the live-regression watch and automatic rollback, canaries, governance across
tenants and bad input, on a real composite store and live traffic written as real ATDP
trajectories (attributed by the composite version that served them)."""

from __future__ import annotations

import json

import pytest
from control_windows import tool_episode

from atdp_io import AtdpStore
from serving.control.audit import DecisionLog
from serving.control.canary import CanaryBook, CanaryError, serves_candidate, session_bucket
from serving.control.candidates import (
    Candidate,
    InvalidCandidate,
    Patch,
    Provenance,
    UnknownSurface,
    noop,
)
from serving.control.cli import main as control_cli
from serving.control.composite import CompositeError
from serving.control.deploy import CrossTenantRefused, finish_canary, promote, start_canary, watch
from serving.control.store import CompositeStore, ControlError

NOTE = {"id": "paris", "text": "Paris reports in Celsius.", "keys": ["paris"]}


def _note(tenant: str, note=NOTE) -> Candidate:
    return Candidate("memory", Patch(notes=(note,)), Provenance(tenant, "test"), "a note")


@pytest.fixture
def stores(tmp_path):
    store = CompositeStore(tmp_path / "composites")
    return store, AtdpStore.open(str(tmp_path / "atdp")), CanaryBook(store), DecisionLog(store.root)


def _traffic(atdp, tenant: str, version: int, successes: int, n: int = 12) -> None:
    for i in range(n):
        tool_episode(atdp, tenant, fails=i >= successes, version=version)


def test_a_live_regression_is_rolled_back_within_one_watch(stores):
    store, atdp, _, audit = stores
    store.put("acme", {"harness": {"system_prompt": "Be brief."}}, reason="v1")
    _traffic(atdp, "acme", 1, successes=10)
    made = promote(store, "acme", _note("acme"), audit=audit)
    assert made.version == 2 and made.spec.harness.system_prompt == "Be brief."  # patched on v1
    _traffic(atdp, "acme", 2, successes=2)  # the injected regression
    result = watch(store, atdp, "acme", audit=audit)
    assert result.status == "regressed" and result.rolled_back_to == 3
    assert (result.current.value, result.previous.value) == (2 / 12, 10 / 12)
    assert result.delta.high < 0
    restored = store.current("acme")
    assert (restored.version, restored.rollback_of) == (3, 1)
    assert restored.fingerprints == store.get("acme", 1).fingerprints
    assert "live success fell from 0.83 (version 1" in restored.reason
    events = [e["event"] for e in audit.entries("acme")]
    assert events == ["promote", "rollback", "watch"]
    # the next watch compares version 3 (no traffic yet) with 2: nothing more happens
    again = watch(store, atdp, "acme", audit=audit)
    assert again.status == "insufficient" and again.rolled_back_to is None
    assert store.current("acme").version == 3


def test_a_regression_after_two_promotions_in_one_round_is_measured_against_the_last_served(
    stores,
):
    store, atdp, _, audit = stores
    store.put("acme", {"harness": {"system_prompt": "Be brief."}}, reason="v1")
    _traffic(atdp, "acme", 1, successes=10)
    promote(store, "acme", _note("acme"), audit=audit)  # v2: replaced before any session
    other = {**NOTE, "id": "lyon", "text": "Lyon is in France.", "keys": ["lyon"]}
    promote(store, "acme", _note("acme", other), audit=audit)  # v3, the injected regression
    _traffic(atdp, "acme", 3, successes=2)
    result = watch(store, atdp, "acme", audit=audit)
    assert (result.status, result.previous_version, result.previous.n) == ("regressed", 1, 12)
    restored = store.current("acme")
    assert (restored.version, restored.rollback_of) == (4, 1)  # the last content shown better
    assert restored.fingerprints == store.get("acme", 1).fingerprints


def test_no_rollback_without_a_significant_drop(stores):
    store, atdp, _, audit = stores
    store.put("steady", {})
    _traffic(atdp, "steady", 1, successes=10)
    promote(store, "steady", _note("steady"), audit=audit)
    _traffic(atdp, "steady", 2, successes=9)
    result = watch(store, atdp, "steady", audit=audit)
    assert result.status == "ok" and result.delta.low < 0 < result.delta.high
    assert store.current("steady").version == 2
    few = watch(store, atdp, "steady", min_sessions=50, audit=audit)
    assert few.status == "insufficient"
    assert watch(store, atdp, "newco").status == "no_previous"


def test_a_regressing_canary_is_dropped(stores):
    store, atdp, canaries, audit = stores
    store.put("beta", {})
    canary = start_canary(store, canaries, "beta", _note("beta"), share=0.25, audit=audit)
    assert (canary.version, canary.baseline, canary.share) == (2, 1, 0.25)
    assert canary.salt == "beta-v2"
    # the split is a pure function of the session id: about a quarter of sessions
    ids = [f"session-{i}" for i in range(400)]
    share = sum(serves_candidate(canary, s) for s in ids) / len(ids)
    assert 0.18 < share < 0.32
    assert all(0.0 <= session_bucket(s, canary.salt) < 1.0 for s in ids)
    inside = next(s for s in ids if serves_candidate(canary, s))
    outside = next(s for s in ids if not serves_candidate(canary, s))
    assert canaries.serving("beta", inside).version == 2
    assert canaries.serving("beta", outside).version == 1
    _traffic(atdp, "beta", 2, successes=1)
    _traffic(atdp, "beta", 1, successes=10)
    result = watch(store, atdp, "beta", canaries=canaries, audit=audit)
    assert result.status == "regressed" and result.canary and result.rolled_back_to == 3
    assert canaries.get("beta") is None and store.current("beta").rollback_of == 1
    assert canaries.serving("beta", inside).version == 3
    events = [e["event"] for e in audit.entries("beta")]
    assert events == ["canary_start", "canary_stop", "rollback", "watch"]


def test_an_update_learned_from_one_tenant_never_reaches_another_by_default(stores):
    store, _, canaries, audit = stores
    store.put("globex", {"harness": {"system_prompt": "Globex agent."}})
    learned = _note("acme")
    with pytest.raises(CrossTenantRefused, match="allow_cross_tenant is false"):
        promote(store, "globex", learned, audit=audit)
    with pytest.raises(CrossTenantRefused, match="learned from tenant 'acme'"):
        start_canary(store, canaries, "globex", learned, share=0.5, audit=audit)
    assert [c.version for c in store.history("globex")] == [1]
    assert canaries.get("globex") is None
    refused = audit.entries("globex", "refused")
    assert [e["action"] for e in refused] == ["promote", "canary_start"]
    assert "CrossTenantRefused" in refused[0]["error"]
    # acme's governance lets its updates reach other tenants: now it applies on globex's own
    store.put("acme", {"governance": {"allow_cross_tenant": True}})
    made = promote(store, "globex", learned, audit=audit)
    assert made.spec.harness.system_prompt == "Globex agent."
    assert [n.id for n in made.spec.memory.notes] == ["paris"]
    nameless = Candidate("memory", Patch(notes=(NOTE,)), Provenance("", "test"))
    with pytest.raises(CrossTenantRefused, match="names no source tenant"):
        promote(store, "initech", nameless)


def test_bad_candidates_are_refused_and_change_nothing(stores):
    store, _, canaries, audit = stores
    store.put("acme", {})
    with pytest.raises(UnknownSurface, match="one of \\['noop', 'memory'"):
        Candidate("weights", Patch(), Provenance("acme", "test"))
    with pytest.raises(InvalidCandidate, match="a memory candidate may set \\['notes'\\]"):
        Candidate("memory", Patch(policy={"version": "x"}), Provenance("acme", "test"))
    with pytest.raises(InvalidCandidate, match="must change something"):
        Candidate("harness", Patch(), Provenance("acme", "test"))
    bad_schema = Candidate(
        "tool_schema",
        Patch(tool_schemas={"get_weather": {"version": "v2", "parameters": {"type": "string"}}}),
        Provenance("acme", "test"),
    )
    with pytest.raises(CompositeError, match='"type": "object"'):
        promote(store, "acme", bad_schema, audit=audit)
    bad_note = _note("acme", {"id": "no keys", "text": "x", "keys": []})
    with pytest.raises(CompositeError, match="id 'no keys'"):
        promote(store, "acme", bad_note, audit=audit)
    with pytest.raises(ControlError, match="nothing to promote"):
        promote(store, "acme", noop("acme"), audit=audit)
    for share in (0, 1.5, True):
        with pytest.raises(CanaryError, match="share"):
            start_canary(store, canaries, "acme", _note("acme"), share=share, audit=audit)
    with pytest.raises(CanaryError, match="no canary running"):
        finish_canary(store, canaries, "acme", keep=True)
    assert [c.version for c in store.history("acme")] == [1]
    assert len(audit.entries("acme", "refused")) == 6
    # a running canary blocks promotions and a second canary until it is finished
    start_canary(store, canaries, "acme", _note("acme"), share=0.5, audit=audit)
    with pytest.raises(CanaryError, match="a canary is running"):
        promote(store, "acme", _note("acme", {**NOTE, "id": "other"}), canaries=canaries)
    with pytest.raises(CanaryError, match="already running"):
        canaries.start("acme", share=0.5)
    with pytest.raises(CanaryError, match="newest version"):
        canaries.start("acme", share=0.5, version=1)
    assert finish_canary(store, canaries, "acme", keep=True).version == 2


def test_cli_canary_and_audit_on_a_stopped_gateways_store(stores, capsys):
    store, _, _, audit = stores
    store.put("acme", {})
    promote(store, "acme", _note("acme"), audit=audit)
    args = ["--store", str(store.root)]
    assert control_cli(["canary", "acme", *args]) == 0
    assert "no canary running" in capsys.readouterr().out
    assert control_cli(["canary", "acme", "--share", "0.2", *args]) == 0
    assert "canary started: version 2 for 20% of sessions" in capsys.readouterr().out
    assert control_cli(["canary", "acme", "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["canary"]["baseline"] == 1
    assert control_cli(["canary", "acme", "--share", "0.2", *args]) == 1
    assert "already running" in capsys.readouterr().err
    assert control_cli(["canary", "acme", "--stop", "--no-keep", *args]) == 0
    assert "composite version 3" in capsys.readouterr().out
    assert control_cli(["audit", "acme", *args]) == 0
    out = capsys.readouterr().out
    assert "promote" in out and "version 2: memory" in out
    assert control_cli(["audit", "acme", "--event", "promote", "--json", *args]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line)["candidate"]["surface"] == "memory"
    assert control_cli(["audit", "acme", "--store", "/nonexistent/composites"]) == 1
