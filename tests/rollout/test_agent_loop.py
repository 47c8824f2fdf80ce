"""Agent loop: episodes in both layouts become ATDP rows whose tokens, masks and log-probs are
exactly what the sampler produced (and what a full forward pass gives), concat keeps the
prefix property, truncation, groups, slot refill == lock-step, version stamping."""

import numpy as np
import pytest
from rollout_testlib import (
    NUM_ENVS,
    borrowed_sampler,
    env_config,
    forward_logprobs,
    model,
    model_config,
    open_store,
    other_weights,
    read_batches,
    rollout_config,
    sampler,
    tokenizer,
)

from atdp_io import EventKind
from sao_jax.envs.alfworld import AlfworldHarness, HarnessConfig
from sao_jax.rollout import AgentLoop, RolloutConfig, WeightPublisher, sync_sampler
from sao_jax.rollout.agent_loop import _reply_penalty
from sao_jax.rollout.prompts import template_fingerprint


def play(config, *, episodes=NUM_ENVS, env=None, games=None, **kwargs):
    loop = AgentLoop(sampler(), tokenizer(), (env or env_config()).make_envs(NUM_ENVS), config)
    groups = list(loop.play(games, max_episodes=episodes, **kwargs))
    return [e for g in groups for e in g], groups


def write(tmp_path, episodes, tenant="alfworld"):
    store = open_store(tmp_path / "atdp")
    with store.writer(tenant) as writer:
        writer.append([e.to_trajectory(tenant=tenant) for e in episodes])
    return store


def check_rows_against_turns(batch, rows_turns):
    """Each batch row r holds exactly turns `rows_turns[r]` (a list of (offset, Turn))."""
    for r, placed in enumerate(rows_turns):
        mask = np.zeros(batch["tokens"].shape[1], np.int32)
        for offset, turn in placed:
            n = turn.output_ids.shape[0]
            span = slice(offset, offset + n)
            np.testing.assert_array_equal(batch["tokens"][r, span], turn.output_ids)
            np.testing.assert_array_equal(batch["rollout_logp"][r, span], turn.output_logprobs)
            np.testing.assert_array_equal(batch["versions"][r, span], turn.output_versions)
            reward = batch["rewards"][r, offset + n - 1]
            assert reward == pytest.approx(turn.reward)
            mask[span] = 1
        np.testing.assert_array_equal(batch["loss_mask"][r], mask)
    # The recorded log-probs are the policy's own: one full forward pass agrees.
    logp = forward_logprobs(batch["tokens"], batch["segment_ids"])
    on = batch["loss_mask"] > 0
    np.testing.assert_allclose(batch["rollout_logp"][on], logp[on], atol=2e-4)


def test_windowed_rows_equal_sampler_output_and_forward_pass(tmp_path):
    episodes, _ = play(rollout_config(layout="windowed"))
    assert len(episodes) == NUM_ENVS and all(e.steps == 3 for e in episodes)
    assert all(e.truncated_by == "step_limit" and not e.won for e in episodes)
    store = write(tmp_path, episodes)
    (batch,), _ = read_batches(store, "alfworld", "windowed")
    turns = [t for e in episodes for t in e.turns]
    assert (batch["traj_index"] >= 0).sum() == len(turns)
    for r, turn in enumerate(turns):
        row = np.concatenate([turn.input_ids, turn.output_ids])
        np.testing.assert_array_equal(batch["tokens"][r, : row.shape[0]], row)
    check_rows_against_turns(batch, [[(t.input_ids.shape[0], t)] for t in turns])


@pytest.mark.parametrize("style", ["paper", "compact"])
def test_windowed_prompts_are_the_harness_prompts(style):
    """Turn k's input decodes to the chat-templated `AlfworldHarness` prompt after the same
    commands, and rewards follow the harness's rules."""
    config = rollout_config(layout="windowed", history_length=2, prompt_style=style)
    (episode, *_), _ = play(config, episodes=1)
    env = env_config().make_envs(1)[0]
    harness = AlfworldHarness(env, HarnessConfig(history_length=2, think=False, prompt_style=style))
    prompt, _ = harness.reset(episode.game_index)
    tok = tokenizer()
    for turn in episode.turns:
        expected = tok.encode_chat([{"role": "user", "content": prompt}])
        assert turn.input_ids.tolist() == expected
        prompt, reward, _, info = harness.step(turn.reply)
        assert turn.env_reward + turn.format_reward == pytest.approx(reward)
        assert turn.command == (info["reply"].action if info["reply"].valid else "")


