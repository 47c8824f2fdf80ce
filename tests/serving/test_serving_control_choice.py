"""Surface choice on synthetic failure windows: real ALFWorld episodes written as ATDP
trajectories into a real store, a whole round of the control plane (analysis, proposals by the
rule-based SEED analyzer and templates, the replay gate playing the recorded games again, the
choice rule, promotion), and a planted format-breaking edit refused by the gate."""

from __future__ import annotations

import pytest
from control_windows import (
    ContextAgent,
    expert_reply,
    record_episode,
    refused_reply,
    tool_episode,
    untagged_reply,
    wandering_reply,
    winnable_games,
)

from atdp_io import AtdpStore
from sao_jax.seed.analyzers import RuleBasedAlfworldAnalyzer
from serving.common.errors import ApiError
from serving.control.canary import CanaryBook
from serving.control.candidates import Candidate, Patch, Provenance
from serving.control.choice import choose, recommend
from serving.control.composite import PolicyRef
from serving.control.deploy import finish_canary, start_canary
from serving.control.gate import gate
from serving.control.plane import ControlPlane
from serving.control.proposers import REPLY_FORMAT, propose
from serving.control.store import CompositeStore
from serving.control.window import WindowSpec


@pytest.fixture(scope="module")
def games():
    return winnable_games(8)


@pytest.fixture
def plane(tmp_path):
    atdp = AtdpStore.open(str(tmp_path / "atdp"))
    store = CompositeStore(tmp_path / "composites")
    return ControlPlane(store, atdp, canaries=CanaryBook(store))


def _by_surface(result):
    return {r.candidate.surface: r for r in result.results}


def test_format_failures_choose_a_harness_edit(plane, games):
    for g in games[:4]:
        record_episode(plane.atdp, "fmt", g, untagged_reply)
    for g in games[4:6]:
        record_episode(plane.atdp, "fmt", g, expert_reply)
    # the model knows every game but forgets the reply format unless told
    agent = ContextAgent(games, knows="all", needs_format=True)
    result = plane.run_round(
        "fmt", [WindowSpec("fmt")], analyzer=RuleBasedAlfworldAnalyzer(), agent=agent
    )
    assert "harness" in result.decision.recommended
    assert result.decision.recommended["harness"] == ["format:no <action>...</action> block"]
    results = _by_surface(result)
    assert results["memory"].verdict == "inconclusive"  # notes do not fix the format
    harness = results["harness"]
    assert harness.verdict == "pass"
    (replay,) = harness.evidence
    assert (replay.baseline.value, replay.candidate.value) == (0.0, 1.0)
    assert result.decision.surface == "harness" and result.shipped.version == 1
    (instruction,) = result.shipped.spec.harness.instructions
    assert instruction.startswith(REPLY_FORMAT.split("{")[0]) and "<action>" in instruction
    events = [e["event"] for e in plane.audit.entries("fmt")]
    assert events[0] == "analysis" and events[-2:] == ["decision", "promote"]
    assert events.count("gate") == len(result.candidates)


def test_missing_facts_choose_memory_notes(plane, games):
    for g in games[:3]:
        for _ in range(2):
            record_episode(plane.atdp, "facts", g, wandering_reply)
    for g in games[3:5]:
        record_episode(plane.atdp, "facts", g, expert_reply)
    # the model knows a game only when a retrieved memory note names its task
    agent = ContextAgent(games, knows="notes")
    result = plane.run_round(
        "facts", [WindowSpec("facts")], analyzer=RuleBasedAlfworldAnalyzer(), agent=agent
    )
    assert set(result.decision.recommended) == {"memory", "skill"}
    assert "harness" not in _by_surface(result)  # no format or refusal failures to template
    memory = _by_surface(result)["memory"]
    assert memory.passed and memory.evidence[0].candidate.value == 3 / 5
    assert result.decision.surface == "memory"
    notes = result.shipped.spec.memory.notes
    assert len(notes) == 3 and all(n.created_from for n in notes)
    assert result.shipped.reason.startswith("memory ")


