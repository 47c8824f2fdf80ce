"""Builders of realistic ATDP trajectories for the atdp_io tests (multi-turn agent episodes)."""

from __future__ import annotations

import pathlib

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    DecodingParams,
    Event,
    EventKind,
    EventMetadata,
    Governance,
    LLMCall,
    Outcome,
    ReplayClass,
    Reward,
    ToolCall,
    Trajectory,
    TrajectoryHeader,
)

NOW = 1_800_000_000.0


def stored_bytes(root) -> bytes:
    """Every byte of every file under a store root (for scans of what reached disk)."""
    files = sorted(p for p in pathlib.Path(root).rglob("*") if p.is_file())
    return b"\n".join(p.read_bytes() for p in files)


class ByteTokenizer:
    """A real reversible tokenizer: UTF-8 bytes shifted by 3 (ids 0-2 reserved for specials)."""

    vocab_size = 259
    pad_id = 0

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode()]

    def decode(self, ids) -> str:
        return bytes(int(i) - 3 for i in ids if int(i) >= 3).decode(errors="replace")


def llm_event(input_ids, output_ids, *, version=0, rng=None, text="go to cabinet 1") -> Event:
    rng = rng or np.random.default_rng(0)
    n = len(output_ids)
    return Event(
        kind=EventKind.LLM_CALL,
        replay=ReplayClass.DETERMINISTIC,
        action=Action(ActionKind.COMMAND, text=text),
        llm=LLMCall(
            model_id="tiny-moe",
            policy_version=version,
            input_ids=np.asarray(input_ids, np.int32),
            output_ids=np.asarray(output_ids, np.int32),
            output_logprobs=-rng.random(n).astype(np.float32),
            decoding=DecodingParams(temperature=1.0, top_p=1.0, max_tokens=64),
            prompt_template_fingerprint="chatml-v1",
            system_prompt_version="alfworld-v1",
        ),
        metadata=EventMetadata(timestamp=NOW, latency_s=0.05, model_id="tiny-moe"),
    )


def env_event(observation: str, command: str, reward: float = 0.0) -> Event:
    return Event(
        kind=EventKind.ENV_STEP,
        replay=ReplayClass.APPROXIMATE,
        observation=observation,
        action=Action(ActionKind.COMMAND, text=command),
        rewards=(Reward(reward, "env"),) if reward else (),
    )


def tool_event(name: str, arguments: dict, result) -> Event:
    return Event(
        kind=EventKind.TOOL_CALL,
        replay=ReplayClass.NON_REPLAYABLE,
        action=Action(
            ActionKind.TOOL_CALLS,
            tool_calls=(
                ToolCall(name, arguments, call_id="c1", version="1.0", permission_scope="read"),
            ),
        ),
        result=result,
    )


def agent_trajectory(
    trajectory_id: str,
    *,
    tenant: str = "acme",
    turns: int = 3,
    prompt_len: int = 12,
    obs_len: int = 5,
    out_len: int = 4,
    version: int = 0,
    seed: int = 0,
    final_reward: float = 1.0,
    expires_at: float | None = NOW + 86400,
    governance: Governance | None = None,
    concat: bool = True,
) -> Trajectory:
    """An agent episode: per turn an LLM call then an env step; inputs extend when `concat`."""
    rng = np.random.default_rng(seed)
    context = rng.integers(3, 250, prompt_len).astype(np.int32)
    events = []
    for turn in range(turns):
        if not concat and turn:
            context = rng.integers(3, 250, prompt_len).astype(np.int32)
        output = rng.integers(3, 250, out_len).astype(np.int32)
        events.append(llm_event(context, output, version=version, rng=rng))
        reward = final_reward if turn == turns - 1 else 0.0
        events.append(env_event(f"obs {turn}", f"cmd {turn}", reward))
        observation = rng.integers(3, 250, obs_len).astype(np.int32)
        context = np.concatenate([context, output, observation])
    header = TrajectoryHeader(
        trajectory_id=trajectory_id,
        governance=governance or Governance.synthetic(tenant, expires_at=expires_at),
        created_at=NOW,
        task={"env": "alfworld", "split": "train", "index": seed},
    )
    return Trajectory(
        header=header, events=tuple(events), outcome=Outcome(success=final_reward > 0)
    )