def test_concat_prefix_property_single_row_and_truncation(tmp_path, monkeypatch):
    """Concat inputs extend the previous input + output by appended ids (the slot's cache is
    kept: only new ids are encoded); the loader merges each episode into one row; an episode
    that would overflow the context ends truncated."""
    extended = []
    extend = sampler().extend

    def counting_extend(state, continuations, slots, sampling, **kwargs):
        extended.extend(len(c) for c in continuations)
        return extend(state, continuations, slots, sampling, **kwargs)

    monkeypatch.setattr(sampler(), "extend", counting_extend)
    config = rollout_config(layout="concat")
    episodes, _ = play(config, env=env_config(max_steps=40))
    assert len(extended) == sum(e.steps - 1 for e in episodes) and max(extended) < 200
    tok = tokenizer()
    for episode in episodes:
        for prev, turn in zip(episode.turns, episode.turns[1:], strict=False):
            context = np.concatenate([prev.input_ids, prev.output_ids])
            np.testing.assert_array_equal(turn.input_ids[: context.shape[0]], context)
            appended = tok.decode(turn.input_ids[context.shape[0] :])
            assert appended.startswith("<|im_end|>" * (prev.finish_reason == "length"))
            assert "<|im_start|>user\nYou are now at step" in appended
            assert appended.endswith("<|im_end|>\n<|im_start|>assistant\n")
        assert episode.truncated_by == "context" and 1 < episode.steps < 40
        last = episode.turns[-1]
        assert last.input_ids.shape[0] + config.max_new_tokens <= config.max_context_tokens
        outcome = episode.to_trajectory(tenant="alfworld").outcome
        assert outcome.terminated is False and outcome.info["truncated_by"] == "context"
    store = write(tmp_path, episodes)
    (batch,), loader = read_batches(store, "alfworld", "concat")
    assert loader.stats.snapshot().get("concat_fallbacks", 0) == 0
    assert (batch["traj_index"] >= 0).sum() == len(episodes)  # one row per episode
    for r, episode in enumerate(episodes):
        last = episode.turns[-1]
        full = np.concatenate([last.input_ids, last.output_ids])
        np.testing.assert_array_equal(batch["tokens"][r, : full.shape[0]], full)
    check_rows_against_turns(
        batch, [[(t.input_ids.shape[0], t) for t in e.turns] for e in episodes]
    )


def test_compact_concat_turns_append_only_the_new_observation_and_actions():
    config = rollout_config(layout="concat", prompt_style="compact")
    episodes, _ = play(config, episodes=2, env=env_config(max_steps=3))
    tok = tokenizer()
    for episode in episodes:
        first = tok.decode(episode.turns[0].input_ids)
        assert "Your task is to: " in first and "You are an expert agent" not in first
        for k, (prev, turn) in enumerate(zip(episode.turns, episode.turns[1:], strict=False)):
            context = np.concatenate([prev.input_ids, prev.output_ids])
            np.testing.assert_array_equal(turn.input_ids[: context.shape[0]], context)
            appended = tok.decode(turn.input_ids[context.shape[0] :])
            assert f"<|im_start|>user\nStep {k + 2}. Your current observation is: " in appended
            assert "Your admissible actions are: " in appended and "Now it's" not in appended
    recorded = {e.template_fingerprint for e in episodes}
    assert recorded == {template_fingerprint("concat", 2, False, prompt_style="compact")}
    assert recorded != {template_fingerprint("concat", 2, False)}  # the style is recorded


def test_group_sampling_plays_each_game_g_times_and_writes_groups_contiguously(tmp_path):
    config = rollout_config(group_size=2)
    episodes, groups = play(config, episodes=6)
    assert [len(g) for g in groups] == [2, 2, 2]
    for group in groups:
        assert len({e.game_index for e in group}) == 1
        assert [e.member for e in group] == [0, 1] and len({e.group_id for e in group}) == 1
        # Different sampling seeds: the members do not replay each other's tokens.
        assert group[0].turns[0].seed != group[1].turns[0].seed
    assert len({g[0].group_id for g in groups}) == 3
    store = write(tmp_path, episodes)
    reader = store.reader("alfworld", principal="alfworld")
    reader.refresh()
    tasks = [reader.read(i).header.task for i in reader.trajectory_ids()]
    assert [(t["group_id"], t["member"]) for t in tasks] == [
        (e.group_id, e.member) for e in episodes
    ]
    assert all(t["group_size"] == 2 and t["source"] == "rollout" for t in tasks)
    # group_key (what the loader's group_by reads) is shared by a group's members only
    keys = [t["group_key"] for t in tasks]
    assert keys[0::2] == keys[1::2] and len(set(keys)) == 3


def test_slot_refill_and_lockstep_play_identical_episodes():
    """Per-call seeds and dropless routing make every row independent of its batch
    neighbours, so the schedule changes nothing but speed."""
    games = [5, 9, 11, 20, 7]
    cont, _ = play(rollout_config(refill="continuous"), episodes=5, games=games)
    lock, _ = play(rollout_config(refill="lockstep"), episodes=5, games=games)
    key = lambda e: (e.game_index, e.member)  # noqa: E731
    for a, b in zip(sorted(cont, key=key), sorted(lock, key=key), strict=True):
        assert a.game_index == b.game_index and a.steps == b.steps
        for ta, tb in zip(a.turns, b.turns, strict=True):
            np.testing.assert_array_equal(ta.output_ids, tb.output_ids)
            np.testing.assert_allclose(ta.output_logprobs, tb.output_logprobs, atol=1e-5)


