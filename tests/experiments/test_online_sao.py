"""`python -m experiments.online_sao` end to end: a live server, the ALFWorld agent as a real
subprocess speaking the `openai` client, the SAO learner on the proxy's buffer, weights back to
the worker. Then: what the proxy recorded is what the agent saw and what the learner trains on."""

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from atdp_io import AtdpStore, EventKind, LateReward
from atdp_io.rows import pack_batch, trajectory_rows
from experiments import online_sao
from sao_jax.checkpoint import Checkpointer
from sao_jax.envs.alfworld import AlfworldEnv
from sao_jax.envs.base import PromptOptions
from sao_jax.envs.prompted import PromptedEnv
from sao_jax.metrics import read_metrics
from sao_jax.pipeline.setup import WARM_START_DIR, build_model, build_tokenizer
from sao_jax.train import Learner
from serving.proxy.responses import split_reasoning

REPO = Path(__file__).resolve().parents[2]
# The micro preset without cloning steps: the run is about the plumbing, not the learning.
MICRO = ["--config", "micro", "progress=false", "tensorboard=false", "warm_start.steps=0"]


@pytest.fixture(scope="module")
def online_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("online")
    summary = online_sao.main([*MICRO, "--out", str(out)])
    return out, summary


@pytest.fixture(scope="module")
def agent_episodes(online_run):
    out, _ = online_run
    lines = (out / "agent" / "episodes.jsonl").read_text().splitlines()
    return {e["trajectory_id"]: e for e in map(json.loads, lines)}


@pytest.mark.slow
def test_online_run_trains_on_served_data_and_serves_the_new_weights(online_run, agent_episodes):
    out, summary = online_run
    saved = json.loads((out / "summary.json").read_text())
    for key in ("unseen_success_start", "unseen_success_end", "seen_success_end", "wall_seconds"):
        assert saved[key] is not None, key
    assert saved["policy_steps"] == summary["policy_steps"] == 2
    serving = saved["serving"]
    # every completion the agent got was answered and recorded (message + llm_call events)
    stats = json.loads((out / "agent" / "stats.json").read_text())  # written on a clean exit
    assert serving["agent_exit_status"] == 0 and stats["errors"] == 0
    assert serving["requests"] >= stats["requests"] > 0
    assert serving["events_recorded"] >= 2 * stats["requests"]
    assert serving["rewards_recorded"] == stats["rewards_posted"] > 0
    # each published update was swapped into the worker, and later completions say so
    assert serving["weight_swaps"] == 2 and serving["served_policy_version"] == 2
    versions = [c["policy_version"] for e in agent_episodes.values() for c in e["calls"]]
    assert min(versions) == 0 and max(versions) >= 1
    assert serving["dropped_stale"] > 0  # max_staleness=0 drops the version-0 calls after step 1
    records = read_metrics(out)
    rl = [r for r in records if "serving/requests" in r]
    assert [r["policy_version"] for r in rl] == [1.0, 2.0]
    assert all(r["batch/staleness_max"] == 0.0 for r in rl)
    assert (out / "learning_curve.png").stat().st_size > 10_000


@pytest.mark.slow
def test_recorded_calls_become_the_learner_rows_the_agent_saw(online_run, agent_episodes):
    out, _ = online_run
    config = online_sao.micro()
    tokenizer = build_tokenizer(config.experiment())
    reader = AtdpStore.open(str(out / "atdp")).reader("online", principal="online")
    reader.refresh()
    closed = [t for t in map(reader.read, reader.trajectory_ids()) if t.outcome is not None]
    assert {t.trajectory_id for t in closed} == set(agent_episodes)
    version_zero_rows = []
    sources = collections.Counter()
    for trajectory in closed:
        episode = agent_episodes[trajectory.trajectory_id]
        assert trajectory.outcome.success == episode["won"]
        prompts = [
            e.observation["content"] for e in trajectory.events if e.kind == EventKind.MESSAGE
        ]
        llm_events = trajectory.llm_events()
        calls = [e.llm for _, e in llm_events]
        late = collections.defaultdict(dict)  # rewards posted per completion (late-bound)
        for note in trajectory.annotations:
            if isinstance(note, LateReward):
                late[note.event_index][note.reward.source] = note.reward.value
        assert len(calls) == len(prompts) == len(episode["calls"])
        # the prompts reached the record unchanged (no redaction hit the game's text)
        replayed_prompts, replayed_rewards = _harness_replay(config, episode)
        assert prompts == replayed_prompts
        # each call carries, by source, the rewards the rollout engine gives the same turn
        # under the run's reward settings (refused commands included)
        for (index, _), expected in zip(llm_events, replayed_rewards, strict=True):
            assert late.pop(index, {}) == pytest.approx(expected)
            sources.update(expected.items())
        assert not late  # nothing posted on anything but a completion
        rows, _ = trajectory_rows(trajectory, "windowed")
        for prompt, call, sent, row in zip(prompts, calls, episode["calls"], rows, strict=True):
            # the exact tokens the cloned policy was trained on: the harness prompt as one
            # ChatML user turn (what the rollout engine's windowed layout feeds the sampler)
            expected = tokenizer.encode_chat([{"role": "user", "content": prompt}])
            np.testing.assert_array_equal(call.input_ids, expected)
            # token-exact: the client received the decoded ids, special tokens included, up to
            # the stop token (recorded, never shown), a leading <think> block as
            # reasoning_content and the rest as content (what the agent acted on)
            shown = call.output_ids
            if shown.size and shown[-1] in tokenizer.stop_ids:
                shown = shown[:-1]
            assert (split_reasoning(tokenizer.decode(shown))[1] or "") == sent["reply"]
            assert call.output_ids[-1] in tokenizer.stop_ids or call.finish_reason == "length"
            n_in, n_out = len(call.input_ids), len(call.output_ids)
            np.testing.assert_array_equal(row.loss_mask, np.r_[np.zeros(n_in), np.ones(n_out)])
            # the response reports the version of its first token; a weight swap during the
            # reply moves the later tokens to the new version, never back
            reply_versions = row.versions[n_in:]
            assert reply_versions[0] == sent["policy_version"]
            assert (np.diff(reply_versions) >= 0).all()
            assert row.rewards[-1] == pytest.approx(sent["reward"]) and not row.rewards[:-1].any()
            if not reply_versions.any():
                version_zero_rows.append(row)
    # the uncloned policy writes malformed replies (refused commands and repeats, which need
    # a well-formed reply, are checked on a real game in tests/pipeline/test_online_agent.py)
    assert sources["format", config.rollout.invalid_reply_penalty] > 0, sources
    # recorded log-probs are the served policy's own (temperature 1): recompute them
    policy = build_model(config.experiment(), tokenizer)
    with Checkpointer(out / WARM_START_DIR, create=False) as saved:
        policy = saved.restore({"policy": policy}).items["policy"]
    rows = version_zero_rows[:16]
    batch = pack_batch([[r] for r in rows], len(rows), max(r.length for r in rows))
    learner = Learner(config.learner, policy)
    logp = learner.policy_logprobs(batch)
    mask = batch["loss_mask"] > 0
    np.testing.assert_allclose(logp[mask], batch["rollout_logp"][mask], atol=2e-3)


