"""Governance enforcement: the effective governance of a trajectory and whether it may train.

Governance is written once with the header; later changes (a review decision, a consent
withdrawal, a shorter retention) are appended as `GovernanceUpdate` annotations and folded in
here in commit order. The loader asks `ineligibility_reason` for every trajectory it would emit,
at read time, so an expiry that passed or a consent withdrawn after writing takes effect at once.

`refusal_reason` is the one rule every content reader applies (see reader.py), by purpose:
- `training`: the whole `EligibilityPolicy` (`ineligibility_reason`).
- `export` (data leaving the store): expired, or consent denied / withdrawn.
- `operator_review`: nothing refused; only operators get such a reader, each read of a
  trajectory another purpose would refuse is audited.
- any other purpose (serving a session back, a custom grant): expired.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from atdp_io.schema import (
    Classification,
    ConsentStatus,
    Governance,
    GovernanceUpdate,
    LegalBasis,
    RedactionStatus,
    ReviewStatus,
)

TRAINING = "training"
EXPORT = "export"
OPERATOR_REVIEW = "operator_review"
TRAINING_PURPOSES = frozenset({TRAINING})
LEAVING_PURPOSES = frozenset({EXPORT})

# Ordered from weakest to strongest guarantee; a trajectory is as weak as its weakest record.
_REDACTION_RANK = {
    RedactionStatus.UNSCANNED: 0,
    RedactionStatus.TEXT_ONLY: 1,
    RedactionStatus.REDACTED: 2,
    RedactionStatus.CLEAN: 3,
}


@dataclasses.dataclass(frozen=True)
class EligibilityPolicy:
    """What a training job accepts.

    `require_review_approved`: only trajectories a human approved (otherwise anything not
    rejected and not pending). `allowed_redaction`: drop `TEXT_ONLY` for tenants whose prompts may
    hold personal data and whose writers have no tokenizer.
    """

    allowed_classifications: frozenset[Classification] = frozenset(
        {Classification.PUBLIC, Classification.INTERNAL, Classification.CONFIDENTIAL}
    )
    require_review_approved: bool = False
    allowed_redaction: frozenset[RedactionStatus] = frozenset(
        {RedactionStatus.CLEAN, RedactionStatus.REDACTED, RedactionStatus.TEXT_ONLY}
    )


def apply_updates(governance: Governance, updates: Iterable[GovernanceUpdate]) -> Governance:
    """Folds governance updates (in commit order) into the header's governance."""
    for update in updates:
        changes = {
            field: getattr(update, field)
            for field in ("human_review", "consent", "training_eligible", "classification")
            if getattr(update, field) is not None
        }
        if update.expires_at is not None:
            changes["expires_at"] = update.expires_at
        governance = dataclasses.replace(governance, **changes)
    return governance


def combine_redaction(statuses: Iterable[RedactionStatus]) -> RedactionStatus:
    """The redaction status of a whole trajectory from those of its records."""
    statuses = list(statuses)
    if not statuses:
        return RedactionStatus.UNSCANNED
    weakest = min(statuses, key=_REDACTION_RANK.__getitem__)
    if weakest == RedactionStatus.CLEAN and RedactionStatus.REDACTED in statuses:
        return RedactionStatus.REDACTED
    return weakest


def is_expired(governance: Governance, now: float) -> bool:
    return governance.expires_at is not None and governance.expires_at <= now


def ineligibility_reason(
    governance: Governance,
    redaction: RedactionStatus,
    now: float,
    policy: EligibilityPolicy,
) -> str | None:
    """None when the trajectory may reach a training batch, else a short reason code.

    Reason codes: `not_training_eligible`, `legal_basis`, `consent`, `expired`, `classification`,
    `human_review`, `redaction`.
    """
    if not governance.training_eligible:
        return "not_training_eligible"
    if governance.legal_basis == LegalBasis.NONE:
        return "legal_basis"
    if governance.consent in (ConsentStatus.DENIED, ConsentStatus.WITHDRAWN):
        return "consent"
    if governance.legal_basis == LegalBasis.CONSENT and governance.consent != ConsentStatus.GRANTED:
        return "consent"
    if is_expired(governance, now):
        return "expired"
    if governance.classification not in policy.allowed_classifications:
        return "classification"
    review = governance.human_review
    if review in (ReviewStatus.REJECTED, ReviewStatus.PENDING):
        return "human_review"
    if policy.require_review_approved and review != ReviewStatus.APPROVED:
        return "human_review"
    if redaction not in policy.allowed_redaction:
        return "redaction"
    return None


class IneligibleTrajectoryError(PermissionError):
    """A read asked for trajectories its purpose may not serve; nothing was read.

    `reasons` maps each refused trajectory id to its reason code (see `ineligibility_reason`).
    """

    def __init__(self, tenant: str, purpose: str, reasons: dict[str, str]):
        self.tenant, self.purpose, self.reasons = tenant, purpose, dict(reasons)
        listed = ", ".join(f"{k!r} ({v})" for k, v in list(self.reasons.items())[:8])
        more = f" and {len(self.reasons) - 8} more" if len(self.reasons) > 8 else ""
        super().__init__(
            f"{len(self.reasons)} trajectories of {tenant!r} may not be read for {purpose!r}: "
            f"{listed}{more} (operators: purpose {OPERATOR_REVIEW!r}, audited)"
        )


def refusal_reason(
    purpose: str,
    governance: Governance,
    redaction: RedactionStatus,
    now: float,
    policy: EligibilityPolicy,
) -> str | None:
    """None when a reader for `purpose` may serve the trajectory's content, else a reason."""
    if purpose == OPERATOR_REVIEW:
        return None
    if purpose in TRAINING_PURPOSES:
        return ineligibility_reason(governance, redaction, now, policy)
    if is_expired(governance, now):
        return "expired"
    if purpose in LEAVING_PURPOSES and governance.consent in (
        ConsentStatus.DENIED,
        ConsentStatus.WITHDRAWN,
    ):
        return "consent"
    return None
