"""`python -m atdp_io inspect|export|purge PATH`."""

import dataclasses
import json
import subprocess
import sys

import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import AtdpStore, Governance, codec
from atdp_io.cli import main


@pytest.fixture
def store_path(tmp_path):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append(
            [agent_trajectory("a1", final_reward=1.0), agent_trajectory("a2", final_reward=0.0)]
        )
        writer.append([agent_trajectory("old", expires_at=NOW - 10, final_reward=0.5)])
        writer.add_reward("a1", 0.25, event_index=1)
        no_train = dataclasses.replace(
            Governance.synthetic("acme", expires_at=None), training_eligible=False
        )
        writer.append([agent_trajectory("hold", governance=no_train)])
    with store.writer("globex") as writer:
        writer.append([agent_trajectory("g1", tenant="globex")])
    return tmp_path


def test_inspect_reports_counts_per_tenant(store_path, capsys):
    assert main(["inspect", str(store_path), "--json", "--now", str(NOW)]) == 0
    reports = {r["tenant"]: r for r in json.loads(capsys.readouterr().out)}
    acme = reports["acme"]
    assert (acme["trajectories"], acme["closed"], acme["purged"]) == (4, 4, 0)
    assert acme["events"] == 24 and acme["llm_calls"] == 12
    assert acme["reward_sum"] == pytest.approx(1.0 + 0.5 + 0.25 + 1.0)
    assert acme["late_rewards"] == 1
    assert acme["eligible"] == 2
    assert acme["ineligible"] == {"expired": 1, "not_training_eligible": 1}
    assert reports["globex"]["trajectories"] == 1
    assert main(["inspect", str(store_path), "--tenant", "acme"]) == 0
    assert "not_training_eligible=1" in capsys.readouterr().out


def test_export_writes_jsonl_that_round_trips(store_path, tmp_path):
    out = tmp_path / "acme.jsonl"
    args = ["export", str(store_path), "--principal", "acme", "--tenant", "acme", "--out", str(out)]
    assert main([*args, "--now", str(NOW)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    # "old" expired at NOW - 10: expired data never leaves the store, even unpurged
    assert [line["trajectory"]["header"]["trajectory_id"] for line in lines] == [
        "a1",
        "a2",
        "hold",
    ]
    back = codec.trajectory_from_export(lines[0]["trajectory"])
    original = agent_trajectory("a1", final_reward=1.0)
    for a, b in zip(back.events, original.events, strict=True):
        if a.llm is not None:
            assert a.llm.context_ids.tolist() == b.llm.context_ids.tolist()
    assert [a.reward.value for a in back.annotations] == [0.25]
    assert main([*args, "--eligible-only", "--now", str(NOW)]) == 0
    exported = [json.loads(line)["trajectory"] for line in out.read_text().splitlines()]
    assert [t["header"]["trajectory_id"] for t in exported] == ["a1", "a2"]
    # the same export a day earlier, before "old" expired, holds it
    assert main([*args, "--eligible-only", "--now", str(NOW - 86400)]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_an_operator_exports_ineligible_data_only_as_an_audited_review(store_path, tmp_path):
    out = tmp_path / "review.jsonl"
    args = ["export", str(store_path), "--tenant", "acme", "--out", str(out), "--now", str(NOW)]
    assert main([*args, "--principal", "operator:dpo"]) == 1  # no review reason: no content
    assert not out.read_text()
    assert main([*args, "--principal", "operator:dpo", "--review-reason", "ticket 42"]) == 0
    lines = [json.loads(line)["trajectory"] for line in out.read_text().splitlines()]
    assert [t["header"]["trajectory_id"] for t in lines] == ["a1", "a2", "old", "hold"]
    audit = AtdpStore.open(store_path).audit_log("acme")
    opened = [e for e in audit if e["action"] == "operator_review"]
    assert [(e["principal"], e["allowed"], e["detail"]["reason"]) for e in opened] == [
        ("operator:dpo", True, "ticket 42")
    ]
    reads = [e for e in audit if e["action"] == "operator_read_ineligible"]
    assert [list(e["detail"]["trajectories"].items()) for e in reads] == [
        [("old", "expired")],
        [("hold", "not_training_eligible")],
    ]
    assert main([*args, "--principal", "operator:dpo", "--review-reason", " "]) == 1
    # a tenant cannot claim the operator exception
    assert main([*args, "--principal", "acme", "--review-reason", "mine"]) == 1


def test_export_of_another_tenant_needs_a_grant(store_path, capsys):
    assert main(["export", str(store_path), "--principal", "globex", "--tenant", "acme"]) == 1
    assert "no active grant" in capsys.readouterr().err


def test_purge_dry_run_then_purge(store_path, capsys):
    assert main(["purge", str(store_path), "--now", str(NOW), "--dry-run"]) == 0
    assert "acme: would purge 1 expired trajectories\n  old" in capsys.readouterr().out
    assert main(["purge", str(store_path), "--now", str(NOW)]) == 0
    assert "acme: purged 1" in capsys.readouterr().out
    store = AtdpStore.open(store_path)
    reader = store.reader("acme", principal="acme", purpose="inspect")
    reader.refresh()
    assert reader.trajectory_ids() == ["a1", "a2", "hold"]
    audit = [e for e in store.audit_log("acme") if e["action"] == "purge"]
    assert audit[0]["principal"] == "operator:cli" and audit[0]["detail"]["purged"] == 1


def test_purge_refuses_while_a_writer_holds_the_partition(store_path, capsys):
    writer = AtdpStore.open(store_path).writer("acme")
    try:
        assert main(["purge", str(store_path), "--tenant", "acme", "--now", str(NOW)]) == 1
        assert "already has a live writer" in capsys.readouterr().err
    finally:
        writer.close()


def test_module_entry_point_and_missing_store(store_path, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "atdp_io", "inspect", str(store_path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert {r["tenant"] for r in json.loads(done.stdout)} == {"acme", "globex"}
    assert main(["inspect", str(tmp_path / "nowhere")]) == 2


def test_export_needs_a_principal_and_every_command_has_help(store_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["export", str(store_path)])
    assert exit_info.value.code == 2
    assert "principal is required (give --principal VALUE)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = capsys.readouterr().out
    for command in ("inspect", "export", "purge", "lineage"):
        assert f"\n  {command} " in listing
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        rows = [
            line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()
        ]
        assert "principal" in rows and ("path" in rows) == (command != "lineage")
