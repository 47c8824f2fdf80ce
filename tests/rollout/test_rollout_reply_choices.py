"""`RolloutConfig.reply_choices`: every reply is one of the listed actions, the call records its
grammar as the serving proxy does, training rebuilds the masks from the record, and the
learner's masked log-prob at the rollout weights equals the recorded behaviour one (DIS ratio
1); without the masks the same tokens give another ratio."""

import dataclasses

import numpy as np
import pytest
from rollout_testlib import (
    NUM_ENVS,
    dis_learner,
    env_config,
    model_config,
    open_store,
    read_batches,
    rollout_config,
    sampler,
    tokenizer,
)

from atdp_io.mask_replay import MaskReplay
from atdp_io.token_masks import MASK_KEYS
from sao_jax.envs.alfworld import ALFWORLD_PROMPTS
from sao_jax.rollout import AgentLoop, evaluate
from sao_jax.rollout.choices import ChoiceMasks

TENANT = "choices"
ROWS = 32


def play(layout="windowed", **decoding):
    config = rollout_config(layout=layout, reply_choices=True, prompt_style="compact", **decoding)
    loop = AgentLoop(sampler(), tokenizer(), env_config().make_envs(NUM_ENVS), config)
    return [e for g in loop.play(max_episodes=NUM_ENVS) for e in g]


@pytest.mark.parametrize("layout", ["windowed", "concat"])
def test_every_reply_is_a_listed_action_and_trains_with_its_mask(tmp_path, layout):
    episodes = play(layout)
    turns = [t for e in episodes for t in e.turns]
    assert len(turns) >= NUM_ENVS
    for episode in episodes:
        calls = [e.llm for e in episode.to_trajectory(tenant=TENANT).events if e.llm]
        for turn, call in zip(episode.turns, calls, strict=True):
            # the random policy only ever says what the room admits
            assert turn.valid_reply and turn.admissible, turn.reply
            # spelled as one of the turn's choices, token for token, then the stop token
            reply = " ".join(f"<[{i}]>" for i in turn.output_ids[:-1].tolist())
            assert f"({reply})" in turn.grammar and turn.output_ids[-1] in tokenizer().stop_ids
            assert call.decoding.extra["grammar"] == turn.grammar
            assert np.float32(call.decoding.extra["sampled_logprobs"]).shape == (
                turn.output_ids.shape
            )
            # masked renormalisation can only raise a token's probability
            assert np.all(turn.sampled_logprobs >= turn.output_logprobs - 1e-5)
    # the masks took mass away somewhere (a random policy puts some outside any action)
    gaps = np.concatenate([t.sampled_logprobs - t.output_logprobs for t in turns])
    assert gaps.max() > 0.1

    store = open_store(tmp_path / "atdp")
    with store.writer(TENANT) as writer:
        writer.append([e.to_trajectory(tenant=TENANT) for e in episodes])
    replay = MaskReplay.from_tokenizer(tokenizer(), model_config().vocab_size)
    (batch,), _ = read_batches(store, TENANT, layout, rows=ROWS, mask_replay=replay)
    assert set(MASK_KEYS) <= set(batch)
    action = batch["loss_mask"] > 0
    # forced tokens (one allowed id, e.g. the reply's closing tag) carry no choice: left out
    assert 0 < action.sum() < sum(t.output_ids.shape[0] for t in turns)
    logp = dis_learner().policy_logprobs(batch)
    ratio = np.exp(logp - batch["rollout_logp"])
    np.testing.assert_allclose(ratio[action], 1.0, atol=2e-4)
    # not vacuous: without the masks the same tokens are scored under the full vocabulary
    unmasked = {k: v for k, v in batch.items() if k not in MASK_KEYS}
    raw = np.exp(dis_learner().policy_logprobs(unmasked) - batch["rollout_logp"])
    assert np.abs(raw[action] - 1).max() > 1e-2


def test_greedy_evaluation_under_the_choices_never_refuses_a_command():
    def greedy(reply_choices):
        rollout = rollout_config(prompt_style="compact", reply_choices=reply_choices)
        return evaluate(
            sampler(),
            tokenizer(),
            split="valid_seen",
            num_games=4,
            num_envs=4,
            rollout=rollout,
            env=env_config(),
        )

    free, kept = greedy(False), greedy(True)
    assert free.invalid_reply_rate + free.inadmissible_rate > 0.5  # a random policy, free
    assert kept.invalid_reply_rate == kept.inadmissible_rate == 0.0


def test_reply_choices_refuse_what_they_cannot_constrain():
    with pytest.raises(ValueError, match="when the reply reasons first"):
        ChoiceMasks(tokenizer(), 4096, ALFWORLD_PROMPTS, style="compact", think=True)
    masks = ChoiceMasks(
        tokenizer(), model_config().vocab_size, ALFWORLD_PROMPTS, style="paper", think=False
    )
    with pytest.raises(ValueError, match="lists no action"):
        masks.grammar([])

    @dataclasses.dataclass
    class NoBackend:
        stop_ids = (0,)

    with pytest.raises(ValueError, match="Hugging Face `tokenizers` backend"):
        ChoiceMasks(NoBackend(), 64, ALFWORLD_PROMPTS, style="paper", think=False)
