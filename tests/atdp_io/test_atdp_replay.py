"""Replay: deterministic re-scoring of LLM calls, approximate environment replay, reruns."""

import dataclasses

import numpy as np
import pytest
from atdp_factories import agent_trajectory, env_event, tool_event

from atdp_io import Event, EventKind, ReplayClass
from atdp_io.replay import replay_episode, rerun_episode, rescore

VOCAB = 256


def bigram_table(seed: int) -> np.ndarray:
    """log p(next | previous): a real (if small) language model, `[V, V]`."""
    logits = np.random.default_rng(seed).normal(size=(VOCAB, VOCAB))
    return logits - np.log(np.exp(logits).sum(1, keepdims=True))


def bigram_score_fn(table):
    calls = []

    def score(tokens: np.ndarray) -> np.ndarray:
        calls.append(tokens.shape)
        logp = np.zeros(tokens.shape, np.float32)
        logp[:, 1:] = table[tokens[:, :-1], tokens[:, 1:]]
        return logp

    return score, calls


def with_recorded_logprobs(traj, table):
    """The trajectory as if sampled from `table`: recorded log-probs are the table's."""
    events = []
    for event in traj.events:
        if event.llm is not None:
            ctx = event.llm.context_ids
            n_in = event.llm.input_ids.shape[0]
            logp = table[ctx[n_in - 1 : -1], ctx[n_in:]].astype(np.float32)
            event = dataclasses.replace(
                event, llm=dataclasses.replace(event.llm, output_logprobs=logp)
            )
        events.append(event)
    return dataclasses.replace(traj, events=tuple(events))


def test_rescoring_under_the_same_policy_reproduces_the_record():
    table = bigram_table(0)
    trajs = [
        with_recorded_logprobs(agent_trajectory(f"t{i}", seed=i, turns=3), table) for i in range(3)
    ]
    score, calls = bigram_score_fn(table)
    reports = rescore(trajs, score, batch_rows=4, seq_bucket=32)
    assert len(calls) == 3 and all(shape[1] % 32 == 0 for shape in calls)  # 9 calls, 4 per batch
    for report in reports:
        assert [c.event_index for c in report.calls] == [0, 2, 4]
        summary = report.summary()
        assert summary["tokens"] == 12
        assert summary["mean_abs_log_ratio"] < 1e-5 and abs(summary["kl_k3"]) < 1e-6


def test_rescoring_under_another_policy_gives_its_log_probs():
    recorded, other = bigram_table(0), bigram_table(1)
    traj = with_recorded_logprobs(agent_trajectory("t", turns=2), recorded)
    (report,) = rescore([traj], bigram_score_fn(other)[0])
    for call in report.calls:
        llm = traj.events[call.event_index].llm
        ctx, n_in = llm.context_ids, llm.input_ids.shape[0]
        np.testing.assert_allclose(call.new_logp, other[ctx[n_in - 1 : -1], ctx[n_in:]], rtol=1e-6)
        np.testing.assert_allclose(call.log_ratio, call.new_logp - llm.output_logprobs, rtol=1e-6)
    assert report.summary()["kl_k3"] > 0.0


def test_non_replayable_calls_are_reported_not_rescored():
    traj = agent_trajectory("t", turns=2)
    first = dataclasses.replace(traj.events[0], replay=ReplayClass.NON_REPLAYABLE)
    traj = dataclasses.replace(traj, events=(first, *traj.events[1:]))
    (report,) = rescore([traj], bigram_score_fn(bigram_table(0))[0])
    assert [c.event_index for c in report.calls] == [2]
    assert [(s.event_index, s.reason) for s in report.skipped] == [
        (0, "recorded as non-replayable")
    ]


def test_rescore_rejects_a_score_fn_with_the_wrong_shape():
    with pytest.raises(ValueError, match="score_fn returned shape"):
        rescore([agent_trajectory("t")], lambda tokens: tokens[:, :-1])


class CounterEnv:
    """A deterministic text environment: reach the target count with 'inc' / 'dec'."""

    def __init__(self, target: int, noisy: bool = False):
        self.target, self.noisy, self.count = target, noisy, 0

    def reset(self):
        self.count = 0
        return "count 0", {}

    def step(self, command):
        self.count += {"inc": 1, "dec": -1}.get(command, 0) + (
            1 if self.noisy and self.count == 1 else 0
        )
        done = self.count == self.target
        return f"count {self.count}", float(done), done, {}


def counter_trajectory():
    base = agent_trajectory("ep", turns=1)
    llm = base.events[0]
    events = (
        llm,
        env_event("count 1", "inc"),
        Event(EventKind.MESSAGE, ReplayClass.NON_REPLAYABLE, observation="user: hurry up"),
        llm,
        env_event("count 2", "inc", reward=1.0),
        tool_event("notify", {"msg": "done"}, "sent"),
    )
    return dataclasses.replace(
        base, events=events, header=dataclasses.replace(base.header, task={"target": 2})
    )


def test_approximate_replay_matches_a_deterministic_environment():
    report = replay_episode(counter_trajectory(), lambda task: CounterEnv(task["target"]))
    assert [s.matched for s in report.steps] == [True, True]
    assert report.first_divergence is None
    assert report.recorded_return == report.replayed_return == 1.0
    assert [(s.event_index, s.reason) for s in report.skipped] == [
        (2, "recorded as non-replayable"),
        (5, "recorded as non-replayable"),
    ]


def test_approximate_replay_reports_where_a_changed_environment_diverges():
    report = replay_episode(
        counter_trajectory(), lambda task: CounterEnv(task["target"], noisy=True)
    )
    assert report.first_divergence == 4
    assert report.steps[1].replayed == "count 3" and report.replayed_return == 0.0


def test_tool_calls_replay_through_a_runner_when_replayable():
    traj = counter_trajectory()
    tool = dataclasses.replace(traj.events[5], replay=ReplayClass.APPROXIMATE)
    traj = dataclasses.replace(traj, events=(*traj.events[:5], tool))
    report = replay_episode(traj, lambda task: CounterEnv(2), tool_runner=lambda call: "sent")
    assert [(s.event_index, s.action, s.matched) for s in report.steps][-1] == (5, "notify", True)
    report = replay_episode(traj, lambda task: CounterEnv(2))
    assert (5, "no tool runner given") in [(s.event_index, s.reason) for s in report.skipped]


def test_rerun_lets_a_new_policy_act_from_the_recorded_task():
    def policy(observations):
        return "inc"

    rerun = rerun_episode(counter_trajectory(), lambda task: CounterEnv(task["target"]), policy)
    assert rerun.done and rerun.total_reward == 1.0 and rerun.commands == ("inc", "inc")
    lazy = rerun_episode(
        counter_trajectory(), lambda task: CounterEnv(2), lambda obs: "wait", max_steps=5
    )
    assert not lazy.done and len(lazy.commands) == 5 and lazy.total_reward == 0.0
