"""End to end: traffic served by the real serving stack (gateway, proxy, worker on loopback,
the official `openai` client) under several sampling settings, read back by the real ATDP
loader: at the serving weights the learner's DIS ratio is 1 on every action token of every
unconstrained call, and its DIS loss keeps every token."""

import sys
from pathlib import Path

import grain
import numpy as np
import openai
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from serving_harness import (
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    local_server,
    tool_model,
)
from train_factories import exact_learner_config

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.rows import SAMPLING_KEYS
from sao_jax.train import Learner

TENANT = "acme"
SETTINGS = [  # the call's sampling settings, in call order (one windowed row each)
    dict(temperature=0.7, top_p=0.9, extra_body={"top_k": 5}),
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.5, extra_body={"top_k": 3}),
    dict(temperature=1.0, tool_choice="required"),  # grammar mask: not yet reproduced
]
FORCED = len(SETTINGS) - 1


def _serve(buffer: Path) -> None:
    with local_server(buffer) as (thread, _):
        status, session = api(thread.url, "/rl/start_session", {"tenant": TENANT})
        assert status == 200, session
        client = openai.OpenAI(
            base_url=thread.url + "/v1", api_key=session["api_key"], max_retries=0, timeout=600
        )
        for seed, kwargs in enumerate(SETTINGS):
            client.chat.completions.create(
                model="sao-test",
                messages=TOOL_MESSAGES,
                tools=[WEATHER_TOOL],
                max_tokens=10,
                seed=seed,
                **kwargs,
            )
        status, ended = api(thread.url, "/rl/end_session", {}, session["api_key"])
        assert status == 200, ended


@pytest.mark.slow  # ~60 s: trains the serving harness's tool model and starts a worker
def test_the_dis_ratio_is_one_at_the_serving_weights(tmp_path):
    buffer = tmp_path / "buffer"
    _serve(buffer)
    store = AtdpStore.open(str(buffer), create=False)
    config = LoaderConfig(rows=8, seq_len=512, layout="windowed")
    loader = AtdpLoader(store, [TENANT], principal=TENANT, config=config)
    batch = next(iter(loader.epoch(shard=grain.sharding.ShardOptions(0, 1), shuffle=False)))
    assert set(SAMPLING_KEYS) <= set(batch)
    learner = Learner(exact_learner_config(algorithm="grpo_dis"), nnx.clone(tool_model().model))
    logp = learner.policy_logprobs(batch)
    action = batch["loss_mask"] > 0
    action[:, 0] = False
    ratio = np.exp(logp - batch["rollout_logp"])
    rows = batch["turn_index"]
    for call, kwargs in enumerate(SETTINGS):
        (row,) = np.flatnonzero(rows == call)
        tokens = action[row]
        assert tokens.sum() > 0
        temperature = kwargs["temperature"]
        np.testing.assert_allclose(batch["sample_temperature"][row][tokens], temperature)
        if call == FORCED:
            # The grammar mask only adds mass to the sampled token; the learner does not
            # apply it yet, so its ratio is at most 1 there (and below 1 somewhere).
            assert np.all(ratio[row][tokens] <= 1 + 1e-4)
            continue
        np.testing.assert_allclose(ratio[row][tokens], 1.0, atol=2e-4, err_msg=str(kwargs))
    # Not a vacuous check: at temperature 1 unfiltered, the tokens of the transformed calls
    # have other log-probs (the served model is confident, so only by ~0.3-1%; the check
    # above holds to 0.02%), so the transform is what makes the ratio 1.
    plain = {k: v for k, v in batch.items() if k not in SAMPLING_KEYS}
    raw = np.exp(learner.policy_logprobs(plain) - batch["rollout_logp"])
    for call in (0, 3, 4):
        (row,) = np.flatnonzero(rows == call)
        assert np.abs(raw[row][action[row]] - 1).max() > 2e-3, SETTINGS[call]
    # The training path (heads at the action tokens) agrees: DIS keeps every token.
    unforced = dict(batch)
    unforced["loss_mask"] = np.where(rows[:, None] == FORCED, 0, batch["loss_mask"])
    metrics = learner.iteration(unforced)
    assert float(metrics["policy/clip_frac"]) == 0.0
    np.testing.assert_allclose(float(metrics["policy/ratio_mean"]), 1.0, atol=1e-4)
