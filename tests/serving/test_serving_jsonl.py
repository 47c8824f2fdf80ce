"""The gateway's append-only JSON-lines files after a crash mid-write: the torn last line is
skipped, and the next entry is not glued onto it (which would lose an acknowledged entry)."""

import json

import pytest

from serving.common.jsonl import drop_torn_tail, read_entries
from serving.control.audit import DecisionLog
from serving.gateway.audit import GatewayAudit
from serving.gateway.sessions import TABLE_FILE, SessionTable


def tear(path, text='{"op": "start", "session": {"session_'):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)  # what a kill -9 leaves mid-write: no newline


def test_a_session_committed_after_a_torn_line_survives_the_next_restart(tmp_path):
    table = SessionTable(tmp_path)
    first, _ = table.create("acme", "proxy-0", {})
    table.commit(first)
    table.close()
    tear(tmp_path / TABLE_FILE)

    table = SessionTable(tmp_path)  # restart after the crash
    assert table.get(first.session_id) == first
    second, key = table.create("acme", "proxy-0", {"task": 2})
    table.commit(second)
    table.end(first)
    table.close()

    table = SessionTable(tmp_path)  # the next restart still reads what came after the tear
    assert table.by_key(key) == second
    assert table.get(first.session_id).ended
    assert len(table) == 2
    lines = (tmp_path / TABLE_FILE).read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["start", "start", "end"]


def test_the_gateway_audit_and_the_decision_log_drop_a_torn_tail_before_appending(tmp_path):
    audit = GatewayAudit(tmp_path)
    audit.record(route="/rl/delete", status=200)
    audit.close()
    tear(audit.path, '{"time": 1.0, "route": "/rl/del')
    audit = GatewayAudit(tmp_path)
    audit.record(route="/rl/withdraw_consent", status=403)
    assert [e["route"] for e in audit.entries()] == ["/rl/delete", "/rl/withdraw_consent"]
    audit.close()

    log = DecisionLog(tmp_path / "control")
    log.record("decision", "acme", surface="memory")
    tear(log.path, '{"event": "ship", "ten')
    log = DecisionLog(tmp_path / "control")  # a restarted control plane
    log.record("rollback", "acme", surface="memory")
    assert [e["event"] for e in log.entries()] == ["decision", "rollback"]


@pytest.mark.parametrize("torn", [b"x", b"{" * 70_000])  # within and beyond one read block
def test_drop_torn_tail_cuts_back_to_the_last_complete_line(tmp_path, torn):
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n' + torn)
    assert drop_torn_tail(path) == len(torn)
    assert path.read_bytes() == b'{"a": 1}\n{"b": 2}\n'
    assert drop_torn_tail(path) == 0  # a clean file is left alone
    assert read_entries(path) == [{"a": 1}, {"b": 2}]


def test_a_file_that_is_only_a_torn_line_becomes_empty_and_a_missing_one_is_fine(tmp_path):
    path = tmp_path / "log.jsonl"
    assert drop_torn_tail(path) == 0 and not path.exists()
    assert read_entries(path) == []
    path.write_bytes(b'{"half')
    assert read_entries(path) == []
    assert drop_torn_tail(path) == 6
    assert path.read_bytes() == b""
