"""Hermes Agent (hermes-agent 0.19.0, unmodified, in its own venv `.venv-hermes/`) runs headless
turns against `python -m serving --config tiny_64k` on loopback.

Hermes refuses a model that advertises under 64K positions; its first call is a ~28K-token
prompt (system prompt + 17 tool schemas), streamed, with max_tokens = the advertised context.
The server clamps that to `--max-completion-tokens`; on finish_reason "length" Hermes asks the
model to continue (re-sending the whole conversation), so one `hermes -z` makes several calls
over the same 28K-token prefix, which the worker's prefix cache encodes once. Hermes' state
(HERMES_HOME, HOME) lives in the test's tmp dir; outbound HTTP goes to a closed loopback port
(proxy variables), so nothing leaves the machine.
"""

import os
import re
import subprocess

import httpx
import pytest
from hermes_venv import ensure_hermes_venv
from serving_harness import (
    ADMIN_KEY,
    api,
    free_port,
    read_trajectories,
    start_process,
    stop_process,
    subprocess_env,
    wait_healthy,
)

from atdp_io import EventKind

COMPLETION_CAP = 16
TENANT = "hermes"


@pytest.fixture(scope="module")
def hermes():
    """The `hermes` executable of `.venv-hermes/` (created here when missing: needs pip)."""
    try:
        return ensure_hermes_venv()
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"cannot create the Hermes Agent venv: {error}")


def metric(url: str, name: str) -> float:
    text = httpx.get(
        url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30
    ).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def hermes_env(tmp_path, hermes) -> dict[str, str]:
    """Hermes' environment: its own HOME and HERMES_HOME, no route off the machine."""
    dead = "http://127.0.0.1:9"  # discard port: any outbound request fails at once
    return {
        "PATH": f"{hermes.parent}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "HERMES_HOME": str(tmp_path / "hermes_home"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        **{name: dead for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
        **{name.lower(): dead for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_hermes_agent_headless_turns_against_python_m_serving(tmp_path, hermes):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    buffer = tmp_path / "buffer"
    log = tmp_path / "server.log"
    server = start_process(
        [
            "serving", "--config", "tiny_64k", "--port", str(port), "--buffer", str(buffer),
            "--admin-key", ADMIN_KEY, "--num-slots", "2",
            "--max-completion-tokens", str(COMPLETION_CAP),
        ],
        subprocess_env(tmp_path / "jax_cache"),
        log,
    )  # fmt: skip
    try:
        wait_healthy(url, server, log)
        status, session = api(url, "/rl/start_session", {"tenant": TENANT})
        assert status == 200, session
        home = tmp_path / "hermes_home"
        home.mkdir()
        (tmp_path / "home").mkdir()
        (tmp_path / "work").mkdir()
        (home / "config.yaml").write_text(
            "model:\n"
            "  provider: custom\n"
            f"  base_url: {url}/v1\n"
            f"  api_key: {session['api_key']}\n"
            f"  default: {session['model']}\n"
        )
        env = hermes_env(tmp_path, hermes)
        run = subprocess.run(
            [str(hermes), "-z", "Say hello."],
            env=env,
            cwd=tmp_path / "work",
            capture_output=True,
            text=True,
            timeout=1500,
        )
        assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
        assert run.stdout.strip(), "hermes -z printed no reply"
        prompt_tokens = metric(url, "sao_worker_prompt_tokens_total")
        encoded = metric(url, "sao_worker_prefill_tokens_total")
    finally:
        stop_process(server)

    trajectory = read_trajectories(buffer, TENANT)[session["session_id"]]
    calls = [e.llm for e in trajectory.events if e.kind == EventKind.LLM_CALL]
    assert calls, "the data proxy recorded no llm_call from Hermes"
    first = calls[0]
    assert first.input_ids.shape[0] > 20_000  # Hermes' system prompt and tool schemas
    assert first.decoding.extra["requested_max_tokens"] == 65_536  # the advertised context
    assert first.decoding.max_tokens == COMPLETION_CAP
    messages = [e.observation for e in trajectory.events if e.kind == EventKind.MESSAGE]
    assert messages[0]["role"] == "system"
    assert (messages[1]["role"], messages[1]["content"]) == ("user", "Say hello.")
    if len(calls) > 1:  # each continuation re-sends the 28K-token prefix: encoded once
        first_length = first.input_ids.shape[0]
        assert encoded - first_length < (prompt_tokens - first_length) / 10
    assert os.listdir(tmp_path / "hermes_home")  # Hermes kept its state in the tmp dir
