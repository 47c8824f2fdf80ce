"""DAgger relabeling for the warm start: the expert's reply at every state the policy visited.

ALFWorld's expert reads the true game state, so plain demonstrations never show a wrong room, a
closed receptacle that holds nothing, or a command that failed; a cloned policy that strays
there has never seen what to do next and loops. DAgger (Ross et al., 2011) fixes this: the
cloned policy plays, and each of its turns is written again with the expert's reply to that same
prompt. Everything goes through ATDP: the policy's episodes are read from the buffer, each game
is replayed from `header.task` with the recorded commands (our engine is deterministic), and the
relabelled turns are written as new trajectories for the cloning loader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from atdp_io import DecodingParams, Event, EventKind, LLMCall, Trajectory, TrajectoryHeader
from sao_jax.envs.alfworld import AlfworldEnv
from sao_jax.rollout import expert_reply
from sao_jax.tokenizers import Tokenizer
from sao_jax.tokenizers.chat_template import IM_END

EXPERT_MODEL_ID = "alfworld-expert-relabel"


def relabel_with_expert(
    trajectory: Trajectory,
    tokenizer: Tokenizer,
    *,
    think: bool,
    max_new_tokens: int,
    tenant: str | None = None,
) -> Trajectory | None:
    """The episode with every LLM call's output replaced by the expert's reply to its prompt.

    The game is rebuilt from `header.task` and stepped with the recorded commands, so each turn
    is relabelled in exactly the state the policy saw. Turns after the game is won (none) and
    expert replies longer than `max_new_tokens` end the relabelled episode. `tenant`: the
    partition the result is written to (its governance names it). Returns None when no turn
    could be relabelled.
    """
    task = trajectory.header.task
    env = AlfworldEnv(
        task["split"], size=task["size"], phrasing=task["phrasing"], max_steps=task["max_steps"]
    )
    env.reset(task["index"])
    im_end = tokenizer.token_to_id(IM_END)
    decoding = DecodingParams(temperature=0.0, extra={"logprobs": "absent", "policy": "expert"})
    events: list[Event] = []
    for event in trajectory.events:
        if event.kind == EventKind.LLM_CALL:
            command = env.expert_action()
            if command is None:
                break
            ids = np.asarray([*tokenizer.encode(expert_reply(command, think=think)), im_end])
            if ids.shape[0] > max_new_tokens:
                break
            call = LLMCall(
                model_id=EXPERT_MODEL_ID,
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
    governance = trajectory.header.governance
    if tenant is not None:
        governance = dataclasses.replace(governance, tenant=tenant)
    header = TrajectoryHeader(
        trajectory_id=f"{trajectory.trajectory_id}-relabel",
        governance=governance,
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
) -> list[Trajectory]:
    """`relabel_with_expert` over many episodes (those with nothing to relabel are skipped)."""
    out = []
    for trajectory in trajectories:
        relabelled = relabel_with_expert(
            trajectory, tokenizer, think=think, max_new_tokens=max_new_tokens, tenant=tenant
        )
        if relabelled is not None:
            out.append(relabelled)
    return out
