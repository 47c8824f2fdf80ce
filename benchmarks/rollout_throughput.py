"""Rollout throughput: slot refill vs lock-step turns, and the async vs sync RL pipeline.

Two side-by-side measurements on the `tiny` policy preset (random weights, word tokenizer,
small ALFWorld games), in one run:

1. refill: the same games, weights and seeds played with `refill="continuous"` (a finished
   reply's slot is refilled at the next dispatch) and `refill="lockstep"` (a batch of turns
   waits for its longest reply). The episodes are checked identical token for token, so the
   ratio is pure scheduling. Reported: episodes/s, env steps/s, generated tokens/s. A third
   mode, `uncached`, is slot refill without the prefill savings (no prefix caching, one
   prefill dispatch per load, attention over the whole cache: `docs/rollout.md`, "Prefill"),
   checked identical token for token too.
2. pipeline: `policy_steps` learner iterations, each consuming `episodes_per_step` episodes
   read back through the ATDP loader, with the `RolloutEngine` synchronous (generate, then
   train) and asynchronous (workers keep generating while the learner trains, staleness <=
   `max_staleness`). The learner is a stand-in of the SAO update's cost: `learner_updates`
   jitted next-token steps (fwd + bwd + AdamW) of the policy on the batch's action tokens
   per iteration (SAO: 1 policy + 2 critic steps). Reported: wall time for the same policy
   steps, and how much of it rollouts and learning overlapped.

Compilation is excluded (a warm-up pass runs every shape first).

    python benchmarks/rollout_throughput.py [envs=32] [episodes=64] [max_steps=20]
        [layout=windowed] [context=1024] [policy_steps=6] [episodes_per_step=16]
        [prompt_style=paper] [history_length=2]
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from sao_jax.config_cli import parse_cli
from sao_jax.envs.alfworld import vocabulary
from sao_jax.models import get_model_config, init_model
from sao_jax.models.steps import make_lm_train_step
from sao_jax.rollout import (
    AgentLoop,
    EngineConfig,
    EnvConfig,
    RolloutConfig,
    RolloutEngine,
    Sampler,
    WeightPublisher,
    collect_expert_demos,
)
from sao_jax.tokenizers import WordTokenizer


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    envs: KV-cache slots (envs) per rollout worker.
    episodes: episodes per measured pass of the refill comparison.
    max_steps: ALFWorld step limit per episode.
    layout: windowed or concat.
    context: KV-cache positions per slot (max_context_tokens).
    max_new_tokens: reply length cap.
    decode_chunk: decode steps per dispatch.
    repeats: measured passes per refill mode (median reported).
    policy_steps: learner iterations per pipeline mode.
    episodes_per_step: episodes per learner iteration (B).
    pipeline_max_steps: ALFWorld step limit in the pipeline (concat rows must fit context).
    learner_updates: jitted train steps per iteration (the learner's cost).
    max_staleness: eta of the async engine.
    bc_steps: behaviour-cloning steps ([8, 512] windowed expert-demo rows) before measuring
      (0: random weights, whose replies all run to max_new_tokens; a cloned policy's replies
      and episodes vary in length like a trained one's).
    prompt_style: rollout prompt wording of the refill comparison ("paper" or "compact").
    history_length: windowed history pairs of the refill comparison.
    out_dir: scratch directory for the ATDP store (deleted afterwards).
    """

    envs: int = 32
    episodes: int = 64
    max_steps: int = 20
    layout: str = "windowed"
    context: int = 1024
    max_new_tokens: int = 24
    decode_chunk: int = 4
    repeats: int = 2
    policy_steps: int = 6
    episodes_per_step: int = 16
    pipeline_max_steps: int = 8
    learner_updates: int = 3
    max_staleness: int = 1
    bc_steps: int = 100
    prompt_style: str = "paper"
    history_length: int = 2
    out_dir: str = "/tmp/rollout_bench"


MODES = {"continuous": ("continuous", True), "lockstep": ("lockstep", True)}
MODES["uncached"] = ("continuous", False)  # (refill, prefill savings)


def play(sampler, tokenizer, config: BenchConfig, mode: str, games: range):
    refill, savings = MODES[mode]
    rollout = RolloutConfig(
        layout=config.layout,
        max_new_tokens=config.max_new_tokens,
        max_context_tokens=config.context,
        decode_chunk=config.decode_chunk,
        refill=refill,
        prefix_cache=savings,
        prompt_style=config.prompt_style,
        history_length=config.history_length,
    )
    envs = EnvConfig(max_steps=config.max_steps).make_envs(config.envs)
    loop = AgentLoop(sampler, tokenizer, envs, rollout)
    sampler.split_prefill = sampler.attention_window = savings
    try:
        start = time.perf_counter()
        episodes = [e for group in loop.play(games) for e in group]
        return time.perf_counter() - start, episodes
    finally:
        sampler.split_prefill = sampler.attention_window = True


