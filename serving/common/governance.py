"""Governance of served traffic as JSON (tenant defaults) <-> `atdp_io.Governance`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from atdp_io import Classification, ConsentStatus, Governance, LegalBasis, ReviewStatus, SchemaError


def _enum(enum: type, data: Mapping[str, Any], field: str, default: str | None = None):
    value = data.get(field, default)
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(m.value for m in enum)
        raise SchemaError(f"governance.{field}: expected one of {choices}, got {value!r}") from None


def governance_from_json(tenant: str, data: Mapping[str, Any]) -> Governance:
    """Governance from JSON fields (classification, legal_basis, consent, training_eligible,
    human_review, expires_at); raises `SchemaError` naming the field."""
    return Governance(
        tenant=tenant,
        classification=_enum(Classification, data, "classification"),
        legal_basis=_enum(LegalBasis, data, "legal_basis"),
        consent=_enum(ConsentStatus, data, "consent", ConsentStatus.NOT_APPLICABLE.value),
        expires_at=data.get("expires_at"),
        training_eligible=data.get("training_eligible"),
        human_review=_enum(ReviewStatus, data, "human_review", ReviewStatus.NOT_REQUIRED.value),
    )
