"""Real ALFWorld data for the SEED tests: a word tokenizer, a tiny policy, expert demos in ATDP."""

from __future__ import annotations

import functools

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.envs.alfworld import vocabulary
from sao_jax.models import get_model_config, init_model
from sao_jax.rollout import EnvConfig, RolloutConfig, collect_expert_demos
from sao_jax.tokenizers import WordTokenizer

DEMOS = "demos"
ROLLOUT = RolloutConfig(history_length=1, max_new_tokens=12, max_context_tokens=320)
ENV = EnvConfig(size="small", max_steps=3)


@functools.cache
def word_tokenizer() -> WordTokenizer:
    return WordTokenizer.from_texts([" ".join(vocabulary())])


def tiny_policy(seed: int = 0):
    config = get_model_config(
        "test", vocab_size=word_tokenizer().vocab_size, num_layers=1, capacity_factor=0.0
    )
    return init_model(config, seed=seed)


def demo_store(path, num_episodes: int = 4) -> AtdpStore:
    """Expert episodes of small games (all won; some cut by max_steps) in tenant `demos`."""
    store = AtdpStore.open(str(path))
    with store.writer(DEMOS) as writer:
        collect_expert_demos(
            writer, word_tokenizer(), num_episodes=num_episodes, rollout=ROLLOUT, env=ENV,
            run_id="tdemo",
        )  # fmt: skip
    return store


def demo_trajectories(store: AtdpStore, *, purpose: str = "training"):
    """The demo episodes a reader for `purpose` may read (training: eligible ones only)."""
    reader = store.reader(DEMOS, principal=DEMOS, purpose=purpose)
    reader.refresh()
    return [reader.read(i) for i in reader.trajectory_ids()]


def first_batch(store: AtdpStore, *, tenant=DEMOS, rows=16, seq_len=320, layout="windowed"):
    loader = AtdpLoader(
        store,
        [tenant],
        principal=tenant,
        config=LoaderConfig(rows=rows, seq_len=seq_len, layout=layout),
    )
    return next(iter(loader.epoch(shuffle=False)))
