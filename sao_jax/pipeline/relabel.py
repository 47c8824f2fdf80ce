"""DAgger's relabelling: a played episode with every reply replaced by the expert's.

Each game is replayed from `header.task` with the recorded commands (the engine is
deterministic), so every turn is relabelled in exactly the state the policy saw; the result is
derived data of the episode (it takes the episode's governance).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from atdp_io import DecodingParams, Event, EventKind, LLMCall, Trajectory, lineage
from sao_jax.envs import env_from_task_spec
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import IM_END

EXPERT_MODEL_ID = "{env}-expert-relabel"  # the relabelled calls' model id (then -<expert>)


def relabel_with_expert(
    trajectory: Trajectory,
    tokenizer: Tokenizer,
    *,
    think: bool,
    max_new_tokens: int,
    tenant: str | None = None,
    expert: str = "search",
) -> Trajectory | None:
    """The episode with every LLM call's output replaced by the expert's reply to its prompt.

    The game is rebuilt from `header.task` and stepped with the recorded commands, so each turn
    is relabelled in exactly the state the policy saw. Turns after the game is won (none) and
    expert replies longer than `max_new_tokens` end the relabelled episode. `tenant`: the
    partition the result is written to (its governance names it). `expert`: which expert
    relabels ("search": from the transcript of the recorded commands, as the policy saw them;
    "oracle": the planner), the same kind that made the demos; it is recorded as the calls'
    `decoding.extra["policy"]` ("expert-search") and in their model id. Returns None when no
    turn could be relabelled.
    """
    task = trajectory.header.task
    env = env_from_task_spec(task, expert=expert)  # the env that played it (`header.task`)
    env.reset(task["index"])
    im_end = tokenizer.token_to_id(IM_END)
    decoding = DecodingParams(
        temperature=0.0, extra={"logprobs": "absent", "policy": f"expert-{expert}"}
    )
    events: list[Event] = []
    for event in trajectory.events:
        if event.kind == EventKind.LLM_CALL:
            command = env.expert_action()
            if command is None:
                break
            ids = np.asarray(
                [*tokenizer.encode(env.harness.format_reply(command, think=think)), im_end]
            )
            if ids.shape[0] > max_new_tokens:
                break
            call = LLMCall(
                model_id=f"{EXPERT_MODEL_ID.format(env=env.name)}-{expert}",
                policy_version=0,
                input_ids=event.llm.input_ids,
                output_ids=ids.astype(np.int32),
                output_logprobs=np.zeros(ids.shape, np.float32),
                decoding=decoding,
                prompt_template_fingerprint=event.llm.prompt_template_fingerprint,
                finish_reason="stop",
            )
            events.append(dataclasses.replace(event, llm=call))
        elif event.kind == EventKind.ENV_STEP:
            # the policy's own command moves the game on: the next prompt is the one it saw
            _, _, done, _ = env.step(event.action.text if event.action else "")
            events.append(dataclasses.replace(event, rewards=()))
            if done:
                break
    if not any(e.kind == EventKind.LLM_CALL for e in events):
        return None
    # Derived data: it names the episode and takes its governance (expires and is purged
    # with it), wherever it is written.
    header = lineage.derived_header(
        [trajectory],
        tenant=tenant,
        trajectory_id=f"{trajectory.trajectory_id}-relabel",
        created_at=trajectory.header.created_at,
        session_id=trajectory.header.session_id,
        task={**task, "source": "expert_relabel"},
        envelope=trajectory.header.envelope,
    )
    return Trajectory(header, tuple(events), trajectory.outcome)


def relabel_all(
    trajectories: Iterable[Trajectory],
    tokenizer: Tokenizer,
    *,
    think: bool,
    max_new_tokens: int,
    tenant: str | None = None,
    expert: str = "search",
) -> list[Trajectory]:
    """`relabel_with_expert` over many episodes (those with nothing to relabel are skipped)."""
    out = []
    for trajectory in trajectories:
        relabelled = relabel_with_expert(
            trajectory,
            tokenizer,
            think=think,
            max_new_tokens=max_new_tokens,
            tenant=tenant,
            expert=expert,
        )
        if relabelled is not None:
            out.append(relabelled)
    return out