def test_versions_are_stamped_per_token_across_a_mid_run_update(tmp_path):
    """Weights published while episodes run are picked up at the next dispatch; every token
    carries the version that sampled it, and rows report it."""
    publisher = WeightPublisher()
    publisher.publish(model(), 0)
    new_weights = other_weights()
    dispatches = []
    with borrowed_sampler() as own:
        own.update_weights(publisher.latest().params, 0)

        def before_dispatch():
            dispatches.append(own.policy_version)
            if len(dispatches) == 6:
                publisher.publish(new_weights, 1)
            sync_sampler(own, publisher)

        # concat: a slot's cached prefix from the old weights must not be reused
        config = rollout_config(layout="concat")
        loop = AgentLoop(own, tokenizer(), env_config().make_envs(NUM_ENVS), config)
        plays = loop.play(max_episodes=4, before_dispatch=before_dispatch)
        episodes = [e for g in plays for e in g]
        assert own.policy_version == 1 and dispatches.count(0) == 6
    versions = {int(v) for e in episodes for t in e.turns for v in t.output_versions}
    assert versions == {0, 1}
    for episode in episodes:
        for turn in episode.turns:  # versions never go back within a call
            assert np.all(np.diff(turn.output_versions) >= 0)
            assert turn.policy_version == turn.output_versions[0]
    # A call sampled entirely after the update scores exactly under the new weights.
    late = [t for e in episodes for t in e.turns if t.output_versions.min() == 1]
    assert late
    turn = late[-1]
    row = np.concatenate([turn.input_ids, turn.output_ids])[None]
    logp = forward_logprobs(row, np.ones_like(row), new_weights)[0, turn.input_ids.shape[0] :]
    np.testing.assert_allclose(turn.output_logprobs, logp, atol=2e-4)
    store = write(tmp_path, episodes)
    (batch,), _ = read_batches(store, "alfworld", "concat")
    assert set(np.unique(batch["versions"][batch["loss_mask"] > 0])) == {0, 1}


def test_every_llm_call_is_recorded_losslessly():
    (episode, *_), _ = play(rollout_config(temperature=0.8, top_k=50), episodes=1)
    trajectory = episode.to_trajectory(tenant="alfworld")
    kinds = [e.kind for e in trajectory.events]
    assert kinds == [EventKind.LLM_CALL, EventKind.ENV_STEP] * episode.steps
    assert trajectory.header.governance.training_eligible
    task = trajectory.header.task
    assert task["game_id"] == episode.game_id and task["task_type"] == episode.task_type
    for k, (_, call_event) in enumerate(trajectory.llm_events()):
        call, turn = call_event.llm, episode.turns[k]
        assert call.decoding.temperature == 0.8 and call.decoding.top_k == 50
        assert call.decoding.seed == turn.seed and call.decoding.max_tokens == 12
        assert "<|im_end|>" in call.decoding.stop
        assert call.prompt_template_fingerprint.startswith("alfworld-")
        assert call.finish_reason == turn.finish_reason
        step = trajectory.events[2 * k + 1]
        assert step.action.text == turn.command and step.observation == turn.next_observation
        assert step.result["invalid_reply"] == (not turn.valid_reply)


def test_bad_configs_name_the_problem():
    with pytest.raises(ValueError, match="layout"):
        RolloutConfig(layout="sliding")
    with pytest.raises(ValueError, match="max_new_tokens"):
        RolloutConfig(max_new_tokens=64, max_context_tokens=64)
    with pytest.raises(ValueError, match="group_size"):
        RolloutConfig(group_size=0)
    with pytest.raises(ValueError, match="temperature"):
        RolloutConfig(temperature=-1.0)
    too_long = rollout_config(max_context_tokens=model_config().max_seq_len * 2)
    with pytest.raises(ValueError, match="max_seq_len"):
        AgentLoop(sampler(), tokenizer(), env_config().make_envs(1), too_long)
    with pytest.raises(ValueError, match="TextEnv"):
        AgentLoop(sampler(), tokenizer(), [], rollout_config())

    class Stream:  # a home-made task stream: draws, but keeps no outcomes
        def next_index(self):
            return 0

    envs = env_config().make_envs(1)
    envs[0].sampler = Stream()
    with pytest.raises(TypeError, match=r"Stream, which lacks \['record', .*TaskSampler"):
        AgentLoop(sampler(), tokenizer(), envs, rollout_config())


def test_reply_penalty_malformed_first_then_inadmissible_off_by_default():
    default = RolloutConfig()
    assert _reply_penalty(default, valid=False, admissible=False) == default.invalid_reply_penalty
    # the papers' reward: a well-formed reply is never penalised, admissible or not
    assert _reply_penalty(default, valid=True, admissible=False) == 0.0
    shaped = RolloutConfig(inadmissible_penalty=-0.2)
    assert _reply_penalty(shaped, valid=True, admissible=False) == -0.2
    assert _reply_penalty(shaped, valid=True, admissible=True) == 0.0
    assert _reply_penalty(shaped, valid=False, admissible=False) == shaped.invalid_reply_penalty
