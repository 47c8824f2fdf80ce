"""Governance rules: eligibility reasons, late governance updates, trajectory redaction status."""

import dataclasses

import pytest
from atdp_factories import NOW

from atdp_io import (
    Classification,
    ConsentStatus,
    EligibilityPolicy,
    Governance,
    GovernanceUpdate,
    LegalBasis,
    RedactionStatus,
    ReviewStatus,
)
from atdp_io.governance import apply_updates, combine_redaction, ineligibility_reason

BASE = Governance(
    tenant="acme",
    classification=Classification.CONFIDENTIAL,
    legal_basis=LegalBasis.CONSENT,
    consent=ConsentStatus.GRANTED,
    expires_at=NOW + 10,
    training_eligible=True,
)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({}, None),
        ({"training_eligible": False}, "not_training_eligible"),
        ({"legal_basis": LegalBasis.NONE, "consent": ConsentStatus.NOT_APPLICABLE}, "legal_basis"),
        ({"consent": ConsentStatus.WITHDRAWN}, "consent"),
        ({"consent": ConsentStatus.DENIED}, "consent"),
        ({"legal_basis": LegalBasis.CONTRACT, "consent": ConsentStatus.WITHDRAWN}, "consent"),
        ({"legal_basis": LegalBasis.CONTRACT, "consent": ConsentStatus.NOT_APPLICABLE}, None),
        ({"expires_at": NOW}, "expired"),
        ({"expires_at": None}, None),
        ({"classification": Classification.RESTRICTED}, "classification"),
        ({"human_review": ReviewStatus.PENDING}, "human_review"),
        ({"human_review": ReviewStatus.REJECTED}, "human_review"),
        ({"human_review": ReviewStatus.APPROVED}, None),
    ],
)
def test_ineligibility_reasons(changes, reason):
    governance = dataclasses.replace(BASE, **changes)
    assert (
        ineligibility_reason(governance, RedactionStatus.CLEAN, NOW, EligibilityPolicy()) == reason
    )


def test_policy_can_demand_review_and_token_scans():
    strict = EligibilityPolicy(
        require_review_approved=True,
        allowed_redaction=frozenset({RedactionStatus.CLEAN, RedactionStatus.REDACTED}),
    )
    assert ineligibility_reason(BASE, RedactionStatus.CLEAN, NOW, strict) == "human_review"
    approved = dataclasses.replace(BASE, human_review=ReviewStatus.APPROVED)
    assert ineligibility_reason(approved, RedactionStatus.CLEAN, NOW, strict) is None
    assert ineligibility_reason(approved, RedactionStatus.TEXT_ONLY, NOW, strict) == "redaction"


def test_updates_fold_in_order_and_leave_unset_fields():
    updates = [
        GovernanceUpdate("t", NOW, "review", human_review=ReviewStatus.APPROVED),
        GovernanceUpdate("t", NOW, "user withdrew", consent=ConsentStatus.WITHDRAWN),
        GovernanceUpdate("t", NOW, "shorter retention", expires_at=NOW + 1),
    ]
    folded = apply_updates(BASE, updates)
    assert folded.human_review == ReviewStatus.APPROVED
    assert folded.consent == ConsentStatus.WITHDRAWN
    assert folded.expires_at == NOW + 1
    assert folded.classification == BASE.classification and folded.tenant == "acme"


def test_a_trajectory_is_as_weakly_redacted_as_its_weakest_record():
    clean, red, text = RedactionStatus.CLEAN, RedactionStatus.REDACTED, RedactionStatus.TEXT_ONLY
    assert combine_redaction([clean, clean]) == clean
    assert combine_redaction([clean, red]) == red
    assert combine_redaction([red, text, clean]) == text
    assert combine_redaction([]) == RedactionStatus.UNSCANNED
