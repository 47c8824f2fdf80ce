"""Schema validation (errors name the field) and the JSON codec (strict, lossless)."""

import dataclasses
import json
import re

import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory, llm_event, tool_event

from atdp_io import (
    Action,
    ActionKind,
    Classification,
    ConsentStatus,
    Critique,
    DecodingParams,
    Event,
    EventKind,
    Governance,
    GovernanceUpdate,
    LateReward,
    LegalBasis,
    LLMCall,
    ReplayClass,
    ReviewStatus,
    Reward,
    SchemaError,
    ToolCall,
    TrajectoryHeader,
    VerdictUpdate,
    codec,
)
from atdp_io.schema import Verdict


def _llm(**overrides):
    fields = dict(
        model_id="m",
        policy_version=3,
        input_ids=[5, 6, 7],
        output_ids=[8, 9],
        output_logprobs=[-0.1, -0.2],
    )
    fields.update(overrides)
    return LLMCall(**fields)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"output_logprobs": [-0.1]}, "llm.output_logprobs"),
        ({"output_logprobs": [-0.1, 0.5]}, "llm.output_logprobs"),
        ({"output_logprobs": [-0.1, float("nan")]}, "llm.output_logprobs"),
        ({"input_ids": []}, "llm.input_ids"),
        ({"input_ids": [1.5, 2.0]}, "llm.input_ids"),
        ({"output_ids": [8, -1]}, "llm.output_ids"),
        ({"policy_version": -1}, "llm.policy_version"),
        ({"model_id": ""}, "llm.model_id"),
        ({"loss_mask": [1, 2]}, "llm.loss_mask"),
        ({"output_versions": [1]}, "llm.output_versions"),
        ({"decoding": "greedy"}, "llm.decoding"),
        ({"tools": ["not a schema"]}, "llm.tools[0]"),
    ],
)
def test_llm_call_validation_names_the_field(overrides, field):
    with pytest.raises(SchemaError, match="^" + re.escape(field) + ":"):
        _llm(**overrides)


def test_llm_call_defaults_versions_and_mask_from_policy_version():
    call = _llm()
    np.testing.assert_array_equal(call.output_versions, [3, 3])
    np.testing.assert_array_equal(call.loss_mask, [1, 1])
    np.testing.assert_array_equal(call.context_ids, [5, 6, 7, 8, 9])
    assert call.input_ids.dtype == np.int32 and call.output_logprobs.dtype == np.float32


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: DecodingParams(top_p=0.0), "decoding.top_p"),
        (lambda: DecodingParams(temperature=-1.0), "decoding.temperature"),
        (lambda: DecodingParams(max_tokens=0), "decoding.max_tokens"),
        (lambda: Reward(float("inf")), "reward.value"),
        (lambda: Action(ActionKind.TOOL_CALLS), "action.tool_calls"),
        (lambda: Action(ActionKind.MESSAGE, tool_calls=(ToolCall("f", {}),)), "action.tool_calls"),
        (lambda: ToolCall("f", ["a"]), "tool_call[f].arguments"),
        (lambda: Event(EventKind.LLM_CALL, ReplayClass.DETERMINISTIC), "event.llm"),
        (
            lambda: Event(EventKind.ENV_STEP, ReplayClass.APPROXIMATE, llm=_llm()),
            "event.llm",
        ),
        (lambda: Event(EventKind.TOOL_CALL, ReplayClass.APPROXIMATE), "event.action"),
        (lambda: Event("llm_call", ReplayClass.DETERMINISTIC), "event.kind"),
        (
            lambda: Governance(
                "a/b",
                Classification.PUBLIC,
                LegalBasis.SYNTHETIC,
                ConsentStatus.NOT_APPLICABLE,
                None,
                True,
            ),
            "governance.tenant",
        ),
        (
            lambda: Governance(
                "acme",
                Classification.PUBLIC,
                LegalBasis.CONSENT,
                ConsentStatus.NOT_APPLICABLE,
                None,
                True,
            ),
            "governance.consent",
        ),
        (
            lambda: Governance(
                "acme", "secret", LegalBasis.SYNTHETIC, ConsentStatus.NOT_APPLICABLE, None, True
            ),
            "governance.classification",
        ),
        (
            lambda: TrajectoryHeader("", Governance.synthetic("acme", expires_at=None), NOW),
            "header.trajectory_id",
        ),
        (
            lambda: TrajectoryHeader(
                "t", Governance.synthetic("acme", expires_at=None), NOW, schema_version=99
            ),
            "header.schema_version",
        ),
        (lambda: LateReward("t", -1, Reward(1.0), NOW), "late_reward.event_index"),
        (lambda: VerdictUpdate("t", 0, "fine", NOW), "verdict_update.verdict"),
        (lambda: Critique("t", None, "", "ann", NOW), "critique.text"),
        (lambda: GovernanceUpdate("t", NOW, "noop"), "governance_update"),
    ],
)
def test_record_validation_names_the_field(build, field):
    with pytest.raises(SchemaError) as info:
        build()
    assert str(info.value).startswith(field + ":") or str(info.value).startswith(field + " ")


