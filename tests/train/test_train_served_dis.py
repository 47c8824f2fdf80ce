"""End to end: traffic served by the real serving stack (gateway, proxy, worker on loopback,
the official `openai` client) under several sampling settings, free and constrained (forced
tool calls, JSON output), read back by the real ATDP loader: at the serving weights the
learner's DIS ratio is 1 on every action token of every call, and its DIS loss keeps every
token. Without the grammar masks (the old computation) it is not 1 on the constrained calls."""

import sys
from pathlib import Path

import grain
import numpy as np
import openai
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from serving_harness import (
    LAMP,
    TOOL_MESSAGES,
    WEATHER_TOOL,
    api,
    local_server,
    read_trajectories,
    tool_model,
)
from train_factories import exact_learner_config

from atdp_io import AtdpStore, EventKind
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.mask_replay import MaskReplay
from atdp_io.rows import SAMPLING_KEYS
from atdp_io.token_masks import MASK_KEYS
from sao_jax.train import Learner

TENANT = "acme"
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "level": {"enum": ["low", "high"]}},
    "required": ["ok", "level"],
    "additionalProperties": False,
}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
NAMED = {"type": "function", "function": {"name": "set_lamp"}}
FREE = [  # the call's sampling settings, in call order (one windowed row each)
    dict(temperature=0.7, top_p=0.9, extra_body={"top_k": 5}),
    dict(temperature=0),
    dict(temperature=1.0),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.5, extra_body={"top_k": 3}),
]
# Each under a grammar mask (no `temperature`: the default sampling). The served model was
# trained to call get_weather here; each call's mask refuses some of what it wants (LAMP, no
# tools, a schema), since where the kept set lies inside the mask the mask changes nothing.
CONSTRAINED = [
    dict(tool_choice="required"),
    dict(tool_choice=NAMED, temperature=0.7, extra_body={"top_k": 5}, tools=[WEATHER_TOOL, LAMP]),
    dict(tool_choice="required", temperature=1.3, top_p=0.8, tools=[LAMP]),
    dict(response_format=SCHEMA, temperature=0.7, top_p=0.9, tools=None),
    dict(response_format={"type": "json_object"}, tools=None),
    dict(
        response_format={"type": "json_object"},
        temperature=0.7,
        extra_body={"top_k": 5},
        tools=[LAMP],
    ),
    dict(response_format=SCHEMA, temperature=0, tools=None),
]
# a thinking budget of 0 (`reasoning_effort` none): every token is drawn with <think> masked
BUDGET = [dict(reasoning_effort="none", temperature=0.7)]
SETTINGS = FREE + CONSTRAINED + BUDGET
GRAMMARS = range(len(FREE), len(FREE) + len(CONSTRAINED))
EPS32 = float(np.finfo(np.float32).eps)


def _serve(buffer: Path) -> None:
    with local_server(buffer) as (thread, _):
        status, session = api(thread.url, "/rl/start_session", {"tenant": TENANT})
        assert status == 200, session
        client = openai.OpenAI(
            base_url=thread.url + "/v1", api_key=session["api_key"], max_retries=0, timeout=600
        )
        for seed, kwargs in enumerate(SETTINGS):
            kwargs = {"tools": [WEATHER_TOOL], **kwargs}
            if kwargs["tools"] is None:
                del kwargs["tools"]
            constrained = kwargs.keys() & {"tool_choice", "response_format"}
            client.chat.completions.create(
                model="sao-test",
                messages=TOOL_MESSAGES,
                max_tokens=40 if constrained else 10,
                seed=seed,
                **kwargs,
            )
        status, ended = api(thread.url, "/rl/end_session", {}, session["api_key"])
        assert status == 200, ended


def _calls(buffer: Path) -> list:
    """The recorded LLM calls, in call order."""
    (trajectory,) = read_trajectories(buffer, TENANT).values()
    return [e.llm for e in trajectory.events if e.kind == EventKind.LLM_CALL]


