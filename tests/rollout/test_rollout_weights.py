"""Weight publication: own copies survive donation, versions only increase, readers see whole
snapshots, waits and subscriptions, sampler sync."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rollout_testlib import borrowed_sampler, model, other_weights

from sao_jax.rollout import WeightPublisher, sync_sampler


def filled(value: float) -> dict:
    return {"w": jnp.full((64,), value), "b": {"x": jnp.full((3, 3), value)}}


def test_published_copy_survives_the_learner_donating_its_buffers():
    params = filled(1.0)
    publisher = WeightPublisher()
    publisher.publish(params, 0)
    donate = jax.jit(lambda p: jax.tree.map(lambda x: x + 1.0, p), donate_argnums=0)
    params = donate(params)  # the originals are deleted now
    snapshot = publisher.latest()
    np.testing.assert_array_equal(snapshot.params["w"], np.ones(64))
    assert snapshot.version == 0 and params["w"][0] == 2.0


def test_versions_must_increase_and_be_valid():
    publisher = WeightPublisher()
    assert publisher.version == -1 and publisher.latest() is None
    publisher.publish(filled(0.0), 3)
    with pytest.raises(ValueError, match="not newer than the published 3"):
        publisher.publish(filled(0.0), 3)
    with pytest.raises(ValueError, match="int >= 0"):
        WeightPublisher().publish(filled(0.0), -1)
    with pytest.raises(ValueError, match="int >= 0"):
        WeightPublisher().publish(filled(0.0), 1.5)
    assert publisher.version == 3


def test_readers_always_see_a_whole_snapshot():
    """Every leaf of a snapshot holds its own version's value: never a torn mix."""
    publisher = WeightPublisher()
    publisher.publish(filled(0.0), 0)
    torn, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            s = publisher.latest()
            values = {float(leaf.reshape(-1)[0]) for leaf in jax.tree.leaves(s.params)}
            if values != {float(s.version)}:
                torn.append((s.version, values))

    reader = threading.Thread(target=read)
    reader.start()
    for v in range(1, 40):
        publisher.publish(filled(float(v)), v)
    stop.set()
    reader.join()
    assert not torn and publisher.version == 39


def test_wait_for_version_and_subscribers():
    publisher = WeightPublisher()
    seen = []
    unsubscribe = publisher.subscribe(lambda s: seen.append(s.version))
    with pytest.raises(TimeoutError, match="version >= 1"):
        publisher.wait_for_version(1, timeout=0.05)
    timer = threading.Timer(0.05, lambda: publisher.publish(filled(2.0), 2))
    timer.start()
    assert publisher.wait_for_version(1, timeout=10).version == 2
    timer.join()
    unsubscribe()
    publisher.publish(filled(3.0), 3)
    assert seen == [2]


def test_publish_a_module_and_sync_a_sampler_only_when_newer():
    publisher = WeightPublisher()
    with borrowed_sampler() as sampler:
        assert not sync_sampler(sampler, publisher)  # nothing published yet
        publisher.publish(model(), 0)
        assert not sync_sampler(sampler, publisher)  # same version
        publisher.publish(other_weights(), 1)
        assert sync_sampler(sampler, publisher) and sampler.policy_version == 1
        leaf = jax.tree.leaves(sampler.params)[0]
        expected = jax.tree.leaves(other_weights())[0]
        np.testing.assert_array_equal(leaf, expected)
        assert not sync_sampler(sampler, publisher)
    assert isinstance(publisher.latest().params, nnx.State)
