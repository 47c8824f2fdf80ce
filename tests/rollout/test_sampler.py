"""KV-cache sampler: recorded log-probs equal a full forward pass, greedy equals step-by-step
argmax, stop / length handling, seeds, weight swaps without recompiling, slot refills."""

import jax
import numpy as np
import pytest
from flax import nnx
from rollout_testlib import small_moe_config

from sao_jax.models import Transformer, init_model, token_logprobs_from_logits
from sao_jax.rollout import Sampler, SamplingParams

CONFIG = small_moe_config(61)
PROMPTS = [[5, 9, 2], [7, 1, 4, 4, 8, 3, 12, 40, 2], [33], [10, 11, 12, 13, 14, 15]]
REF_LEN = 32


@pytest.fixture(scope="module")
def model():
    return init_model(CONFIG)


@pytest.fixture(scope="module")
def sampler(model):
    return Sampler(model, pad_id=0)


@pytest.fixture(scope="module")
def reference(model):
    """Full-forward log-probs of whole sequences (dropless, like the sampler), one jit."""
    dropless = CONFIG.replace(capacity_factor=0.0)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(dropless, rngs=nnx.Rngs(0))))
    state = nnx.state(model)

    @jax.jit
    def logprobs(tokens, segment_ids):
        logits = nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids)
        return token_logprobs_from_logits(logits[:, :-1], tokens[:, 1:])[0], logits

    def run(sequences):
        tokens = np.zeros((len(sequences), REF_LEN), np.int32)
        segments = np.zeros_like(tokens)
        for i, seq in enumerate(sequences):
            tokens[i, : len(seq)] = seq
            segments[i, : len(seq)] = 1
        logp, logits = logprobs(tokens, segments)
        return np.asarray(logp), np.asarray(logits)

    return run


def _sequences(prompts, result):
    return [list(p) + list(result.tokens[i, : result.lengths[i]]) for i, p in enumerate(prompts)]


def test_recorded_logprobs_equal_full_forward(sampler, reference):
    sampling = [
        SamplingParams(temperature=1.0, max_new_tokens=12, seed=1),
        SamplingParams(temperature=0.7, top_k=5, max_new_tokens=9, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=12, seed=3),
        SamplingParams(temperature=0.0, max_new_tokens=5),
    ]
    result = sampler.generate(PROMPTS, sampling)
    assert result.tokens.shape == (4, 12) and result.logprobs.shape == (4, 12)
    np.testing.assert_array_equal(result.lengths, [12, 9, 12, 5])
    assert result.policy_version == 0
    logp, _ = reference(_sequences(PROMPTS, result))
    for i, prompt in enumerate(PROMPTS):
        n = result.lengths[i]
        expected = logp[i, len(prompt) - 1 : len(prompt) - 1 + n]
        np.testing.assert_allclose(result.logprobs[i, :n], expected, atol=1e-5)
        assert np.all(result.logprobs[i, n:] == 0) and np.all(result.tokens[i, n:] == 0)
    assert np.all(result.logprobs[:, :5] < 0)


def test_greedy_equals_step_by_step_argmax(sampler, reference):
    result = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    sequences = [list(p) for p in PROMPTS]
    for _ in range(8):
        _, logits = reference(sequences)
        for i, seq in enumerate(sequences):
            seq.append(int(np.argmax(logits[i, len(seq) - 1])))
    for i, prompt in enumerate(PROMPTS):
        assert list(result.tokens[i]) == sequences[i][len(prompt) :]
    assert result.finish_reasons == ("length",) * 4


def test_stop_tokens_end_rows_and_pad_the_rest(sampler):
    greedy = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10))
    stop = int(greedy.tokens[1, 3])
    first_hit = {
        i: list(greedy.tokens[i]).index(stop) for i in range(4) if stop in greedy.tokens[i]
    }
    sampling = [SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop, 60))] * 4
    result = sampler.generate(PROMPTS, sampling)
    for i in range(4):
        if i in first_hit:
            assert result.lengths[i] == first_hit[i] + 1
            assert result.finish_reasons[i] == "stop"
            assert result.tokens[i, first_hit[i]] == stop
        else:
            assert result.lengths[i] == 10 and result.finish_reasons[i] == "length"
        n = result.lengths[i]
        np.testing.assert_array_equal(result.tokens[i, :n], greedy.tokens[i, :n])
        assert np.all(result.tokens[i, n:] == 0)


def test_seeds_are_reproducible_and_independent_of_batch(sampler):
    sampling = [SamplingParams(temperature=1.0, max_new_tokens=10, seed=s) for s in (7, 8, 9, 10)]
    a = sampler.generate(PROMPTS, sampling)
    b = sampler.generate(PROMPTS, sampling)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    alone = sampler.generate(PROMPTS[2:3], sampling[2:3])
    np.testing.assert_array_equal(alone.tokens[0], a.tokens[2])
    np.testing.assert_allclose(alone.logprobs[0], a.logprobs[2], atol=1e-5)
    other = sampler.generate(PROMPTS, [SamplingParams(1.0, max_new_tokens=10, seed=99)] * 4)
    assert not np.array_equal(other.tokens, a.tokens)


