"""The online job's agent process and `AgentFleet`: bad input, and a dead agent fails the learner."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao_jax.pipeline.online_agent import AgentConfig
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
