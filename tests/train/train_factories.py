"""Small models and ATDP episodes for the learner tests (written and read through atdp_io)."""

from __future__ import annotations

import dataclasses

import numpy as np

from atdp_io import (
    Action,
    ActionKind,
    AtdpStore,
    Event,
    EventKind,
    Governance,
    LLMCall,
    Outcome,
    ReplayClass,
    Reward,
    Trajectory,
    TrajectoryHeader,
)
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.models import MoeAuxConfig, get_model_config, init_model
from sao_jax.train import CriticConfig, LearnerConfig, OptimizerConfig

VOCAB = 48
TENANT = "train-tests"


def exact_learner_config(learning_rate: float = 1e-3, **changes) -> LearnerConfig:
    """No clipping, no aux / entropy terms, no warm-up unless asked: updates are exactly
    Adam's first step on the loss."""
    base = LearnerConfig(
        policy_optimizer=OptimizerConfig(learning_rate=learning_rate, max_grad_norm=0.0),
        critic_optimizer=OptimizerConfig(learning_rate=learning_rate, max_grad_norm=0.0),
        critic=CriticConfig(warmup_steps=0),
        moe=MoeAuxConfig(load_balance_weight=0.0, router_z_weight=0.0),
    )
    return dataclasses.replace(base, **changes)


def tiny_policy(seed: int = 0, **overrides):
    """A 2-layer MoE policy small enough to compile and step in a second or two."""
    config = get_model_config("test", vocab_size=VOCAB, **overrides)
    return init_model(config, seed=seed)


def episode(
    trajectory_id: str,
    *,
    seed: int,
    turns: int = 3,
    prompt_len: int = 6,
    out_len: int = 3,
    obs_len: int = 2,
    concat: bool = True,
    version: int = 0,
    reward: float = 1.0,
    prompt: np.ndarray | None = None,
    logprob_scale: float = 1.0,
) -> Trajectory:
    """A multi-turn episode: LLM call then env step per turn, reward on the last env step.

    `concat`: each call's input extends the previous input + output (one concat row); otherwise
    each call's prompt is rebuilt (windowed rows). `prompt` fixes the first prompt (GRPO groups).
    """
    rng = np.random.default_rng(seed)
    first = rng.integers(3, VOCAB, prompt_len) if prompt is None else np.asarray(prompt)
    context = first.astype(np.int32)
    events = []
    for turn in range(turns):
        if not concat and turn:
            context = np.concatenate([first[:2], rng.integers(3, VOCAB, prompt_len)]).astype(
                np.int32
            )
        output = rng.integers(3, VOCAB, out_len).astype(np.int32)
        logp = (-logprob_scale * rng.random(out_len) - 0.1).astype(np.float32)
        events.append(
            Event(
                kind=EventKind.LLM_CALL,
                replay=ReplayClass.DETERMINISTIC,
                action=Action(ActionKind.COMMAND, text=f"cmd {turn}"),
                llm=LLMCall("tiny", version, context, output, logp),
            )
        )
        last = turn == turns - 1
        events.append(
            Event(
                kind=EventKind.ENV_STEP,
                replay=ReplayClass.APPROXIMATE,
                observation=f"obs {turn}",
                action=Action(ActionKind.COMMAND, text=f"cmd {turn}"),
                rewards=(Reward(reward, "env"),) if last and reward else (),
            )
        )
        context = np.concatenate([context, output, rng.integers(3, VOCAB, obs_len)]).astype(
            np.int32
        )
    header = TrajectoryHeader(
        trajectory_id=trajectory_id,
        governance=Governance.synthetic(TENANT, expires_at=None),
        created_at=1.8e9,
        task={"env": "test", "index": seed},
    )
    return Trajectory(header, tuple(events), Outcome(success=reward > 0))


def write_store(path, trajectories) -> AtdpStore:
    store = AtdpStore.open(str(path))
    with store.writer(TENANT) as writer:
        writer.append(list(trajectories))
    return store


def loader(store, *, rows=8, seq_len=64, layout="concat", current_version=lambda: 0, **kw):
    return AtdpLoader(
        store,
        [TENANT],
        principal=TENANT,
        config=LoaderConfig(rows=rows, seq_len=seq_len, layout=layout, **kw),
        current_version=current_version,
    )


def first_batch(store, **kw) -> dict[str, np.ndarray]:
    return next(iter(loader(store, **kw).epoch(shuffle=False)))
