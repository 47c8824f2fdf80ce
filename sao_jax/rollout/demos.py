"""Expert demonstrations in exactly the policy's format, written to ATDP for behaviour cloning.

Works for any registered env (`EnvConfig.name`). The expert's command at each step
(`TextEnv.expert_action`) is rendered as the reply the policy is asked for
(`harness.format_reply`: `<action>cmd</action>`, after an empty `<think></think>` when `think`
is on) and placed in the same token layout as rollouts (`PromptBuilder`), so a model cloned on demos sees at test time
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
from sao_jax.envs.base import STEP_INFO_KEYS, TextEnv, check_info, tagged_reply
from sao_jax.envs.registry import EnvConfig, env_class
from sao_jax.rollout.agent_loop import RolloutConfig
from sao_jax.rollout.episode import Episode, Turn
from sao_jax.rollout.prompts import PromptBuilder
from sao_jax.rollout.run_ids import check_run_id, demo_episode_id, new_run_id
from sao_jax.rollout.stats import RolloutStats
from sao_jax.tokenizers import Tokenizer


def expert_model_id(expert: str, env: str = "alfworld") -> str:
    """The `model_id` demos of that expert kind of `env` carry ("<env>-expert-<expert>", e.g.
    "alfworld-expert-search" / "alfworld-expert-oracle")."""
    experts = env_class(env).experts
    if expert not in experts:
        raise ValueError(f"unknown expert {expert!r}; expected one of {experts}")
    return f"{env}-expert-{expert}"


EXPERT_MODEL_IDS = {e: expert_model_id(e) for e in ("search", "oracle")}  # ALFWorld's
EXPERT_MODEL_ID = expert_model_id("search")  # the default expert's


def expert_reply(command: str, *, think: bool) -> str:
    """The reply text the policy should produce for `command` (the `<action>` tags every
    built-in harness reads; an env's own format: `harness.format_reply`)."""
    return tagged_reply(command, think=think)


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
    """Play `num_episodes` tasks of `env` (any registered env) with its expert and write them
    through `writer`.

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
    harness = env.env_class.harness
    builder = PromptBuilder.for_rollout(tokenizer, rollout, harness)
    im_end = builder.im_end_id
    decoding = DecodingParams(
        temperature=0.0, extra={"logprobs": "absent", "policy": f"expert-{env.expert}"}
    )
    (game_env,) = env.make_envs(1, indices=indices)
    stats, pending = RolloutStats(env.env_class.task_types), []
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
    env: TextEnv,
    tokenizer: Tokenizer,
    builder: PromptBuilder,
    rollout: RolloutConfig,
    im_end: int,
    decoding: DecodingParams,
) -> Episode:
    harness = type(env).harness
    game_index = env.sampler.next_index()
    observation, info = env.reset(game_index)
    started_at = time.time()
    input_ids = builder.first(info["task"], observation, info["admissible_commands"])
    turns, history, truncated_by = [], [], "step_limit"
    while True:
        if len(input_ids) + rollout.max_new_tokens > rollout.max_context_tokens:
            truncated_by = "context"
            break
        command = env.expert_action()
        if command is None:
            raise ValueError(f"the {env.name} expert has no action in game {game_index}")
        reply = harness.format_reply(command, think=rollout.think)
        output_ids = np.asarray([*tokenizer.encode(reply), im_end], np.int32)
        if output_ids.shape[0] > rollout.max_new_tokens:
            raise ValueError(
                f"the expert reply {reply!r} is {output_ids.shape[0]} tokens, more than "
                f"max_new_tokens={rollout.max_new_tokens}"
            )
        parsed = harness.parse_reply(
            tokenizer.decode(output_ids, skip_special_tokens=True), think=rollout.think
        )
        if not parsed.valid or parsed.action != command:
            raise ValueError(
                f"the expert reply {reply!r} does not read back as {command!r} through this "
                f"tokenizer ({parsed.error or parsed.action!r}): is every word in its vocabulary?"
            )
        next_observation, won_reward, done, step_info = env.step(command)
        check_info(step_info, STEP_INFO_KEYS, f"{type(env).__name__}.step")
        env_reward, _ = env.rewards(
            won_reward, valid_reply=True, admissible=True, weights=rollout.reward_weights
        )
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
                env_reward=env_reward,
                format_reward=0.0,
                seed=0,
                started_at=time.time(),
                latency_s=0.0,
                info=step_info,
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
        env=env.name,
        split=env.split,
        game_index=game_index,
        game_id=str(info["task_id"]),
        task=info["task"],
        task_type=info["task_type"],
        env_spec=env.task_spec(),
        max_steps=env.max_steps,
        layout=rollout.layout,
        group_id=0,
        group_size=1,
        member=0,
        turns=tuple(turns),
        won=truncated_by is None,
        truncated_by=truncated_by,
        model_id=expert_model_id(env.expert, env.name),
        template_fingerprint=builder.fingerprint,
        decoding=decoding,
        worker_id=0,
        started_at=started_at,
    )