@pytest.mark.slow  # ~90 s: trains the serving harness's tool model and starts a worker
def test_the_dis_ratio_is_one_at_the_serving_weights(tmp_path):
    buffer = tmp_path / "buffer"
    _serve(buffer)
    calls = _calls(buffer)
    assert len(calls) == len(SETTINGS)
    assert all(("grammar" in c.decoding.extra) == (i in GRAMMARS) for i, c in enumerate(calls))
    served = tool_model()
    vocab = served.model.config.vocab_size
    store = AtdpStore.open(str(buffer), create=False)
    config = LoaderConfig(rows=16, seq_len=512, layout="windowed")
    replay = MaskReplay.from_tokenizer(served.tokenizer, vocab)
    loader = AtdpLoader(store, [TENANT], principal=TENANT, config=config, mask_replay=replay)
    batch = next(iter(loader.epoch(shard=grain.sharding.ShardOptions(0, 1), shuffle=False)))
    assert set(SAMPLING_KEYS) | set(MASK_KEYS) <= set(batch)
    learner = Learner(exact_learner_config(algorithm="grpo_dis"), nnx.clone(served.model))
    logp = learner.policy_logprobs(batch)
    action = batch["loss_mask"] > 0
    action[:, 0] = False
    row_of = {int(t): r for r, t in enumerate(batch["turn_index"]) if t >= 0}

    # The tolerance, from the computation: the server's and the learner's forward passes
    # differ by float rounding; measured on the temperature-1 unmasked log-probs of every
    # output token (both record them: `output_logprobs`, the learner's plain head) as eps.
    # A masked, transformed log-prob z_a / T - logsumexp_S(z / T) moves by at most twice
    # the logit error / T, so 2 eps / T_min bounds it, plus float32 rounding of the values.
    plain_batch = {k: v for k, v in batch.items() if k not in (*SAMPLING_KEYS, *MASK_KEYS)}
    plain = learner.policy_logprobs(plain_batch)
    outputs = {}  # call -> its output columns in its row
    for call, llm in enumerate(calls):
        start = llm.input_ids.shape[0]
        outputs[call] = np.arange(start, start + llm.output_ids.shape[0])
    eps = max(
        np.abs(plain[row_of[c], cols] - calls[c].output_logprobs).max()
        for c, cols in outputs.items()
    )
    t_min = min(float(c.decoding.temperature) for c in calls if c.decoding.temperature > 0)
    tol = 2 * eps / t_min + 4 * EPS32 * np.abs(batch["rollout_logp"]).max()
    assert eps < 1e-3, eps  # the same model on both sides: a rounding-sized discrepancy

    forced_total = 0
    for call, kwargs in enumerate(SETTINGS):
        row, cols = row_of[call], outputs[call]
        tokens = action[row]
        assert tokens.sum() > 0, kwargs
        temperature = kwargs.get("temperature", 1.0)
        np.testing.assert_allclose(batch["sample_temperature"][row][tokens], temperature)
        gap = np.abs(logp[row][tokens] - batch["rollout_logp"][row][tokens])
        assert gap.max() <= tol, (kwargs, gap.max(), tol)
        if call < len(FREE):
            assert np.all(batch["mask_index"][row] == -1)
            continue
        # every choice of a constrained call is under its mask; forced tokens (one allowed
        # id, a grammar's or a spent budget's </think>) are out of the loss, and the sampler
        # gave them probability exactly 1
        assert np.all(batch["mask_index"][row][tokens] >= 0), kwargs
        forced = cols[batch["loss_mask"][row, cols] == 0]
        forced_total += forced.size
        sampled = np.asarray(calls[call].decoding.extra["sampled_logprobs"], np.float32)
        np.testing.assert_array_equal(sampled[forced - cols[0]], 0.0)
    assert forced_total > 0  # the tool-call tags, the function name, the schema's keys

    # Not vacuous: the old computation (transform without the mask) is off on every
    # grammar-constrained call, by far more than the tolerance (the budget's mask removes
    # only <think>, which the served model hardly wants) ...
    unmasked = {k: v for k, v in batch.items() if k not in MASK_KEYS}
    old = learner.policy_logprobs(unmasked)
    gaps = [
        float(np.abs(old[row_of[c]] - batch["rollout_logp"][row_of[c]])[action[row_of[c]]].max())
        for c in GRAMMARS
    ]
    assert min(gaps) > 10 * tol, (gaps, tol)
    # ... and at temperature 1 unfiltered, the tokens of the transformed free calls have
    # other log-probs, so the transform is what makes their ratio 1.
    for call in (0, 3, 4):
        row = row_of[call]
        assert np.abs(plain[row] - batch["rollout_logp"][row])[action[row]].max() > 10 * tol

    # The training path (heads at the action tokens) agrees: DIS keeps every token.
    metrics = learner.iteration(batch)
    assert float(metrics["policy/clip_frac"]) == 0.0
    np.testing.assert_allclose(float(metrics["policy/ratio_mean"]), 1.0, atol=2 * tol)
