"""`PurgeSchedule`: expired trajectories are purged on a schedule, beside live writers."""

import time

import pytest
from atdp_factories import NOW, agent_trajectory, stored_bytes

from atdp_io import AtdpStore
from atdp_io.retention import PurgeSchedule


class Clock:
    """A store clock the test moves."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock(NOW)


@pytest.fixture
def store(tmp_path, clock):
    store = AtdpStore.open(tmp_path, clock=clock)
    for tenant in ("acme", "globex"):
        with store.writer(tenant) as writer:
            writer.append(
                [
                    agent_trajectory(f"{tenant}-soon", tenant=tenant, seed=1, expires_at=NOW + 5),
                    agent_trajectory(f"{tenant}-keep", tenant=tenant, seed=2, expires_at=None),
                ]
            )
    return store


def _ids(store, tenant):
    reader = store.reader(tenant, principal=tenant, purpose="inspect")
    reader.refresh()
    return [e.trajectory_id for e in reader.index.by_id.values()]


def test_a_pass_purges_every_tenant_and_writes_nothing_when_nothing_expired(store, clock):
    schedule = PurgeSchedule(store, every_s=60)
    audit_before = len(store.audit_log("acme"))
    assert schedule.run_once() == {}  # nothing expired yet
    assert len(store.audit_log("acme")) == audit_before + 1  # its reader's opening, once
    assert schedule.run_once() == {}
    assert len(store.audit_log("acme")) == audit_before + 1
    clock.now = NOW + 5
    assert schedule.run_once() == {"acme": ["acme-soon"], "globex": ["globex-soon"]}
    assert _ids(store, "acme") == ["acme-keep"]
    assert schedule.stats == {"runs": 3, "purged": 2, "errors": 0}
    (purge,) = [e for e in store.audit_log("acme") if e["action"] == "purge"]
    assert purge["principal"] == "operator:retention" and purge["detail"]["purged"] == 1


def test_the_thread_purges_on_schedule_beside_a_live_writer_and_stops(store, clock, tmp_path):
    soon = agent_trajectory("acme-soon", seed=1).events[0].llm.input_ids.astype("<i4").tobytes()
    writer = store.writer("acme")  # the serving process's writer, say
    try:
        with PurgeSchedule(store, every_s=0.05, tenants=["acme"]) as schedule:
            assert schedule.running
            clock.now = NOW + 10
            deadline = time.monotonic() + 30
            while schedule.stats["purged"] < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert schedule.stats["purged"] == 1 and schedule.stats["errors"] == 0
            writer.append([agent_trajectory("acme-new", seed=3, expires_at=NOW + 60)])
        assert not schedule.running
        runs = schedule.stats["runs"]
        time.sleep(0.2)
        assert schedule.stats["runs"] == runs  # stopped means stopped
    finally:
        writer.close()
    assert _ids(store, "acme") == ["acme-keep", "acme-new"]
    assert soon not in stored_bytes(tmp_path / "tenants" / "acme")


def test_a_partition_written_by_another_process_is_skipped_and_retried(store, clock, tmp_path):
    clock.now = NOW + 10
    schedule = PurgeSchedule(store, every_s=60)
    with AtdpStore.open(tmp_path).writer("acme"):  # another process's writer, as it were
        assert schedule.run_once() == {"globex": ["globex-soon"]}
    assert schedule.stats["errors"] == 1
    assert "live writer" in str(schedule.last_error)
    assert schedule.run_once() == {"acme": ["acme-soon"]}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every_s": 0}, "every_s"),
        ({"every_s": -1.0}, "every_s"),
        ({"every_s": "60"}, "every_s"),
        ({"every_s": True}, "every_s"),
        ({"every_s": 60, "principal": "acme"}, "must be an operator"),
        ({"every_s": 60, "principal": "acme", "tenants": ["acme", "globex"]}, "operator"),
    ],
)
def test_bad_schedules_are_refused(store, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PurgeSchedule(store, **kwargs)


def test_a_tenant_may_schedule_its_own_retention(store, clock):
    clock.now = NOW + 10
    schedule = PurgeSchedule(store, every_s=60, tenants=["acme"], principal="acme")
    assert schedule.run_once() == {"acme": ["acme-soon"]}
    assert _ids(store, "globex") == ["globex-soon", "globex-keep"]
    with pytest.raises(RuntimeError, match="already started"):
        schedule.start().start()
    schedule.stop()
