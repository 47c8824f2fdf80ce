"""Admission budget of the rollout engine: AReaL's capacity when the learner only publishes,
and outstanding-episode accounting so that episodes the learner passes without a new version
(loader drops, skipped policy steps) can never block admission for good."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sao_jax.rollout.admission import AdmissionBudget


def fill(budget: AdmissionBudget, version: int, n: int = 1) -> int:
    """Start groups of n until the budget refuses; returns the episodes started."""
    started = 0
    while budget.try_start(n, version):
        started += n
    return started


@pytest.mark.parametrize("eta,b", [(0, 4), (2, 6), (1, 1)])
def test_without_reports_it_is_areals_rule(eta, b):
    budget = AdmissionBudget(eta, b)
    assert fill(budget, version=-1) == (eta + 1) * b  # nothing published yet counts as v = 0
    for version in range(1, 4):
        assert fill(budget, version) == b
        assert budget.started == (eta + version + 1) * b


def test_versions_count_from_the_one_published_when_admission_began():
    """A resumed run's new engine at version 50 starts (eta + 1) * B, not 51 * B, episodes."""
    budget = AdmissionBudget(1, 4, first_version=50)
    assert fill(budget, 50) == 8
    assert fill(budget, 51) == 4
    assert AdmissionBudget(1, 4, first_version=-1).first_version == 0  # nothing published


def test_groups_start_whole_or_not_at_all():
    budget = AdmissionBudget(2, 6)  # capacity 18, GRPO groups of 4: 16 fit, a fifth does not
    assert fill(budget, 0, n=4) == 16
    assert budget.outstanding(0) == 16
    assert fill(budget, 1, n=4) == 8  # 24 <= 24
    assert fill(budget, 2, n=4) == 4  # 28 <= 30 < 32


def test_stale_drops_free_their_admission():
    budget = AdmissionBudget(0, 4)
    assert fill(budget, 0) == 4
    budget.drop(3)  # finished after a publish they predate: never written
    assert budget.outstanding(0) == 1
    assert fill(budget, 0) == 3


def test_consumed_episodes_reopen_admission_without_a_new_version():
    """The stall: the learner took every committed episode off its stream (dropped as too
    long, or trained on with a skipped step) and published nothing."""
    budget = AdmissionBudget(0, 4)
    assert fill(budget, 0) == 4
    budget.commit(2, at=10.0)
    budget.commit(2, at=11.0)
    assert not budget.try_start(1, 0)  # AReaL's rule alone: blocked until version 1, forever
    assert budget.mark_consumed(10.5) == 2  # the stream's read began between the commits
    assert budget.outstanding(0) == 2 and fill(budget, 0) == 2
    assert budget.mark_consumed(10.5) == 0  # reports are idempotent
    assert budget.mark_consumed(11.0) == 2  # a commit at the instant the read began counts
    assert budget.consumed == 4 and fill(budget, 0) == 2


def test_a_report_before_the_commits_retires_nothing():
    budget = AdmissionBudget(1, 2)
    assert fill(budget, 0) == 4
    budget.commit(4, at=5.0)
    assert budget.mark_consumed(4.999) == 0
    assert not budget.try_start(1, 0)


def test_versions_and_reports_are_not_counted_twice():
    """Both estimate the episodes the learner is done with: the larger one retires."""
    budget = AdmissionBudget(0, 4)
    assert fill(budget, 0) == 4
    budget.commit(4, at=1.0)
    budget.mark_consumed(2.0)
    assert fill(budget, 0) == 4  # 8 started, 4 consumed
    assert fill(budget, 1) == 0  # version 1 retires B = 4: the same 4, not 4 more
    budget.commit(4, at=3.0)
    budget.mark_consumed(4.0)
    assert fill(budget, 1) == 4 and budget.outstanding(1) == 4


@settings(max_examples=60, deadline=None)
@given(
    eta=st.integers(0, 3),
    b=st.integers(1, 6),
    group=st.integers(1, 6),
    script=st.lists(
        st.tuples(
            st.sampled_from(["start", "drop", "commit", "consume", "publish"]), st.integers()
        ),
        max_size=40,
    ),
)
def test_outstanding_stays_bounded_and_a_drained_stream_always_readmits(eta, b, group, script):
    group = min(group, b)  # the engine refuses group_size > episodes_per_version
    budget = AdmissionBudget(eta, b)
    version, clock, in_flight, written = 0, 0.0, 0, 0
    for op, _ in script:
        clock += 1.0
        if op == "start" and budget.try_start(group, version):
            in_flight += group
            assert budget.outstanding(version) <= budget.capacity
        elif op == "drop" and in_flight:
            budget.drop(in_flight)
            in_flight = 0
        elif op == "commit" and in_flight:
            budget.commit(in_flight, at=clock)
            written, in_flight = written + in_flight, 0
        elif op == "consume":
            budget.mark_consumed(clock)
        elif op == "publish":
            version += 1
    # Whatever happened: once every started episode is finished and the consumer has drained
    # its stream, a group can start (the livelock was this failing forever).
    if in_flight:
        budget.commit(in_flight, at=clock + 1.0)
    budget.mark_consumed(clock + 2.0)
    assert budget.outstanding(version) <= 0
    assert budget.try_start(group, version)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="max_staleness"):
        AdmissionBudget(-1, 4)
    with pytest.raises(ValueError, match="episodes_per_version"):
        AdmissionBudget(0, 0)
    budget = AdmissionBudget(0, 4)
    with pytest.raises(ValueError, match="at least one episode"):
        budget.try_start(0, 0)
    with pytest.raises(ValueError, match="drop: expected a positive episode count"):
        budget.drop(0)
    with pytest.raises(ValueError, match="commit: expected a positive episode count"):
        budget.commit(-2, at=1.0)
    for bad in (math.nan, math.inf, "now", None):
        with pytest.raises(ValueError, match="committed_before must be a finite"):
            budget.mark_consumed(bad)
    assert budget.started == budget.dropped == budget.consumed == 0  # nothing was counted