def test_refused_commands_of_a_model_that_means_well_choose_replies_kept_to_the_list(plane, games):
    for g in games[:3]:
        record_episode(plane.atdp, "drift", g, refused_reply)
    for g in games[3:5]:
        record_episode(plane.atdp, "drift", g, expert_reply)
    # the model means the right command but says a word too many, which the game refuses;
    # an instruction does not help it, a reply kept to the listed actions does
    agent = ContextAgent(games, knows="all", drifts=True)
    result = plane.run_round(
        "drift", [WindowSpec("drift")], analyzer=RuleBasedAlfworldAnalyzer(), agent=agent
    )
    harness = [r for r in result.results if r.candidate.surface == "harness"]
    by_template = {r.candidate.provenance.analyzer: r for r in harness}
    assert set(by_template) == {"template:admissible_only", "template:admissible_choices"}
    assert by_template["template:admissible_only"].verdict == "inconclusive"
    kept = by_template["template:admissible_choices"]
    assert kept.verdict == "pass"
    (replay,) = kept.evidence
    assert (replay.baseline.value, replay.candidate.value) == (0.0, 1.0)
    assert result.decision.chosen.candidate == kept.candidate
    choices = result.shipped.spec.harness.reply_choices
    assert choices is not None and choices.template == "<action>{choice}</action>"
    # the next round does not propose the same choices again
    again = plane.propose(
        "drift", *plane.analyse("drift", [WindowSpec("drift")]),
        analyzer=RuleBasedAlfworldAnalyzer(),
    )  # fmt: skip
    assert "template:admissible_choices" not in {c.provenance.analyzer for c in again}


def test_a_candidate_the_model_cannot_be_served_under_is_refused_and_the_round_goes_on(
    plane, games
):
    for g in games[:3]:
        record_episode(plane.atdp, "nogrammar", g, refused_reply)
    record_episode(plane.atdp, "nogrammar", games[3], expert_reply)
    model = ContextAgent(games, knows="all", drifts=True)

    def agent(messages, policy, choices=None):  # a model whose tokenizer takes no grammar
        if choices is not None:
            raise ApiError(400, "cannot compile the output constraint: no decoder")
        return model(messages, policy)

    result = plane.run_round(
        "nogrammar", [WindowSpec("nogrammar")], analyzer=RuleBasedAlfworldAnalyzer(), agent=agent
    )
    by_template = {r.candidate.provenance.analyzer: r for r in result.results}
    refused = by_template["template:admissible_choices"]
    assert refused.verdict == "refuse" and refused.evidence == ()
    assert refused.reasons == (
        "cannot be served: cannot compile the output constraint: no decoder",
    )
    assert by_template["template:admissible_only"].verdict == "inconclusive"  # still judged
    assert result.decision.action == "noop"


def test_the_same_failure_across_tenants_chooses_a_policy_update(plane, games):
    for tenant, offset in (("north", 0), ("south", 3)):
        for g in games[offset : offset + 3]:
            record_episode(plane.atdp, tenant, g, refused_reply)
        record_episode(plane.atdp, tenant, games[6], expert_reply)

    def train_fn(trajectories, policy):
        assert {t.header.governance.tenant for t in trajectories} == {"north"}
        return PolicyRef("trained-1", "/ckpt/trained-1")

    # only the trained weights stop proposing commands the game refuses
    agent = ContextAgent(games, knows={"trained-1"}, refuses=True)
    windows = [WindowSpec("north"), WindowSpec("south")]
    analysis, trajectories = plane.analyse("north", windows)
    refused = analysis.mode("refused_action:Nothing happens.")
    assert refused.tenants == ("north", "south") and len(refused.task_types) >= 2
    assert {"harness", "policy"} <= set(recommend(analysis))
    candidates = plane.propose(
        "north", analysis, trajectories, analyzer=RuleBasedAlfworldAnalyzer(), train_fn=train_fn
    )
    assert {c.surface for c in candidates} >= {"noop", "memory", "harness", "policy"}
    assert all(c.provenance.tenant == "north" for c in candidates)
    results = plane.gate("north", candidates, trajectories, agent=agent)
    verdicts = {r.candidate.surface: r.verdict for r in results}
    assert verdicts["harness"] == "inconclusive" and verdicts["policy"] == "pass"
    decision = plane.choose("north", analysis, results)
    assert decision.surface == "policy"
    shipped = plane.ship("north", decision)
    assert shipped.spec.policy == PolicyRef("trained-1", "/ckpt/trained-1")
    assert plane.store.current("south").version == 0  # the other tenant is untouched