def describe(episodes) -> str:
    won = sum(e.won for e in episodes)
    invalid = sum(e.invalid_replies for e in episodes) / max(sum(e.steps for e in episodes), 1)
    lengths = [t.output_ids.shape[0] for e in episodes for t in e.turns]
    return (
        f"success {won}/{len(episodes)}, invalid replies {invalid:.0%}, reply length "
        f"{np.mean(lengths):.1f} +- {np.std(lengths):.1f} tokens"
    )


def refill_comparison(sampler, tokenizer, config: BenchConfig) -> dict:
    # Other games than the measured ones, enough to meet every prefill shape once.
    warm = range(3000, 3000 + config.episodes)
    for mode in ("continuous", "lockstep", "uncached", "continuous"):
        play(sampler, tokenizer, config, mode, warm)
    games = range(config.episodes)
    times, last = {mode: [] for mode in MODES}, {}
    for _ in range(config.repeats):  # interleaved: the machine is shared
        for mode in times:
            seconds, last[mode] = play(sampler, tokenizer, config, mode, games)
            times[mode].append(seconds)
    key = lambda e: e.game_index  # noqa: E731
    reference = sorted(last["continuous"], key=key)
    for other in ("lockstep", "uncached"):
        for a, b in zip(reference, sorted(last[other], key=key), strict=True):
            for ta, tb in zip(a.turns, b.turns, strict=True):
                assert np.array_equal(ta.output_ids, tb.output_ids), f"{other} diverged"
    steps = sum(e.steps for e in reference)
    tokens = sum(e.generated_tokens for e in reference)
    out = {}
    for refill, runs in times.items():
        seconds = statistics.median(runs)
        out[refill] = {
            "seconds": seconds,
            "episodes/s": len(reference) / seconds,
            "env steps/s": steps / seconds,
            "tokens/s": tokens / seconds,
        }
    out["episodes"], out["env_steps"], out["tokens"] = len(reference), steps, tokens
    out["describe"] = describe(reference)
    return out


class StandInLearner:
    """`updates` jitted next-token steps on each batch's action tokens, then publish."""

    def __init__(self, model, publisher, updates: int, learning_rate: float = 1e-5):
        # Own copies: the train step donates its parameters.
        graphdef, state = nnx.split(model)
        own = nnx.merge(graphdef, jax.device_put(state, may_alias=False))
        optimizer = optax.adamw(learning_rate)
        (self.params, self.opt_state), self.step = make_lm_train_step(own, optimizer)
        self.publisher, self.updates, self.version = publisher, updates, 0
        self.busy = 0.0

    def train(self, batch: dict, *, publish: bool = True) -> None:
        start = time.perf_counter()
        tokens, mask = batch["tokens"], np.roll(batch["loss_mask"], -1, axis=1)
        for _ in range(self.updates):
            self.params, self.opt_state, metrics = self.step(
                self.params, self.opt_state, tokens, mask
            )
        float(metrics["loss"])
        if publish:
            self.version += 1
            self.publisher.publish(self.params, self.version)  # a copy: params get donated
        self.busy += time.perf_counter() - start


def run_pipeline(asynchronous, model, sampler, tokenizer, config, store) -> dict:
    tenant = "async" if asynchronous else "sync"
    publisher = WeightPublisher()
    learner = StandInLearner(model, publisher, config.learner_updates)
    rows, seq_len = config.episodes_per_step, config.context
    zeros = np.zeros((rows, seq_len), np.int32)
    learner.train({"tokens": zeros, "loss_mask": zeros + 1}, publish=False)  # compile
    publisher.publish(learner.params, 0)
    with store.writer(tenant) as writer:
        engine = RolloutEngine(
            model,
            tokenizer,
            writer,
            publisher,
            rollout=RolloutConfig(
                layout="concat",
                max_new_tokens=config.max_new_tokens,
                max_context_tokens=config.context,
                decode_chunk=config.decode_chunk,
            ),
            env=EnvConfig(max_steps=config.pipeline_max_steps, seed=1),
            config=EngineConfig(
                envs_per_worker=config.envs,
                asynchronous=asynchronous,
                max_staleness=config.max_staleness,
                episodes_per_version=config.episodes_per_step,
                tenant=tenant,
            ),
            samplers=[sampler],
        )
        loader = AtdpLoader(
            store,
            [tenant],
            principal=tenant,
            config=LoaderConfig(
                rows=rows, seq_len=seq_len, layout="concat", max_staleness=config.max_staleness
            ),
            current_version=lambda: learner.version,
        )
        learner.busy = 0.0
        start = time.perf_counter()
        stream = iter(loader.stream(poll_interval_s=0.01))
        if asynchronous:
            engine.start()
            stream = engine.guard(stream)
        for _ in range(config.policy_steps):
            if not asynchronous:
                engine.generate(config.episodes_per_step)
            learner.train(next(stream))
        wall = time.perf_counter() - start
        if asynchronous:
            engine.stop()
        stats = engine.stats()
    return {
        "wall": wall,
        "learner_busy": learner.busy,
        "rollout_busy": stats["rollout_seconds"],
        "episodes": stats["episodes"],
        "dropped_stale": stats["dropped_stale"] + loader.stats.snapshot().get("dropped_stale", 0),
    }