@pytest.mark.slow
def test_ctrl_c_stops_the_agent_and_the_server_and_leaves_nothing_running(tmp_path):
    out = tmp_path / "run"
    # more policy steps than the run can take before the interrupt: it must not end by itself
    argv = [*MICRO, "--out", str(out), "online.policy_steps=5000", "eval.num_games=1"]
    # a job started in the background ignores SIGINT; a terminal's foreground job does not
    launcher = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv = ['online_sao', *sys.argv[1:]]; "
        "runpy.run_module('experiments.online_sao', run_name='__main__', alter_sys=True)"
    )
    command = [sys.executable, "-c", launcher, *argv]
    stderr = tmp_path / "stderr.log"
    with open(stderr, "w") as sink:  # a file, not a pipe: a full pipe would block the run
        run = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=sink,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )  # fmt: skip
    episodes = out / "agent" / "episodes.jsonl"
    try:
        deadline = time.time() + 300
        while not (episodes.exists() and episodes.stat().st_size) and time.time() < deadline:
            assert run.poll() is None, stderr.read_text()
            time.sleep(0.5)
        os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C sends: the whole group
        assert run.wait(120) == 130, stderr.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert "interrupted; resume with" in stderr.read_text()
    left = subprocess.run(["pgrep", "-g", str(run.pid)], capture_output=True, text=True)
    assert left.stdout == "", subprocess.run(["ps", "-o", "pid,cmd", "-g", str(run.pid)],
                                             capture_output=True, text=True).stdout  # fmt: skip
    assert json.loads((out / "agent" / "stats.json").read_text())["errors"] == 0


def _harness_replay(config, episode) -> tuple[list[str], list[dict[str, float]]]:
    """The prompts the agent sent in `episode` and the rewards the rollout engine gives each
    turn ({source: value}, zeros left out), replayed on a fresh game with its replies."""
    env = AlfworldEnv(
        config.env.split, size=config.env.size, phrasing=config.env.phrasing,
        max_steps=config.env.max_steps,
    )  # fmt: skip
    rollout = config.rollout
    options = PromptOptions(  # the run's prompt settings, which the agent was given
        history_length=rollout.history_length, think=False, memory_line=rollout.memory_line,
        style=rollout.prompt_style,
    )  # fmt: skip
    harness = PromptedEnv(env, options, rollout.reward_weights)
    prompt, _ = harness.reset(episode["game"])
    prompts, rewards = [prompt], []
    for call in episode["calls"]:
        prompt, _, _, info = harness.step(call["reply"])
        prompts.append(prompt)
        turn = {"env": info["env_reward"], "format": info["format_reward"]}
        if info["repeated_observation"]:
            turn["novelty"] = rollout.repeat_penalty
        rewards.append({source: value for source, value in turn.items() if value != 0.0})
    return prompts[:-1], rewards


def test_bad_config_exits_with_a_message_naming_the_problem(tmp_path, capsys):
    cases = {
        "rollout.layout=concat": "rollout.layout must be 'windowed'",
        "learner.algorithm=grpo": "learner.algorithm must be one of ('sao', 'sao_seed') online",
        "agent.concurrency=0": "agent.concurrency must be >= 1",
        "serving.num_slots=0": "serving.num_slots must be >= 1",
        "online.max_staleness=-1": "online.max_staleness must be >= 0",
        "online.polcy_steps=3": "online.polcy_steps",
        "serving.max_staleness=1": "the agent would wait on 429s forever",
    }
    for override, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            online_sao.main(["--out", str(tmp_path), *override.split()])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err, override
    # enough capacity for the critic warm-up and the games in flight: accepted
    assert online_sao.parse(["--out", str(tmp_path), "serving.max_staleness=10"]).serving


def test_the_agent_keeps_its_experiments_command():
    """`python -m experiments.online_agent` runs the library's agent (the same checks)."""
    result = subprocess.run(
        [sys.executable, "-m", "experiments.online_agent", "--url", "localhost:9"],
        cwd=REPO, env={**os.environ, "SAO_ADMIN_KEY": "k"}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "AgentConfig.url" in result.stderr
