"""What an analyzer reads: one finished episode as text (task, actions, observations, outcome).

Two sources: an ATDP trajectory (stage 1, the skill bank; carries the game spec, so the
rule-based analyzer can read the game's ground truth) and a learner batch (stage 2: the rows of
each trajectory are decoded back to text, so skills need no lookup by trajectory id). Both read
the env's texts through its `PromptHarness` (`sao_jax.envs.base`): replies with
`parse_reply`, decoded prompts with `read_prompt`, task types with `task_type_of`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

import numpy as np

from atdp_io import Action, ActionKind, EventKind, Governance, SourceRef, Trajectory
from atdp_io import lineage as lineage_lib
from atdp_io.trained_on import BATCH_KEY, decode_ref
from sao_jax.envs.registry import env_class, env_from_task_spec
from sao_jax.tokenizers import Tokenizer


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode.

    Attributes:
      trajectory_id: ATDP id of the episode ("" when decoded from a batch).
      task: the task sentence ("put a mug in cabinet").
      task_type: the env's task type ("" when unknown).
      actions: the commands the agent chose, in order (an unparseable reply is "").
      observations: what the agent saw before each action (may be shorter than `actions`).
      success: whether the episode was won.
      game: the game spec (`header.task`: split, index, size, ...) when known.
      source: the stored trajectory the record was read from (lineage of what is derived from
        it), None when unknown.
      governance: that trajectory's effective governance when read from the store (None: a
        writer of derived data looks it up, `atdp_io.lineage.source_governance`).
    """

    trajectory_id: str
    task: str
    task_type: str
    actions: tuple[str, ...]
    observations: tuple[str, ...]
    success: bool
    game: Mapping | None = None
    source: SourceRef | None = None
    governance: Governance | None = None

    def __post_init__(self):
        if not self.actions:
            raise ValueError(f"episode {self.trajectory_id!r} has no actions: nothing to analyse")
        if not self.task:
            raise ValueError(f"episode {self.trajectory_id!r} has no task sentence")


def from_trajectory(trajectory: Trajectory, *, think: bool = False) -> EpisodeRecord:
    """The record of an ATDP trajectory: one written by the rollout engine or the expert
    (commands and env observations on each LLM call), or one the serving gateway recorded
    (chat messages, replies, tool calls: an agent's served traffic).

    Actions, one per LLM call: the call's command; a chat reply read by the env's harness
    (`parse_reply`: its `<action>` block, "" when malformed) when the trajectory is an env's
    episode (`header.task` names its env or split), else the reply text itself; typed tool
    calls as "name {json arguments}". Observations: the call's own, else the current
    observation of the prompt that preceded it (`read_prompt`), else that prompt, else the
    last tool result. The task: `header.task["sentence"]`, else read from the first prompt,
    else rebuilt from the game spec.
    """
    task = dict(trajectory.header.task)
    harness = env_class(str(task.get("env", "alfworld"))).harness
    env_episode = "env" in task or "split" in task
    actions, observations, contexts = [], [], []
    context, tool_result = "", ""
    for event in trajectory.events:
        if event.kind == EventKind.MESSAGE and isinstance(event.observation, Mapping):
            if event.observation.get("role") in ("user", "system"):
                context = str(event.observation.get("content", ""))
        elif event.kind == EventKind.TOOL_CALL:
            tool_result = str(event.result or "")
        elif event.kind == EventKind.LLM_CALL:
            own = event.observation if isinstance(event.observation, str) else ""
            actions.append(_action_text(event.action, harness, env_episode, think))
            found = harness.read_prompt(context)[1] if context else []
            observations.append(own or (found[-1] if found else context or tool_result))
            contexts.append(own or context)
    sentence = str(task.get("sentence", ""))
    for text in contexts if not sentence else ():
        sentence = harness.read_prompt(text)[0]
        if sentence:
            break
    success = bool(trajectory.outcome and trajectory.outcome.success)
    return EpisodeRecord(
        trajectory_id=trajectory.trajectory_id,
        task=sentence or _task_from_game(task),
        task_type=str(task.get("task_type", "")),
        actions=tuple(actions),
        observations=tuple(observations),
        success=success,
        game=task if "index" in task and "split" in task else None,
        source=lineage_lib.source_ref(trajectory),
        governance=lineage_lib.effective_governance(trajectory),
    )