def behaviour_clone(model, tokenizer, config: BenchConfig, root: Path):
    """`bc_steps` next-token steps on windowed expert demos; returns the trained params."""
    store = AtdpStore.open(str(root / "demos"))
    rollout = RolloutConfig(max_new_tokens=config.max_new_tokens, max_context_tokens=512)
    with store.writer("demos") as writer:
        collect_expert_demos(
            writer, tokenizer, num_episodes=64, rollout=rollout, env=EnvConfig(seed=7)
        )
    loader = AtdpLoader(
        store,
        ["demos"],
        principal="demos",
        config=LoaderConfig(rows=8, seq_len=512, layout="windowed"),
    )
    batches = iter(loader.epoch(seed=0, num_epochs=None))
    learner = StandInLearner(model, WeightPublisher(), 1, learning_rate=3e-3)
    for _ in range(config.bc_steps):
        learner.train(next(batches), publish=False)
    return learner.params


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, save=False)
    tokenizer = WordTokenizer.from_texts([" ".join(vocabulary())])
    model = init_model(get_model_config("tiny", vocab_size=tokenizer.vocab_size))
    root = Path(config.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    if config.bc_steps:
        start = time.perf_counter()
        nnx.update(model, behaviour_clone(model, tokenizer, config, root))
        print(f"behaviour cloning: {config.bc_steps} steps in {time.perf_counter() - start:.0f} s")
    sampler = Sampler(model, pad_id=tokenizer.pad_id)
    print(f"config: {dataclasses.asdict(config)}")

    refill = refill_comparison(sampler, tokenizer, config)
    print(
        f"\n1. slot refill vs lock-step: {refill['episodes']} episodes, {refill['env_steps']} "
        f"env steps, {refill['tokens']} generated tokens, {config.envs} envs, {config.layout}"
    )
    print(f"policy: {refill['describe']}")
    print(f"{'mode':<11} {'seconds':>8} {'episodes/s':>11} {'env steps/s':>12} {'tokens/s':>9}")
    for mode in MODES:
        r = refill[mode]
        print(
            f"{mode:<11} {r['seconds']:8.2f} {r['episodes/s']:11.2f} "
            f"{r['env steps/s']:12.1f} {r['tokens/s']:9.0f}"
        )
    ratio = refill["lockstep"]["seconds"] / refill["continuous"]["seconds"]
    print(f"slot refill is {ratio:.2f}x lock-step")
    ratio = refill["uncached"]["seconds"] / refill["continuous"]["seconds"]
    print(f"the prefill savings make slot refill {ratio:.2f}x its uncached path")

    try:
        store = AtdpStore.open(str(root / "pipeline"))
        # Warm every pipeline shape once (concat prefill / extend buckets, train step).
        warm = dataclasses.replace(config, policy_steps=2)
        run_pipeline(False, model, sampler, tokenizer, warm, AtdpStore.open(str(root / "warm")))
        results = {
            mode: run_pipeline(mode == "async", model, sampler, tokenizer, config, store)
            for mode in ("sync", "async")
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n2. RL pipeline, {config.policy_steps} policy steps x {config.episodes_per_step} "
        f"episodes (concat, max_steps={config.pipeline_max_steps}), learner = "
        f"{config.learner_updates} train steps per batch, eta={config.max_staleness}"
    )
    print(
        f"{'mode':<6} {'wall s':>7} {'learner s':>10} {'rollout s':>10} {'episodes':>9} {'stale':>6}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<6} {r['wall']:7.2f} {r['learner_busy']:10.2f} {r['rollout_busy']:10.2f} "
            f"{r['episodes']:9d} {r['dropped_stale']:6d}"
        )
    a = results["async"]
    print(
        f"async is {results['sync']['wall'] / a['wall']:.2f}x sync for the same policy steps; "
        f"busy time / wall in async = {(a['learner_busy'] + a['rollout_busy']) / a['wall']:.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
