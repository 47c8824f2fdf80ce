"""Failure analysis over windows of real ATDP trajectories on disk: facts of each trajectory,
failure modes with counts, rates and examples, windows by time and version, bad input."""

from __future__ import annotations

import json
import time

import pytest
from control_windows import (
    expert_reply,
    llm_call,
    record_episode,
    refused_reply,
    task_spec,
    tool_episode,
    untagged_reply,
    wandering_reply,
    winnable_games,
)

from atdp_io import (
    Action,
    ActionKind,
    AtdpStore,
    Event,
    EventKind,
    Governance,
    Outcome,
    ReplayClass,
    Trajectory,
    TrajectoryHeader,
)
from serving.control.analysis import EmptyWindow, analyse
from serving.control.cli import main as control_cli
from serving.control.facts import facts, normalized
from serving.control.store import ControlError, InvalidTenant
from serving.control.window import UnknownTenant, WindowSpec, read_window


@pytest.fixture(scope="module")
def games():
    return winnable_games(6)


@pytest.fixture(scope="module")
def window(tmp_path_factory, games):
    """tenant "acme": 2 wins, 2 unparseable-reply losses, 1 wandering, 1 refused-command loss
    (version 1); 2 more wins under version 2; tenant "globex": 3 failed tool calls, 1 good."""
    root = tmp_path_factory.mktemp("atdp")
    store = AtdpStore.open(str(root))
    t0 = time.time()
    recorded = {
        "win": [record_episode(store, "acme", g, expert_reply, created_at=t0 + i)
                for i, g in enumerate(games[:2])],
        "format": [record_episode(store, "acme", g, untagged_reply, created_at=t0 + 10 + i)
                   for i, g in enumerate(games[2:4])],
        "wander": [record_episode(store, "acme", games[4], wandering_reply, created_at=t0 + 20)],
        "refused": [record_episode(store, "acme", games[5], refused_reply, created_at=t0 + 21)],
        "v2": [record_episode(store, "acme", g, expert_reply, version=2, created_at=t0 + 30 + i)
               for i, g in enumerate(games[:2])],
        "tools": [tool_episode(store, "globex", fails=True) for _ in range(3)]
        + [tool_episode(store, "globex", fails=False)],
    }  # fmt: skip
    return root, store, recorded, t0


def test_facts_read_the_gateway_recording(window):
    _, _, recorded, _ = window
    won = facts(recorded["win"][0])
    assert won.success and won.final_state == "success" and won.env == "alfworld"
    assert won.task_text and won.task_type and won.resettable and won.version == 1
    assert not won.format_errors and not won.refused and all(won.actions)
    malformed = facts(recorded["format"][0])
    assert malformed.final_state == "step_limit" and not malformed.success
    assert malformed.format_errors[0] == "no <action>...</action> block"
    assert len(malformed.format_errors) == malformed.steps == 12
    refused = facts(recorded["refused"][0])
    assert refused.refused[0] == ("fly to the moon", "Nothing happens.")
    assert len(refused.refused) == 11  # the last reply's feedback never reached a prompt
    tool = facts(recorded["tools"][0])
    assert tool.tool_errors == (("get_weather", "missing required argument 'city'"),)
    assert tool.tools["get_weather"]["description"] == "Get the weather."
    assert tool.env == "" and not tool.resettable


def test_failure_modes_have_counts_rates_and_examples(window):
    _, store, recorded, _ = window
    trajectories = read_window(store, WindowSpec("acme"))
    assert len(trajectories) == 8
    analysis = analyse(trajectories, window={"tenant": "acme"})
    assert (analysis.n, analysis.successes, analysis.failures) == (8, 4, 4)
    assert analysis.success_rate.value == 0.5 and analysis.success_rate.low < 0.5
    assert {v: (e.value, e.n) for v, e in analysis.by_version.items()} == {
        1: (2 / 6, 6), 2: (1.0, 2)
    }  # fmt: skip
    step_limit = analysis.mode("final_state:step_limit")
    assert step_limit.count == 4 and step_limit.share == 1.0
    fmt = analysis.mode("format:no <action>...</action> block")
    assert fmt.count == 2 and fmt.total == 2 and fmt.failure_rate.value == 1.0
    assert set(fmt.examples) == {t.trajectory_id for t in recorded["format"]}
    refused = analysis.mode("refused_action:Nothing happens.")
    assert refused.count == 1 and refused.detail == {"fly to the moon": 11}
    assert analysis.modes[0].count >= analysis.modes[-1].count  # most frequent first
    tenant = analysis.mode("tenant:acme")
    assert tenant.count == 4 and tenant.total == 8 and tenant.failure_rate.value == 0.5
    dominant = {m.id for m in analysis.dominant(min_share=0.5) if m.kind != "task_type"}
    assert dominant == {"final_state:step_limit", "format:no <action>...</action> block",
                        "tenant:acme"}  # fmt: skip
    for mode in analysis.dominant(min_share=0.5):  # a task type two of the failures share
        assert mode.kind != "task_type" or mode.count == 2
    out = analysis.to_json()
    assert json.loads(json.dumps(out))["modes"][0]["id"] == analysis.modes[0].id


