"""Lineage of derived data: what a record was made from, and what was made from a record.

A derived record (a SEED skill, an expert-relabelled episode, a copy into another tenant) names
its sources in `TrajectoryHeader.derived_from` and carries governance at least as strict as
each source's (`strictest_governance`), so it can train only where every source could, expires
no later than the first of them, and is gone when they are: purging a trajectory purges its
descendants, through any number of derivation levels (`descendants`, used by
`AtdpStore.purge_expired` and `PartitionWriter.purge_expired`).

```python
sources = [reader.read("episode-7")]
header = derived_header(sources, trajectory_id="skill-x1", created_at=now, tenant="skills")
...
lineage.descendants(store, "acme", ["episode-7"])   # {SourceRef("skills", "skill-x1")}
```

Which checkpoints trained on which trajectories is the other half of lineage, recorded next to
each checkpoint step (`atdp_io.trained_on`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any

from atdp_io import governance as governance_lib
from atdp_io.index import PartitionIndex
from atdp_io.reader import PartitionReader
from atdp_io.schema import (
    Classification,
    ConsentStatus,
    Governance,
    GovernanceUpdate,
    LegalBasis,
    ReviewStatus,
    SourceRef,
    Trajectory,
    TrajectoryHeader,
)


class LineageError(ValueError):
    """Sources that cannot be combined (other tenants, none at all) or cannot be found."""


# Each ordered from least to most restrictive: a derived record takes the last one any source
# has. Classification: who may see it. Legal basis: NONE never trains and CONSENT trains only
# with consent granted, the others place no condition on training (SYNTHETIC has no data
# subject at all). Consent: WITHDRAWN and DENIED both stop training; a withdrawal also asks for
# erasure, so it ranks above a denial. Review: a record some source needs approval for
# (NOT_REQUIRED fails a policy that demands APPROVED) is stricter than one approved outright.
_CLASSIFICATION = (
    Classification.PUBLIC,
    Classification.INTERNAL,
    Classification.CONFIDENTIAL,
    Classification.RESTRICTED,
)
_LEGAL_BASIS = (
    LegalBasis.SYNTHETIC,
    LegalBasis.LEGITIMATE_INTEREST,
    LegalBasis.CONTRACT,
    LegalBasis.CONSENT,
    LegalBasis.NONE,
)
_CONSENT = (
    ConsentStatus.NOT_APPLICABLE,
    ConsentStatus.GRANTED,
    ConsentStatus.DENIED,
    ConsentStatus.WITHDRAWN,
)
_REVIEW = (
    ReviewStatus.APPROVED,
    ReviewStatus.NOT_REQUIRED,
    ReviewStatus.PENDING,
    ReviewStatus.REJECTED,
)


def _strictest(values: Iterable[Any], order: tuple) -> Any:
    return max(values, key=order.index)


def strictest_governance(sources: Iterable[Governance]) -> Governance:
    """The governance of data derived from `sources`: never less strict than any of them.

    The tenant is the sources' (all must share it); classification, legal basis, consent and
    review are each the most restrictive of the sources'; `expires_at` the earliest; training
    eligibility holds only if it holds for every source; redaction is the combined status
    (`governance.combine_redaction`). Raises `LineageError` for no sources or mixed tenants.
    """
    sources = list(sources)
    if not sources:
        raise LineageError("derived data needs at least one source")
    for i, source in enumerate(sources):
        if not isinstance(source, Governance):
            raise LineageError(f"sources[{i}]: expected Governance, got {type(source).__name__}")
    tenants = sorted({s.tenant for s in sources})
    if len(tenants) > 1:
        raise LineageError(
            f"sources belong to several tenants {tenants}; a derived record combines one "
            "tenant's data only (derive per tenant)"
        )
    expiries = [s.expires_at for s in sources if s.expires_at is not None]
    return Governance(
        tenant=tenants[0],
        classification=_strictest((s.classification for s in sources), _CLASSIFICATION),
        legal_basis=_strictest((s.legal_basis for s in sources), _LEGAL_BASIS),
        consent=_strictest((s.consent for s in sources), _CONSENT),
        expires_at=min(expiries) if expiries else None,
        training_eligible=all(s.training_eligible for s in sources),
        human_review=_strictest((s.human_review for s in sources), _REVIEW),
        redaction=governance_lib.combine_redaction(s.redaction for s in sources),
    )


def effective_governance(trajectory: Trajectory) -> Governance:
    """A trajectory's governance with its committed governance updates folded in (as read)."""
    updates = [a for a in trajectory.annotations if isinstance(a, GovernanceUpdate)]
    return governance_lib.apply_updates(trajectory.header.governance, updates)


