"""Run and episode ids that the ATDP writer stores exactly as given.

Every episode id is built from a caller's `run_id`, and the writer redacts what it stores: a
trajectory id with a finding is refused (`SchemaError`, mid-run, in whichever worker writes
it first) and a session or interaction id is silently rewritten. `check_run_id` runs the
writer's own default `Redactor` over the ids a run will produce, so such a `run_id` fails when
the rollout object is built, not hours later.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from atdp_io import Redactor
from atdp_io.redaction import RedactionReport


def new_run_id() -> str:
    """A fresh random run id (12 hex characters, no separators: nothing a detector matches)."""
    return uuid.uuid4().hex[:12]


# Groups a rollout run can reach: the longest episode id checked at construction.
MAX_GROUPS = 10**9


def rollout_group_id(run_id: str, worker_id: int, group: int) -> str:
    """The id of group `group` played by worker `worker_id` of a run (unique in the run, unlike
    the worker's group counter; stored as `header.task["group_key"]` for the loader)."""
    return f"{run_id}-w{worker_id}-g{group}"


def rollout_episode_id(run_id: str, worker_id: int, group: int, member: int) -> str:
    """The id of member `member` of group `group` played by worker `worker_id` of a run."""
    return f"{rollout_group_id(run_id, worker_id, group)}-m{member}"


def demo_episode_id(run_id: str, index: int) -> str:
    """The id of the `index`-th expert demonstration of a run."""
    return f"{run_id}-demo-{index}"


def check_run_id(run_id: str, derived_ids: Iterable[str], *, owner: str) -> str:
    """Returns `run_id` if the ATDP writer would store it and `derived_ids` unchanged.

    derived_ids: the shortest and the longest ids the run will build from `run_id` (with the
      functions above). That covers every id in between: each suffix puts a letter before its
      numbers and no phone or card detector starts right after a letter, while the
      length-bounded detectors (API keys, bearer tokens, secrets) only match more of a longer
      id. An interaction id (`<episode id>/t<turn>`) extends an episode id already long
      enough for each of them.
    owner: who checks (named in the error), e.g. "AgentLoop".

    Raises:
      TypeError: `run_id` is not a string.
      ValueError: `run_id` is empty, or redaction would change it or a derived id; the message
        names the id and the detectors that matched.
    """
    if not isinstance(run_id, str):
        raise TypeError(f"{owner}: run_id must be a str, got {type(run_id).__name__}")
    if not run_id:
        raise ValueError(f"{owner}: run_id must be non-empty (or None for a random one)")
    redactor = Redactor()  # what AtdpStore.writer uses unless given another
    for candidate in (run_id, *derived_ids):
        report = RedactionReport()
        redacted = redactor.redact_text(candidate, report)
        if report.findings:
            detectors = ", ".join(sorted(report.findings))
            where = "" if candidate == run_id else f" in the derived id {candidate!r}"
            raise ValueError(
                f"{owner}: run_id {run_id!r} would be redacted by the ATDP writer{where} "
                f"(matches the {detectors} detector, stored as {redacted!r}); the writer "
                "refuses such trajectory ids. Use an opaque id, e.g. put a letter before each "
                "number ('r2024-s555-1234')"
            )
    return run_id
