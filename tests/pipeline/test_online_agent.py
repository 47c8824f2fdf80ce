"""The online job's agent process and `AgentFleet`: bad input, the rewards a served turn posts,
and a dead agent fails the learner."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.base import PromptOptions, RewardWeights
from sao_jax.envs.prompted import PromptedEnv
from sao_jax.pipeline.online_agent import Agent, AgentConfig, parse_args, posted_rewards
from sao_jax.pipeline.online_serving import AgentError, AgentFleet

REPO = Path(__file__).resolve().parents[2]


def _agent(*args, env=None, timeout=60):
    env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "sao_jax.pipeline.online_agent", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_agent_refuses_bad_input_clearly():
    no_key = _agent("--url", "http://127.0.0.1:9", env={"SAO_ADMIN_KEY": ""})
    assert no_key.returncode == 2 and "SAO_ADMIN_KEY" in no_key.stderr
    bad_url = _agent("--url", "localhost:9", env={"SAO_ADMIN_KEY": "k"})
    assert bad_url.returncode == 2 and "AgentConfig.url" in bad_url.stderr
    bad_count = _agent("--url", "http://127.0.0.1:9", "--concurrency", "0")
    assert bad_count.returncode == 2 and "AgentConfig.concurrency" in bad_count.stderr
    bad_env = _agent("--url", "http://127.0.0.1:9", "--env", "nope", env={"SAO_ADMIN_KEY": "k"})
    assert bad_env.returncode == 2 and "unknown env 'nope'" in bad_env.stderr


def test_a_dead_agent_fails_the_learner_instead_of_hanging(tmp_path):
    # nothing listens on port 9: every call fails, the agent gives up after 2 in a row
    config = AgentConfig(
        url="http://127.0.0.1:9", concurrency=1, max_retries=0, max_consecutive_errors=2
    )
    fleet = AgentFleet(config, "key", tmp_path)
    fleet.start()

    try:
        with pytest.raises(AgentError, match="exited with status 1") as error:
            next(fleet.guard(_never_ending(), poll_s=0.05))
        assert "calls failed" in str(error.value)
    finally:
        assert fleet.stop() == 1
    assert json.loads(fleet.stats_path.read_text())["errors"] == 2


def _never_ending():
    """A stream that never yields (a learner polling a buffer nobody writes)."""
    while True:
        time.sleep(0.05)
        yield from ()


def test_a_served_turn_posts_what_the_rollout_engine_gives_it():
    # the rollout's rewards on a real game: malformed, refused, admitted, a repeat, the win
    weights = RewardWeights(win_reward=10.0, invalid_reply_penalty=-0.1, inadmissible_penalty=-1.0)
    env = AlfworldEnv("valid_seen", size="small", expert_in_info=True)
    prompted = PromptedEnv(env, PromptOptions(history_length=1, style="compact"), weights)
    _, info = prompted.reset(0)
    first, second = [c for c in info["admissible_commands"] if c.startswith("go to ")][:2]
    replies = ["no block", "<action>fly away</action>"] + [
        f"<action>{c}</action>" for c in (first, second, first)
    ]
    infos = [prompted.step(reply)[3] for reply in replies]
    while not infos[-1]["won"]:
        infos.append(prompted.step(f"<action>{infos[-1]['expert_action']}</action>")[3])
    posted = [posted_rewards(info, repeat_penalty=-0.5) for info in infos]
    assert posted[:5] == [[(-0.1, "format")], [(-1.0, "format")], [], [], [(-0.5, "novelty")]]
    assert posted[-1] == [(10.0, "env")] and infos[-1]["won"]
    # without a repeat penalty nothing is posted for the repeat; the rest is the same
    plain = [posted_rewards(info, repeat_penalty=0.0) for info in infos]
    no_novelty = [[r for r in rewards if r[1] != "novelty"] for rewards in posted]
    assert plain == no_novelty and plain[4] == []
    novel = [any(r[1] == "novelty" for r in rewards) for rewards in posted]
    assert novel == [info["repeated_observation"] for info in infos]


def test_the_agent_takes_every_reward_and_prompt_setting_of_the_rollout():
    config, _ = parse_args(
        ["--url", "http://127.0.0.1:9", "--inadmissible-penalty", "-1", "--repeat-penalty",
         "-0.5", "--memory-line", "--prompt-style", "compact"]
    )  # fmt: skip
    assert (config.inadmissible_penalty, config.repeat_penalty, config.memory_line) == (
        -1.0,
        -0.5,
        True,
    )
    agent = Agent(config, "key")
    assert agent.reward_weights == RewardWeights(10.0, -0.1, -1.0)
    assert agent.prompt_options == PromptOptions(1, False, True, "compact")