def source_ref(trajectory: Trajectory) -> SourceRef:
    return SourceRef(trajectory.header.governance.tenant, trajectory.trajectory_id)


def derived_governance(sources: Sequence[Governance], *, tenant: str | None = None) -> Governance:
    """`strictest_governance(sources)`, written to partition `tenant` (default: the sources').

    Writing to another partition is how a skill bank or a demos tenant collects derived data;
    the record's `derived_from` still names the sources' tenant, so their purge reaches it.
    """
    combined = strictest_governance(sources)
    if tenant is None or tenant == combined.tenant:
        return combined
    return dataclasses.replace(combined, tenant=tenant)


def derived_header(
    sources: Sequence[Trajectory], *, tenant: str | None = None, **fields: Any
) -> TrajectoryHeader:
    """The header of a record derived from `sources` (trajectories as read, updates included).

    `fields` are the other header fields (`trajectory_id`, `created_at`, `task`, ...).
    """
    if "governance" in fields or "derived_from" in fields:
        raise LineageError("derived_header sets governance and derived_from from the sources")
    governance = derived_governance([effective_governance(t) for t in sources], tenant=tenant)
    refs = tuple(dict.fromkeys(source_ref(t) for t in sources))
    return TrajectoryHeader(governance=governance, derived_from=refs, **fields)


# -- following derivations ----------------------------------------------------------------------


def _maintenance_reader(store: Any, tenant: str) -> PartitionReader:
    """An index-only reader of one partition (headers, no payloads), refreshed."""
    reader = PartitionReader(
        store.partition_spec(tenant), tenant, store.config, content=False, context=store.context
    )
    reader.refresh()
    return reader


def _indices(reader_or_store: Any) -> Mapping[str, PartitionIndex]:
    if isinstance(reader_or_store, Mapping):  # indices the caller has read already
        return reader_or_store
    if isinstance(reader_or_store, PartitionReader):
        return {reader_or_store.tenant: reader_or_store.index}
    if hasattr(reader_or_store, "tenants") and hasattr(reader_or_store, "partition_spec"):
        return {t: _maintenance_reader(reader_or_store, t).index for t in reader_or_store.tenants()}
    raise TypeError(
        f"expected an AtdpStore or a PartitionReader, got {type(reader_or_store).__name__}"
    )


def children_map(indices: Mapping[str, PartitionIndex]) -> dict[SourceRef, set[SourceRef]]:
    """source -> the live records derived directly from it, over the given partitions."""
    children: dict[SourceRef, set[SourceRef]] = collections.defaultdict(set)
    for tenant, index in indices.items():
        for entry in index.by_id.values():
            for source in entry.header.derived_from:
                children[source].add(SourceRef(tenant, entry.trajectory_id))
    return children


def closure(
    children: Mapping[SourceRef, set[SourceRef]], roots: Iterable[SourceRef]
) -> dict[SourceRef, int]:
    """Every record reachable from `roots` (roots excluded) with its depth (1: direct)."""
    roots = set(roots)
    depth: dict[SourceRef, int] = {}
    frontier, level = list(roots), 0
    while frontier:
        level += 1
        found = []
        for ref in frontier:
            for child in children.get(ref, ()):
                if child not in roots and child not in depth:
                    depth[child] = level
                    found.append(child)
        frontier = found
    return depth


def descendants(reader_or_store: Any, tenant: str, trajectory_ids: Iterable[str]) -> set[SourceRef]:
    """Everything derived, directly or through other derived records, from `tenant`'s
    `trajectory_ids`: over every partition of an `AtdpStore`, within one refreshed
    `PartitionReader`'s partition, or over a `{tenant: PartitionIndex}` mapping already read.
    The sources themselves are not included."""
    roots = {SourceRef(tenant, i) for i in trajectory_ids}
    return set(closure(children_map(_indices(reader_or_store)), roots))