def _action_text(action: Action | None, harness, env_episode: bool, think: bool) -> str:
    """One LLM call's action as the analyzer reads it (see `from_trajectory`)."""
    if action is None:
        return ""
    if action.kind == ActionKind.TOOL_CALLS and action.tool_calls:
        return "; ".join(
            f"{c.name} {json.dumps(dict(c.arguments), sort_keys=True)}" for c in action.tool_calls
        )
    if action.kind == ActionKind.COMMAND or not env_episode:
        return action.text
    return harness.parse_reply(action.text, think=think).action or ""


def with_task_specs(records: dict[int, EpisodeRecord], store) -> dict[int, EpisodeRecord]:
    """`records` (of `from_batch`) with each one's game spec read from the stored
    trajectory's `header.task` (records with no source, or whose source is gone, unchanged):
    what the rule-based analyzer needs to read a learner batch's episodes."""
    readers, out = {}, {}
    for key, record in records.items():
        ref = record.source
        if record.game is not None or ref is None:
            out[key] = record
            continue
        if ref.tenant not in readers:
            reader = store.reader(ref.tenant, principal=ref.tenant)
            reader.refresh()
            readers[ref.tenant] = reader
        try:
            header = readers[ref.tenant].read(ref.trajectory_id).header
        except KeyError:
            out[key] = record
            continue
        task = dict(header.task)
        game = task if "index" in task and "split" in task else None
        out[key] = dataclasses.replace(record, game=game)
    return out


def _task_from_game(task: Mapping) -> str:
    """The task text of the stored episode's task (its env rebuilt and reset)."""
    if "split" not in task or "index" not in task:
        return ""
    _, info = env_from_task_spec(task).reset(int(task["index"]))
    return str(info["task"])


def from_batch(
    batch: Mapping[str, np.ndarray],
    tokenizer: Tokenizer,
    *,
    think: bool = False,
    env: str = "alfworld",
) -> dict[int, EpisodeRecord]:
    """Records of the trajectories of a learner batch, keyed by `traj_index`.

    A loader batch names each slot's trajectory (`trajectory_refs`): the records carry it as
    their `source`, so skills written from them keep their lineage. Rows of a trajectory are read in `turn_index` order; each contiguous run of `loss_mask`
    tokens is one reply (so windowed and concat rows both work); the task comes from the
    first prompt, success from a positive reward anywhere in the trajectory. `env`: the env
    whose harness reads the texts (replies, prompts, task types).
    """
    harness = env_class(env).harness
    tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"]) > 0
    real = np.asarray(batch["segment_ids"]) > 0
    rewards, traj = np.asarray(batch["rewards"]), np.asarray(batch["traj_index"])
    turn = np.asarray(batch["turn_index"])
    refs = batch.get(BATCH_KEY)
    records: dict[int, EpisodeRecord] = {}
    for k in np.unique(traj[traj >= 0]):
        rows = sorted(np.flatnonzero(traj == k), key=lambda r: turn[r])
        actions, observations, task = [], [], ""
        for r in rows:
            for start, end in _mask_spans(mask[r]):
                reply = tokenizer.decode(tokens[r, start:end], skip_special_tokens=True)
                actions.append(harness.parse_reply(reply, think=think).action or "")
            context = tokenizer.decode(tokens[r][real[r] & ~mask[r]], skip_special_tokens=True)
            found_task, found_observations = harness.read_prompt(context)
            task = task or found_task
            observations += found_observations
        source = decode_ref(refs[k]) if refs is not None else None
        records[int(k)] = EpisodeRecord(
            trajectory_id=source.trajectory_id if source else "",
            task=task,
            task_type=harness.task_type_of(task),
            actions=tuple(actions),
            observations=tuple(observations),
            success=bool(np.any(rewards[rows] > 0)),
            source=source,
        )
    return records


def task_type_of(sentence: str, env: str = "alfworld") -> str:
    """The task type of `env` whose task text `sentence` is ("" if none)."""
    return env_class(env).harness.task_type_of(sentence)


def _mask_spans(mask_row: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D mask."""
    edges = np.diff(np.concatenate([[0], mask_row.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))