def test_top_k_one_and_tiny_top_p_are_greedy(sampler):
    greedy = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    top_k = sampler.generate(PROMPTS, SamplingParams(temperature=1.5, top_k=1, max_new_tokens=8))
    top_p = sampler.generate(PROMPTS, SamplingParams(temperature=1.5, top_p=1e-6, max_new_tokens=8))
    np.testing.assert_array_equal(top_k.tokens, greedy.tokens)
    np.testing.assert_array_equal(top_p.tokens, greedy.tokens)


def test_update_weights_swaps_version_without_recompiling(model, sampler):
    params = nnx.state(model)
    first = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    compiled = sampler.num_compiled()
    assert compiled >= 3  # init, prefill, decode
    new_params = jax.tree.map(lambda x: x * 1.5, params)
    sampler.update_weights(new_params, version=3)
    second = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert second.policy_version == 3
    # Other prompt lengths in the same bucket reuse the compiled functions too.
    sampler.generate([[*p[:2], 1] for p in PROMPTS], SamplingParams(0.0, max_new_tokens=6))
    assert sampler.num_compiled() == compiled
    assert not np.array_equal(second.tokens, first.tokens)
    sampler.update_weights(params, version=0)
    again = sampler.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    np.testing.assert_array_equal(again.tokens, first.tokens)
    assert again.policy_version == 0
    wrong = jax.tree.map(lambda x: x[..., :1] if x.ndim == 2 else x, params)
    with pytest.raises(ValueError, match=r"update_weights: .*expected"):
        sampler.update_weights(wrong, version=5)
    assert sampler.policy_version == 0


def test_slot_refill_matches_independent_generation(sampler):
    short = SamplingParams(temperature=0.0, max_new_tokens=3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    plan = [short, greedy, greedy, greedy]
    solo = [sampler.generate([p], s).tokens[0] for p, s in zip(PROMPTS, plan, strict=True)]
    state = sampler.init_state(num_slots=4, cache_len=32)
    state, first, _, _ = sampler.prefill(state, PROMPTS[:2], [0, 1], plan[:2])
    got = {0: [first[0]], 1: [first[1]]}
    state, tokens, _, emitted = sampler.decode(state, 3)
    for slot in (0, 1):
        got[slot] += list(tokens[slot][emitted[slot]])
    assert len(got[0]) == 3  # slot 0 has finished; it is refilled below
    # Slot 2 joins mid-flight and slot 0 gets a new prompt while slot 1 is still decoding.
    state, first, _, _ = sampler.prefill(state, [PROMPTS[2], PROMPTS[3]], [2, 0], greedy)
    got[2], got[3] = [first[0]], [first[1]]
    for _ in range(3):  # a worker calls decode repeatedly with the same step count
        state, tokens, _, emitted = sampler.decode(state, 3)
        got[1] += list(tokens[1][emitted[1]])
        got[2] += list(tokens[2][emitted[2]])
        got[3] += list(tokens[0][emitted[0]])
    for i in range(4):
        np.testing.assert_array_equal(got[i], solo[i])


def test_extend_continues_a_finished_slot_without_reencoding(sampler, reference):
    turn = SamplingParams(temperature=0.0, max_new_tokens=3)
    state = sampler.init_state(num_slots=4, cache_len=32)
    state, first, _, _ = sampler.prefill(state, PROMPTS[:2], [0, 1], turn)
    state, tokens, _, emitted = sampler.decode(state, 3)
    replies = [[first[i], *tokens[i][emitted[i]]] for i in range(2)]
    observations = [[20, 21, 22], [30]]
    with pytest.raises(ValueError, match="do not fit a cache"):
        sampler.extend(state, [[1] * 30], [0], turn)
    state, first, logp, _ = sampler.extend(state, observations, [0, 1], turn)
    state, tokens, logps, emitted = sampler.decode(state, 3)
    for i in range(2):
        second = [first[i], *tokens[i][emitted[i]]]
        second_logp = [logp[i], *logps[i][emitted[i]]]
        history = PROMPTS[i] + replies[i] + observations[i]
        ref_logp, _ = reference([history + second])
        expected = ref_logp[0, len(history) - 1 : len(history) - 1 + len(second)]
        np.testing.assert_allclose(second_logp, expected, atol=1e-5)
        fresh = sampler.generate([history], turn)
        np.testing.assert_array_equal(second, fresh.tokens[0, : fresh.lengths[0]])


def test_bad_requests_raise_clear_errors(sampler):
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1], []])
    with pytest.raises(ValueError, match="outside \\[0, vocab_size=61\\)"):
        sampler.generate([[1, 61]])
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        SamplingParams(temperature=-1)
    state = sampler.init_state(num_slots=2, cache_len=8)
    with pytest.raises(ValueError, match="do not fit a cache of 8 positions"):
        sampler.prefill(state, [[1, 2, 3]], [0], SamplingParams(max_new_tokens=7))
    with pytest.raises(ValueError, match="slots must be distinct"):
        sampler.prefill(state, [[1], [2]], [1, 1], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="slot 2 of prompt 0 is outside"):
        sampler.prefill(state, [[1]], [2], SamplingParams(max_new_tokens=2))