def test_tool_failures_choose_a_tool_schema_edit_on_canary_evidence(plane):
    plane.store.put("tools", {}, reason="the deployment before the window")
    for fails in (True, True, True, True, False, False):
        tool_episode(plane.atdp, "tools", fails=fails, version=1)
    analysis, trajectories = plane.analyse("tools", [WindowSpec("tools")])
    assert recommend(analysis)["tool_schema"] == ["tool:get_weather"]
    (candidate,) = [c for c in propose(analysis, plane.store.current("tools"))
                    if c.surface == "tool_schema"]  # fmt: skip
    description = candidate.patch.tool_descriptions["get_weather"]
    assert description.startswith("Get the weather. Call it with a JSON object")
    assert "city (string, required)" in description
    schema = candidate.patch.tool_schemas["get_weather"]
    assert schema["parameters"]["additionalProperties"] is False
    offline = plane.gate("tools", [candidate], trajectories)[0]
    assert offline.verdict == "inconclusive"  # nothing to replay: it needs live traffic
    canary = start_canary(plane.store, plane.canaries, "tools", candidate, share=0.5)
    assert (canary.version, canary.baseline) == (2, 1)
    for i in range(12):  # live sessions of both arms, attributed by the version that served
        tool_episode(plane.atdp, "tools", fails=i >= 10, version=2)
        tool_episode(plane.atdp, "tools", fails=i >= 3, version=1)
    judged = plane.judge_canary("tools", candidate)
    (evidence,) = judged.evidence
    assert evidence.method == "canary" and evidence.verdict == "better" and judged.passed
    assert (evidence.candidate.n, evidence.baseline.n) == (12, 18)
    decision = choose(analysis, [judged], tenant="tools")
    assert decision.surface == "tool_schema"
    serving = finish_canary(plane.store, plane.canaries, "tools", keep=True)
    assert serving.version == 2 and plane.canaries.get("tools") is None


def test_a_planted_format_breaking_edit_is_refused(plane, games):
    for g in games[:4]:
        record_episode(plane.atdp, "good", g, expert_reply)
    record_episode(plane.atdp, "good", games[4], wandering_reply)
    planted = Candidate(
        "harness",
        Patch(instructions=("Reply with the bare action, without tags.",)),
        Provenance("good", "planted"),
        "planted: breaks the reply format",
    )
    agent = ContextAgent(games, knows="all")
    result = plane.run_round("good", [WindowSpec("good")], agent=agent, extra=[planted])
    verdict = {r.candidate.id: r for r in result.results}[planted.id]
    assert verdict.verdict == "refuse"
    (replay,) = verdict.evidence
    assert replay.verdict == "worse" and replay.baseline.value == 1.0
    assert replay.candidate.value == 0.0 and replay.delta.high < 0
    assert planted.id in result.decision.refused and result.decision.action == "noop"
    assert plane.store.current("good").version == 0  # nothing shipped
    logged = [e for e in plane.audit.entries("good", "gate") if e["candidate"]["id"] == planted.id]
    assert logged[0]["verdict"] == "refuse" and logged[0]["evidence"][0]["verdict"] == "worse"


def test_the_gate_refuses_a_patch_the_store_would_reject(plane):
    bad = Candidate(
        "tool_schema",
        Patch(tool_schemas={"get_weather": {"version": "v2", "parameters": {"type": "string"}}}),
        Provenance("acme", "planted"),
    )
    result = gate(bad, plane.store.current("acme"))
    assert result.verdict == "refuse" and result.spec is None
    assert "invalid patch" in result.reasons[0] and '"type": "object"' in result.reasons[0]
