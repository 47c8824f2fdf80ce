"""Expert demonstrations in exactly the policy's format, written to ATDP for behaviour cloning.

The expert's command at each step is rendered as the reply the policy is asked for
(`<action>cmd</action>`, after an empty `<think></think>` when `think` is on) and placed in the
same token layout as rollouts (`PromptBuilder`), so a model cloned on demos sees at test time
exactly the prompts it was trained on. Demos are marked three ways: `header.task["source"] =
"expert_demo"`, `model_id` of the expert, and `decoding.extra["logprobs"] = "absent"` (their
`output_logprobs` are zeros, not a policy's log-probs: never use them as behaviour log-probs).
Write them to their own tenant so an RL loader never mixes them with rollouts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from atdp_io import DecodingParams, PartitionWriter
from sao_jax.envs.alfworld import AlfworldEnv, parse_reply
from sao_jax.rollout.agent_loop import EnvConfig, RolloutConfig
from sao_jax.rollout.episode import Episode, Turn
from sao_jax.rollout.prompts import PromptBuilder
from sao_jax.rollout.run_ids import check_run_id, demo_episode_id, new_run_id
from sao_jax.rollout.stats import RolloutStats
from sao_jax.tokenizers import Tokenizer

EXPERT_MODEL_IDS = {"search": "alfworld-expert-search", "oracle": "alfworld-expert-oracle"}


def expert_model_id(expert: str) -> str:
    """The `model_id` demos of that expert kind carry ("alfworld-expert-search" / "-oracle")."""
    if expert not in EXPERT_MODEL_IDS:
        raise ValueError(f"unknown expert {expert!r}; expected one of {tuple(EXPERT_MODEL_IDS)}")
    return EXPERT_MODEL_IDS[expert]


EXPERT_MODEL_ID = expert_model_id("search")  # the default expert's


def expert_reply(command: str, *, think: bool) -> str:
    """The reply text the policy should produce for `command`."""
    return f"{'<think></think>' if think else ''}<action>{command}</action>"


def collect_expert_demos(
    writer: PartitionWriter,
    tokenizer: Tokenizer,
    *,
    num_episodes: int,
    rollout: RolloutConfig | None = None,
    env: EnvConfig | None = None,
    run_id: str | None = None,
    write_batch: int = 32,
    indices: Sequence[int] | None = None,
) -> dict:
    """Play `num_episodes` games of `env` with the expert and write them through `writer`.

    rollout: layout, history, think, rewards and context cap (as for rollouts).
    env: games, and which expert plays them (`EnvConfig.expert`, default "search"); the demos
      record it as `model_id` (`expert_model_id`) and `decoding.extra["policy"]` ("expert-search"
      / "expert-oracle").
    run_id: prefix of the demos' episode ids (None: a random one); a run_id the ATDP writer
      would redact is a `ValueError` before any game is played.
    indices: the game indices of `env.split` to draw from (None: all of them), e.g. to keep
      held-out games out of the demonstrations.
    Returns `RolloutStats` counters of the demos (episodes, won, env_steps, ...).
    """
    if num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    rollout, env = rollout or RolloutConfig(), env or EnvConfig()
    if run_id is None:
        run_id = new_run_id()
    else:
        ids = (demo_episode_id(run_id, 0), demo_episode_id(run_id, num_episodes - 1))
        check_run_id(run_id, ids, owner="collect_expert_demos")
    builder = PromptBuilder.for_rollout(tokenizer, rollout)
    im_end = builder.im_end_id
    decoding = DecodingParams(
        temperature=0.0, extra={"logprobs": "absent", "policy": f"expert-{env.expert}"}
    )
    (game_env,) = env.make_envs(1, indices=indices)
    stats, pending = RolloutStats(), []
    for e in range(num_episodes):
        episode = _play_expert(game_env, tokenizer, builder, rollout, im_end, decoding)
        episode = dataclasses.replace(episode, episode_id=demo_episode_id(run_id, e))
        pending.append(episode.to_trajectory(tenant=writer.tenant))
        stats.add_episodes([episode])
        if len(pending) >= write_batch:
            writer.append_async(pending)
            pending = []
    if pending:
        writer.append_async(pending)
    writer.flush()
    return stats.snapshot()


def _play_expert(
    env: AlfworldEnv,
    tokenizer: Tokenizer,
    builder: PromptBuilder,
    rollout: RolloutConfig,
    im_end: int,
    decoding: DecodingParams,
) -> Episode:
    observation, info = env.reset()
    game_index, started_at = env.game.index, time.time()
    input_ids = builder.first(info["task"], observation, info["admissible_commands"])
    turns, history, truncated_by = [], [], "step_limit"
    while True:
        if len(input_ids) + rollout.max_new_tokens > rollout.max_context_tokens:
            truncated_by = "context"
            break
        command = env.expert_action()
        reply = expert_reply(command, think=rollout.think)
        output_ids = np.asarray([*tokenizer.encode(reply), im_end], np.int32)
        if output_ids.shape[0] > rollout.max_new_tokens:
            raise ValueError(
                f"the expert reply {reply!r} is {output_ids.shape[0]} tokens, more than "
                f"max_new_tokens={rollout.max_new_tokens}"
            )
        parsed = parse_reply(
            tokenizer.decode(output_ids, skip_special_tokens=True), think=rollout.think
        )
        next_observation, won_reward, done, step_info = env.step(command)
        turns.append(
            Turn(
                input_ids=np.asarray(input_ids, np.int32),
                output_ids=output_ids,
                output_logprobs=np.zeros(output_ids.shape, np.float32),
                output_versions=np.zeros(output_ids.shape, np.int32),
                finish_reason="stop",
                reply=reply,
                thought=parsed.thought,
                command=command,
                valid_reply=True,
                parse_error=None,
                observation=observation,
                next_observation=next_observation,
                admissible=bool(step_info["admissible"]),
                won=bool(step_info["won"]),
                env_reward=rollout.win_reward * float(won_reward),
                format_reward=0.0,
                seed=0,
                started_at=time.time(),
                latency_s=0.0,
            )
        )
        history.append((observation, command))
        if done:
            truncated_by = None if step_info["won"] else "step_limit"
            break
        input_ids = builder.next(
            previous_input=input_ids,
            previous_output=output_ids.tolist(),
            task=step_info["task"],
            observation=next_observation,
            admissible=step_info["admissible_commands"],
            history=history,
        )
        observation = next_observation
    if not turns:
        raise ValueError(
            f"game {game_index}: the first prompt ({len(input_ids)} tokens) does not fit "
            f"max_context_tokens={rollout.max_context_tokens}"
        )
    return Episode(
        episode_id="pending",
        source="expert_demo",
        split=env.split,
        game_index=game_index,
        game_id=info["game_id"],
        task=info["task"],
        task_type=info["task_type"],
        size=env.size,
        phrasing=env.phrasing,
        max_steps=env.max_steps,
        layout=rollout.layout,
        group_id=0,
        group_size=1,
        member=0,
        turns=tuple(turns),
        won=truncated_by is None,
        truncated_by=truncated_by,
        model_id=expert_model_id(env.expert),
        template_fingerprint=builder.fingerprint,
        decoding=decoding,
        worker_id=0,
        started_at=started_at,
    )
