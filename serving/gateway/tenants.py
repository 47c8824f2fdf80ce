"""Tenants: API keys and the governance defaults of the data their sessions produce.

A tenants file (JSON) maps each tenant to its keys (plain or as sha256 hex digests) and the
governance every trajectory of the tenant is written with:

    {"tenants": {"acme": {"api_keys": ["sk-acme-..."],
                          "api_key_sha256": ["9f86d0..."],
                          "classification": "confidential",
                          "legal_basis": "contract",
                          "consent": "not_applicable",
                          "training_eligible": true,
                          "retention_days": 30,
                          "human_review": "not_required"}}}

Without a file the gateway runs "open": any valid tenant name can be given at session start
(admin key only) and gets `DEFAULT_GOVERNANCE`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from atdp_io import SchemaError
from atdp_io.schema import check_tenant_id
from serving.common.config_files import read_json_file
from serving.common.errors import ApiError
from serving.common.governance import governance_from_json
from serving.common.http import key_digest

DEFAULT_GOVERNANCE: dict[str, Any] = {
    "classification": "internal",
    "legal_basis": "legitimate_interest",
    "consent": "not_applicable",
    "training_eligible": True,
    "retention_days": None,
    "human_review": "not_required",
}
_GOVERNANCE_FIELDS = set(DEFAULT_GOVERNANCE)


@dataclasses.dataclass(frozen=True)
class Tenant:
    name: str
    governance: dict[str, Any]

    def governance_at(self, now: float) -> dict[str, Any]:
        """Governance JSON for a trajectory started at `now` (retention -> expires_at)."""
        data = {k: v for k, v in self.governance.items() if k != "retention_days"}
        days = self.governance.get("retention_days")
        data["expires_at"] = None if days is None else now + float(days) * 86400.0
        return data


class TenantDirectory:
    """Tenant keys (as digests) -> tenants, and each tenant's governance defaults."""

    def __init__(self, tenants: dict[str, Tenant], key_digests: dict[str, str], open_mode: bool):
        self.tenants = tenants
        self._by_digest = key_digests
        self.open_mode = open_mode

    @classmethod
    def open(cls) -> TenantDirectory:
        return cls({}, {}, open_mode=True)

    @classmethod
    def from_file(cls, path: str | Path) -> TenantDirectory:
        path = Path(path)
        data = read_json_file(path, "tenants")
        entries = data.get("tenants") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or not entries:
            raise ValueError(f"{path}: expected {{'tenants': {{name: {{...}}}}}} with at least one")
        tenants, digests = {}, {}
        for name, entry in entries.items():
            where = f"{path}: tenant {name!r}"
            try:
                check_tenant_id(name)
            except SchemaError as error:
                raise ValueError(f"{where}: {error}") from None
            if not isinstance(entry, dict):
                raise ValueError(f"{where}: expected an object")
            unknown = set(entry) - _GOVERNANCE_FIELDS - {"api_keys", "api_key_sha256"}
            if unknown:
                raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
            keys = [key_digest(k) for k in _strings(entry, "api_keys", where)]
            keys += [d.lower() for d in _strings(entry, "api_key_sha256", where)]
            if not keys:
                raise ValueError(f"{where}: needs 'api_keys' or 'api_key_sha256'")
            governance = {
                **DEFAULT_GOVERNANCE,
                **{k: v for k, v in entry.items() if k in _GOVERNANCE_FIELDS},
            }
            _validate_governance(name, governance, where)
            tenants[name] = Tenant(name, governance)
            for digest in keys:
                if digests.setdefault(digest, name) != name:
                    raise ValueError(
                        f"{where}: an API key is shared with tenant {digests[digest]!r}"
                    )
        return cls(tenants, digests, open_mode=False)

    def tenant_for_key(self, key: str) -> Tenant | None:
        name = self._by_digest.get(key_digest(key))
        return None if name is None else self.tenants[name]

    def tenant(self, name: str) -> Tenant:
        """The tenant `name` (in open mode any valid name, with default governance)."""
        if name in self.tenants:
            return self.tenants[name]
        if self.open_mode:
            try:
                check_tenant_id(name)
            except SchemaError as error:
                raise ApiError(400, f"invalid tenant name: {error}", param="tenant") from None
            return Tenant(name, dict(DEFAULT_GOVERNANCE))
        raise ApiError(404, f"unknown tenant {name!r}", param="tenant", code="tenant_not_found")

    def governance(self, name: str) -> dict[str, Any]:
        return self.tenant(name).governance_at(time.time())


def _strings(entry: dict, field: str, where: str) -> list[str]:
    value = entry.get(field, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: '{field}' must be a list of non-empty strings")
    return value


def _validate_governance(name: str, governance: dict[str, Any], where: str) -> None:
    days = governance.get("retention_days")
    if days is not None and (
        isinstance(days, bool) or not isinstance(days, (int, float)) or days <= 0
    ):
        raise ValueError(f"{where}: retention_days must be a positive number or null")
    if not isinstance(governance.get("training_eligible"), bool):
        raise ValueError(f"{where}: training_eligible must be true or false")
    try:
        governance_from_json(name, {**governance, "expires_at": None})
    except SchemaError as error:
        raise ValueError(f"{where}: {error}") from None
