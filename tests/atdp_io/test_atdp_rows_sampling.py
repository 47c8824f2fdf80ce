"""Behaviour log-probs and decoding transforms of sampled calls, from trajectories to batches."""

import dataclasses

import numpy as np
import pytest
from atdp_factories import agent_trajectory

from atdp_io import AtdpStore
from atdp_io.rows import SAMPLING_KEYS, Sampling, pack_batch, training_view, trajectory_rows
from atdp_io.schema import DecodingParams


def _sampled(trajectory, call: int, decoding: DecodingParams, sampled):
    """`trajectory` with its `call`-th LLM call re-decoded under `decoding` + sampled_logprobs."""
    llm_indices = [i for i, _ in trajectory.llm_events()]
    index = llm_indices[call]
    event = trajectory.events[index]
    extra = {**decoding.extra, "sampled_logprobs": [float(x) for x in sampled]}
    llm = dataclasses.replace(event.llm, decoding=dataclasses.replace(decoding, extra=extra))
    events = list(trajectory.events)
    events[index] = dataclasses.replace(event, llm=llm)
    return dataclasses.replace(trajectory, events=tuple(events))


def _served(trajectory_id="served", concat=True, n=None):
    traj = agent_trajectory(trajectory_id, turns=3, seed=7, concat=concat)
    out = [e.llm.output_ids.shape[0] for _, e in traj.llm_events()]
    first = -np.linspace(0.1, 0.9, out[0] if n is None else n).astype(np.float32)
    traj = _sampled(traj, 0, DecodingParams(temperature=0.7, top_k=5, top_p=0.9), first)
    second = np.zeros(out[1], np.float32)  # greedy
    return _sampled(traj, 1, DecodingParams(temperature=0.0), second), first, second


def _write(tmp_path, *trajectories):
    store = AtdpStore.open(tmp_path)
    with store.writer("acme") as writer:
        writer.append(list(trajectories))
    reader = store.reader("acme", principal="acme")
    reader.refresh()
    return reader


@pytest.mark.parametrize("layout", ["concat", "windowed"])
def test_sampled_calls_carry_their_behaviour_logprobs_and_transform(tmp_path, layout):
    traj, first, second = _served()
    plain = agent_trajectory("plain", turns=2, seed=8)
    reader = _write(tmp_path, traj, plain)
    entries = {e.trajectory_id: e for e in reader.entries()}
    for sources in (False, True):
        fast = reader.read_training_views([entries["served"]], reward_sources=sources)[0]
        assert [t.sampling for t in fast.turns] == [
            Sampling(0.7, 5, 0.9),
            Sampling(0.0, 0, 1.0),
            None,
        ]
        assert fast.turns[2].behaviour_logprobs is None
        rows, _ = trajectory_rows(fast, layout)
        slow, _ = trajectory_rows(reader.read("served"), layout)
        for a, b in zip(rows, slow, strict=True):
            for field in dataclasses.fields(a):
                x, y = getattr(a, field.name), getattr(b, field.name)
                assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y
    turns = training_view(traj).turns
    rows, _ = trajectory_rows(traj, layout)
    batch = pack_batch([rows], len(rows), 256)
    assert set(SAMPLING_KEYS) <= set(batch)
    expected = {k: [] for k in ("logp", "temp", "top_k", "top_p")}
    for turn, logp in zip(turns, [first, second, turns[2].output_logprobs], strict=True):
        expected["logp"].append(logp)
        s = turn.sampling or Sampling(1.0, 0, 1.0)
        n = turn.output_ids.shape[0]
        expected["temp"].append(np.full(n, s.temperature, np.float32))
        expected["top_k"].append(np.full(n, s.top_k, np.int32))
        expected["top_p"].append(np.full(n, s.top_p, np.float32))
    action = batch["loss_mask"] > 0
    np.testing.assert_array_equal(batch["rollout_logp"][action], np.concatenate(expected["logp"]))
    for key, name in zip(SAMPLING_KEYS, ("temp", "top_k", "top_p"), strict=True):
        np.testing.assert_array_equal(batch[key][action], np.concatenate(expected[name]))
        identity = {"temp": 1.0, "top_k": 0, "top_p": 1.0}[name]
        assert np.all(batch[key][~action] == identity)
    # A trajectory without recorded sampled log-probs: the batch is exactly as before.
    plain_rows, _ = trajectory_rows(reader.read_training_views([entries["plain"]])[0], layout)
    assert all(r.sample_temperature is None for r in plain_rows)
    assert not set(SAMPLING_KEYS) & set(pack_batch([plain_rows], len(plain_rows), 256))


def test_sampled_logprobs_of_the_wrong_length_are_a_clear_error(tmp_path):
    traj, _, _ = _served(n=2)
    with pytest.raises(ValueError, match=r"sampled_logprobs has shape \(2,\), expected \(4,\)"):
        training_view(traj)
    reader = _write(tmp_path, traj)
    with pytest.raises(ValueError, match=r"'served' event 0: .*sampled_logprobs has shape"):
        reader.read_training_views(reader.entries())


def test_positive_or_non_numeric_sampled_logprobs_are_refused():
    traj = agent_trajectory("bad", turns=1, seed=9)
    n = traj.events[0].llm.output_ids.shape[0]
    bad = _sampled(traj, 0, DecodingParams(temperature=0.5), np.full(n, 0.5))
    with pytest.raises(ValueError, match="must be finite and <= 0"):
        training_view(bad)
    index = next(i for i, _ in traj.llm_events())
    event = traj.events[index]
    decoding = DecodingParams(temperature=0.5, extra={"sampled_logprobs": ["x"] * n})
    llm = dataclasses.replace(event.llm, decoding=decoding)
    events = (dataclasses.replace(event, llm=llm), *traj.events[index + 1 :])
    with pytest.raises(ValueError, match="not numeric"):
        training_view(dataclasses.replace(traj, events=traj.events[:index] + events))