def test_tool_failures_are_a_mode_of_their_own(window):
    _, store, _, _ = window
    analysis = analyse(read_window(store, WindowSpec("globex")))
    tool = analysis.mode("tool:get_weather")
    assert (tool.count, tool.total, tool.share) == (3, 3, 1.0)
    assert tool.detail == {normalized("missing required argument 'city'"): 3}


def test_windows_by_time_version_and_limit(window):
    _, store, recorded, t0 = window
    early = read_window(store, WindowSpec("acme", until=t0 + 15))
    assert [t.trajectory_id for t in early] == [
        t.trajectory_id for t in recorded["win"] + recorded["format"]
    ]
    v2 = read_window(store, WindowSpec("acme", versions=(2,)))
    assert {t.trajectory_id for t in v2} == {t.trajectory_id for t in recorded["v2"]}
    newest = read_window(store, WindowSpec("acme", limit=3))
    assert [t.trajectory_id for t in newest] == [
        t.trajectory_id for t in recorded["refused"] + recorded["v2"]
    ]


def test_bad_windows_are_refused_with_clear_errors(window):
    _, store, _, t0 = window
    with pytest.raises(UnknownTenant, match="tenant 'initech' has no recorded trajectories"):
        read_window(store, WindowSpec("initech"))
    empty = read_window(store, WindowSpec("acme", since=t0 + 1000))
    assert empty == []
    with pytest.raises(EmptyWindow, match="holds no trajectory"):
        analyse(empty, window={"tenant": "acme"})
    with pytest.raises(InvalidTenant):
        WindowSpec("bad tenant!")
    with pytest.raises(ControlError, match="until"):
        WindowSpec("acme", since=5.0, until=1.0)
    with pytest.raises(ControlError, match="limit"):
        WindowSpec("acme", limit=0)


def test_cli_analyse_prints_the_modes(window, capsys):
    root, _, _, _ = window
    assert control_cli(["analyse", "acme", "--buffer", str(root)]) == 0
    out = capsys.readouterr().out
    assert "8 trajectories, 4 successes" in out
    assert "format:no <action>...</action> block" in out and "final_state:step_limit" in out
    assert control_cli(["analyse", "acme", "--buffer", str(root), "--versions", "2", "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["trajectories"] == 2 and parsed["failures"] == 0
    assert control_cli(["analyse", "initech", "--buffer", str(root)]) == 1
    assert "no recorded trajectories" in capsys.readouterr().err


def test_facts_read_the_rollout_engines_env_steps():
    """The rollout records each turn as an llm_call (the parsed command) and the env_step it
    caused, which says whether the reply parsed and the command was admissible."""

    def turn(command, result, observation):
        return [
            Event(EventKind.LLM_CALL, ReplayClass.DETERMINISTIC, observation="before",
                  action=Action(ActionKind.COMMAND, text=command), llm=llm_call(command or "x")),
            Event(EventKind.ENV_STEP, ReplayClass.DETERMINISTIC, observation=observation,
                  action=Action(ActionKind.COMMAND, text=command), result=result,
                  error_class="" if not result.get("invalid_reply") else "invalid_reply"),
        ]  # fmt: skip

    events = [
        *turn("", {"invalid_reply": True, "parse_error": "empty <action> block"}, "Nothing."),
        *turn("fly", {"admissible": False, "invalid_reply": False}, "Nothing happens."),
        *turn("look", {"admissible": True, "invalid_reply": False}, "You see a desk."),
    ]
    header = TrajectoryHeader(
        "rollout-episode", Governance.synthetic("lab", expires_at=None), 0.0,
        task={**task_spec(0), "max_steps": 3},
    )  # fmt: skip
    f = facts(Trajectory(header, tuple(events), Outcome(success=False)))
    assert f.format_errors == ("empty <action> block",)
    assert f.refused == (("fly", "Nothing happens."),)
    assert f.actions == ("", "fly", "look") and f.final_state == "step_limit"
    assert f.errors == () and f.version is None and f.resettable
