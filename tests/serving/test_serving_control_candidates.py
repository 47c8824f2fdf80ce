"""Candidates: patches applied to any composite, ids, JSON round trips, cost ranks."""

from __future__ import annotations

import pytest

from serving.control.candidates import (
    COST_RANK,
    Candidate,
    Patch,
    Provenance,
    noop,
)
from serving.control.composite import CompositeError, CompositeSpec

BASE = CompositeSpec.from_json(
    {
        "harness": {"system_prompt": "Agent.", "instructions": ["Be brief."]},
        "memory": {"notes": [{"id": "a", "text": "Old.", "keys": ["x"]}]},
    }
)


def test_a_patch_adds_to_the_composite_it_is_applied_to():
    patch = Patch(
        notes=(
            {"id": "a", "text": "New.", "keys": ["x"]},
            {"id": "b", "text": "B.", "keys": ["y"]},
        ),
        instructions=("Be brief.", "Use Celsius."),
        tool_descriptions={"get_weather": "Weather by city."},
    )
    spec = patch.apply(BASE)
    assert [(n.id, n.text) for n in spec.memory.notes] == [("a", "New."), ("b", "B.")]
    assert spec.harness.instructions == ("Be brief.", "Use Celsius.")  # appended once
    assert spec.harness.system_prompt == "Agent." and spec.policy == BASE.policy
    assert spec.harness.tool_descriptions == {"get_weather": "Weather by city."}
    assert Patch(system_prompt="").apply(BASE).harness.system_prompt == ""  # "" clears it
    with pytest.raises(CompositeError, match="system_mode"):
        Patch(system_mode="append").apply(BASE)


def test_candidates_round_trip_and_name_their_patch():
    candidate = Candidate(
        "harness",
        Patch(instructions=("Use Celsius.",)),
        Provenance("acme", "template:x", {"tenant": "acme"}, ("format:x",), ("t1",)),
        "why",
    )
    again = Candidate.from_json(candidate.to_json())
    assert again == candidate and again.id == candidate.id
    assert candidate.id.startswith("harness-") and candidate.cost_rank == 2
    other = Candidate("harness", Patch(instructions=("Use Kelvin.",)), candidate.provenance)
    assert other.id != candidate.id
    assert noop("acme").apply_to(BASE) == BASE and noop("acme").cost_rank == 0
    assert COST_RANK["memory"] < COST_RANK["harness"] < COST_RANK["policy"]