def _assert_events_equal(a: Event, b: Event):
    assert codec.event_to_json(a) == codec.event_to_json(b)
    assert (a.llm is None) == (b.llm is None)
    if a.llm is not None:
        for name in ("input_ids", "output_ids", "output_logprobs", "output_versions", "loss_mask"):
            np.testing.assert_array_equal(getattr(a.llm, name), getattr(b.llm, name))
            assert getattr(a.llm, name).dtype == getattr(b.llm, name).dtype


def test_export_roundtrip_is_lossless_through_json_text():
    traj = agent_trajectory("t1", turns=2)
    traj = dataclasses.replace(
        traj,
        events=(*traj.events, tool_event("search", {"q": "mug", "k": 3}, {"hits": ["a", "b"]})),
        annotations=(
            LateReward("t1", 1, Reward(0.5, "user"), NOW),
            VerdictUpdate("t1", 4, Verdict.CONTRADICTED, NOW, note="wrong"),
            GovernanceUpdate("t1", NOW, "review", human_review=ReviewStatus.APPROVED),
        ),
    )
    text = json.dumps(codec.trajectory_to_export(traj))
    back = codec.trajectory_from_export(json.loads(text))
    assert codec.to_json(back.header) == codec.to_json(traj.header)
    assert codec.to_json(back.outcome) == codec.to_json(traj.outcome)
    assert [codec.annotation_to_json(a) for a in back.annotations] == [
        codec.annotation_to_json(a) for a in traj.annotations
    ]
    assert len(back.events) == len(traj.events)
    for a, b in zip(back.events, traj.events, strict=True):
        _assert_events_equal(a, b)


def test_decoding_rejects_unknown_fields_and_wrong_types_with_the_path():
    event = codec.event_to_json(tool_event("f", {"x": 1}, "ok"))
    with pytest.raises(SchemaError, match=r"event: unknown field\(s\) \['surprise'\]"):
        codec.event_from_json({**event, "surprise": 1}, None)
    bad = json.loads(json.dumps(event))
    bad["action"]["tool_calls"][0]["name"] = 7
    with pytest.raises(SchemaError, match=r"event\.action\.tool_calls\[0\]\.name: expected str"):
        codec.event_from_json(bad, None)
    bad = json.loads(json.dumps(event))
    bad["replay"] = "sometimes"
    with pytest.raises(SchemaError, match=r"event\.replay: 'sometimes' is not one of"):
        codec.event_from_json(bad, None)
    llm = codec.event_to_json(llm_event([1, 2], [3]))
    with pytest.raises(SchemaError, match="token streams and call metadata must come together"):
        codec.event_from_json(llm, None)


def test_non_json_values_are_rejected_with_their_path():
    event = tool_event("f", {"when": object()}, None)
    with pytest.raises(SchemaError, match=r"action\.tool_calls\[0\]\.arguments\.when: object"):
        codec.to_json(event)
    event = tool_event("f", {"x": float("nan")}, None)
    with pytest.raises(SchemaError, match="must be finite"):
        codec.to_json(event)
