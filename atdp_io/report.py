"""Per-partition summaries for `inspect`: counts, tokens, rewards and training eligibility.

Computed from the record index alone (no payload is read), so an operator without content
access can run it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from atdp_io.governance import EligibilityPolicy, ineligibility_reason
from atdp_io.index import bits_float
from atdp_io.layout import AnnotationKind, Col, RecordKind
from atdp_io.reader import PartitionReader


def partition_report(
    reader: PartitionReader, now: float, policy: EligibilityPolicy | None = None
) -> dict:
    """Counts for one refreshed partition.

    Keys: trajectories (closed / open / purged), events, llm_calls, stored_tokens,
    output_tokens, reward_sum (inline + late), late_rewards, eligible, ineligible (by reason),
    min_version / max_version of output tokens (-1 when none).
    """
    policy = policy or EligibilityPolicy()
    records = reader.index.records
    entries = list(reader.index.by_row.values())
    live = [e for e in entries if not e.purged]
    kinds = records[:, Col.KIND]
    live_rows = np.zeros(records.shape[0], bool)
    for entry in live:
        live_rows[[entry.row, *entry.event_rows, *entry.annotation_rows]] = True
    events = live_rows & (kinds == RecordKind.EVENT)
    llm = events & (records[:, Col.PREFIX_LEN] + records[:, Col.INPUT_LEN] > 0)
    late = live_rows & (kinds == RecordKind.ANNOTATION)
    late &= records[:, Col.SUBKIND] == AnnotationKind.LATE_REWARD
    values = bits_float(records[:, Col.VALUE])
    versions = records[llm & (records[:, Col.MIN_VERSION] >= 0)]
    reasons: Counter = Counter()
    for entry in live:
        if entry.closed:
            reason = ineligibility_reason(entry.governance(), entry.redaction(records), now, policy)
            reasons[reason or "eligible"] += 1
    eligible = reasons.pop("eligible", 0)
    return {
        "tenant": reader.tenant,
        "trajectories": len(live),
        "closed": sum(e.closed for e in live),
        "open": sum(not e.closed for e in live),
        "purged": len(entries) - len(live),
        "events": int(events.sum()),
        "llm_calls": int(llm.sum()),
        "stored_tokens": int(
            (records[events, Col.INPUT_LEN] + records[events, Col.OUTPUT_LEN]).sum()
        ),
        "output_tokens": int(records[events, Col.OUTPUT_LEN].sum()),
        "reward_sum": float(values[events | late].sum()),
        "late_rewards": int(late.sum()),
        "eligible": eligible,
        "ineligible": dict(sorted(reasons.items())),
        "min_version": int(versions[:, Col.MIN_VERSION].min()) if versions.size else -1,
        "max_version": int(versions[:, Col.MAX_VERSION].max()) if versions.size else -1,
    }