def ancestors(reader_or_store: Any, tenant: str, trajectory_id: str) -> set[SourceRef]:
    """What `tenant`'s `trajectory_id` was derived from, transitively (sources still stored or
    not: a purged source is still named by its derived records until they are purged too)."""
    indices = _indices(reader_or_store)
    found: set[SourceRef] = set()
    frontier = [SourceRef(tenant, trajectory_id)]
    while frontier:
        ref = frontier.pop()
        entry = indices.get(ref.tenant, PartitionIndex()).by_id.get(ref.trajectory_id)
        for source in entry.header.derived_from if entry is not None else ():
            if source not in found:
                found.add(source)
                frontier.append(source)
    return found


def source_governance(
    store: Any, refs: Iterable[SourceRef], *, missing_ok: bool = False
) -> dict[SourceRef, Governance]:
    """The effective governance of each stored source, read from the partitions' indices.

    Raises `LineageError` naming the sources that are not stored (never written, or purged:
    data must not be derived from a purged trajectory); with `missing_ok` they are left out.
    """
    refs = list(dict.fromkeys(refs))
    tenants = set(store.tenants())
    indices: dict[str, PartitionIndex] = {}
    out, missing = {}, []
    for ref in refs:
        if ref.tenant in tenants and ref.tenant not in indices:
            indices[ref.tenant] = _maintenance_reader(store, ref.tenant).index
        entry = indices.get(ref.tenant, PartitionIndex()).by_id.get(ref.trajectory_id)
        if entry is None:
            missing.append(str(ref))
        else:
            out[ref] = entry.governance()
    if missing and not missing_ok:
        raise LineageError(f"sources not stored (never written, or purged): {missing}")
    return out


def in_partition_descendants(index: PartitionIndex, tenant: str, ids: Iterable[str]) -> list[str]:
    """Ids of `tenant`'s records derived (transitively) from its `ids`, deepest first."""
    depth = closure(children_map({tenant: index}), {SourceRef(tenant, i) for i in ids})
    return [r.trajectory_id for r in sorted(depth, key=lambda r: (-depth[r], str(r)))]


def purge_plan(
    store: Any, tenant: str, trajectory_ids: Iterable[str]
) -> list[tuple[str, list[str]]]:
    """What purging `tenant`'s `trajectory_ids` must erase, as `(tenant, ids)` steps in order.

    Other partitions' records go first, deepest derivation level first; the last step is
    `tenant`'s own: its derived records and the sources, in one purge. So whenever a step
    fails, every record still stored is reachable from the sources again: a retry finds it.
    """
    ids = list(dict.fromkeys(trajectory_ids))
    if not ids:  # nothing to follow: do not read every partition's index
        return [(tenant, [])]
    depth = closure(children_map(_indices(store)), {SourceRef(tenant, i) for i in ids})
    steps: list[tuple[str, list[str]]] = []
    for ref in sorted(depth, key=lambda r: (-depth[r], r.tenant, r.trajectory_id)):
        if ref.tenant == tenant:
            continue
        if steps and steps[-1][0] == ref.tenant:
            steps[-1][1].append(ref.trajectory_id)
        else:
            steps.append((ref.tenant, [ref.trajectory_id]))
    own = sorted(
        (r for r in depth if r.tenant == tenant), key=lambda r: (-depth[r], r.trajectory_id)
    )
    steps.append((tenant, [r.trajectory_id for r in own] + ids))  # roots are never in `depth`
    return steps


def purge_cascade(
    store: Any,
    tenant: str,
    trajectory_ids: Iterable[str],
    *,
    reason: str,
    open_writer: Callable[[str], ContextManager[Any]] | None = None,
) -> dict[str, list[str]]:
    """Purges `tenant`'s `trajectory_ids` and everything derived from them in any partition of
    `store`; returns `{tenant: purged ids}`.

    `open_writer(tenant)` gives a writer of a partition for the duration of a `with` (default
    `store.writer`; `AtdpStore` passes one that reuses this process's live writer). Other
    partitions go first and the sources last: if one of those partitions is locked by another
    process (`PartitionLockedError`), no source was purged yet, so a retry finds the same
    descendants again (a purged source no longer names its descendants).
    """
    open_writer = store.writer if open_writer is None else open_writer
    *others, (_, own) = purge_plan(store, tenant, trajectory_ids)
    purged: dict[str, list[str]] = collections.defaultdict(list)
    for other, ids in others:
        with open_writer(other) as other_writer:
            purged[other] += other_writer.purge(ids, reason=f"source purged: {reason}")
    purged[tenant] = []
    if own:
        with open_writer(tenant) as writer:
            purged[tenant] = writer.purge(own, reason=reason)
    return dict(purged)
