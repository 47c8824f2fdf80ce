"""SAO learner iteration, side by side: heads at every position vs at the action tokens only
(`compare=heads`), the step-by-step iteration vs the fused one (`compare=fused`), or rows
padded as the loader made them vs packed (`compare=pack`), or causal attention over whole rows
vs in query blocks (`compare=attention`).

One SAO iteration (prepare: critic values + linked GAE; one DIS policy step; K = 2 critic steps)
of the `experiments.alfworld_sao` `tiny` preset's learner (model preset tiny, 4 experts,
moe_intermediate_size 128, dropless; vocabulary from the ALFWorld word tokenizer) on a realistic
windowed RL batch: `rows` x `seq_len` tokens, real lengths uniform in [200, 250], 5..9 action
tokens at the end of each row's real tokens (one LLM reply per row), rows grouped 8 turns to a
trajectory, a terminal reward on the last turn.

`compare=heads`: three learners from the same weights, `head_positions="all"` (the LM head and
the value head at all R x T positions), `"rows"` (at a per-row capacity K of gathered action
tokens, [R, K]) and `"actions"` (the default: the action tokens of each block of rows a device
holds in one list, [G, N]). `compare=fused`: two learners with the heads at the action tokens,
`fused_iteration=False` (prepare, the policy step and each critic step jitted apart, called
from Python, one host read) and `True` (the whole iteration one compiled program).
`compare=pack`: `pack_rows=False` (the backbone at every position of every row, padding
included) vs `True` (the rows' real tokens packed into as few rows of T as hold them,
`sao_jax.train.packing`). `compare=attention`: the model's causal attention over whole rows
(`attention_query_block=0`) vs in query blocks (the preset's). With `atdp=DIR/atdp` the batch
is not synthetic but the first
`episodes` rollout episodes an `experiments.alfworld_sao` run recorded (tenant `rollouts`,
windowed rows as its RL phase reads them). Both are
compiled first, then timed alternately; the best of `repeats` is reported with the ratio, the
share of head positions that carry a gradient, XLA's scratch memory of the iteration (the
compiled programs' `temp_size_in_bytes`: its peak on top of parameters, optimizer states and
batch), and the machine load.

    python benchmarks/learner_throughput.py [rows=128] [seq_len=256] [repeats=3] [compare=heads]
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import jax
import numpy as np

from sao_jax.config_cli import parse_cli


@dataclasses.dataclass
class BenchConfig:
    """Attributes:
    rows: batch rows (R).
    seq_len: tokens per row (T).
    repeats: timed iterations per path, alternating (the best is reported).
    turns: rows (LLM calls) per trajectory.
    seed: batch and model seed.
    compare: "heads" (heads at all positions vs the action tokens), "fused" (step-by-step
      iteration vs the fused one), "pack" (padded rows vs packed rows) or "attention" (causal
      attention over whole rows vs in query blocks, `ModelConfig.attention_query_block`).
    atdp: an `experiments.alfworld_sao` run's ATDP store: the batch is its first `episodes`
      RL episodes (tenant `rollouts`) in `rows` x `seq_len` windowed rows ("": synthetic).
    episodes: episodes in a batch read from `atdp` (the tiny preset's 6 a policy version).
    """

    rows: int = 128
    seq_len: int = 256
    repeats: int = 3
    turns: int = 8
    seed: int = 0
    compare: str = "heads"
    atdp: str = ""
    episodes: int = 6


def windowed_batch(config: BenchConfig, vocab_size: int) -> dict[str, np.ndarray]:
    """A loader-like windowed batch (the keys `sao_jax.train.steps.BATCH_KEYS` names)."""
    rng = np.random.default_rng(config.seed)
    r, t = config.rows, config.seq_len
    lengths = rng.integers(min(200, t - 10), min(250, t) + 1, r)
    actions = rng.integers(5, 10, r)
    tokens = np.zeros((r, t), np.int32)
    loss_mask = np.zeros((r, t), np.int32)
    segment_ids = np.zeros((r, t), np.int32)
    positions = np.zeros((r, t), np.int32)
    rollout_logp = np.zeros((r, t), np.float32)
    rewards = np.zeros((r, t), np.float32)
    traj_index = np.arange(r, dtype=np.int32) // config.turns
    turn_index = np.arange(r, dtype=np.int32) % config.turns
    for row, (n, k) in enumerate(zip(lengths, actions, strict=True)):
        tokens[row, :n] = rng.integers(3, vocab_size, n)
        segment_ids[row, :n] = 1
        positions[row, :n] = np.arange(n)
        loss_mask[row, n - k : n] = 1
        rollout_logp[row, n - k : n] = -rng.uniform(0.05, 1.5, k)
        if turn_index[row] == config.turns - 1 or row == r - 1:
            rewards[row, n - 1] = float(rng.random() < 0.5)
    return {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "rollout_logp": rollout_logp,
        "rewards": rewards,
        "versions": np.zeros((r, t), np.int32),
        "positions": positions,
        "segment_ids": segment_ids,
        "traj_index": traj_index,
        "turn_index": turn_index,
    }


def recorded_batch(config: BenchConfig) -> dict[str, np.ndarray]:
    """The first `episodes` RL episodes of a recorded run, as the RL phase's loader reads them."""
    from atdp_io import AtdpStore
    from atdp_io.loader import AtdpLoader, LoaderConfig

    loader = AtdpLoader(
        AtdpStore.open(config.atdp),
        ["rollouts"],
        principal="rollouts",
        config=LoaderConfig(
            rows=config.rows,
            seq_len=config.seq_len,
            layout="windowed",
            max_trajectories=config.episodes,
        ),
    )
    return next(iter(loader.epoch(shuffle=False)))


def iteration_flops(learner, batch: dict[str, np.ndarray]) -> float:
    """XLA's FLOP count of one iteration's programs: prepare + policy step + K critic steps
    (counted on the step-by-step programs: XLA's count of the fused one sees each scan body
    once, whatever its trip count)."""
    device_batch = learner._device_batch(batch)
    fns = learner._functions(device_batch, learner._action_capacity(batch))
    policy = (learner.policy_params, learner._policy_frozen)
    critic = (learner.critic_params, learner._critic_frozen)
    prepared = fns["prepare"](*policy, *critic, device_batch)
    prepared_for_policy = (prepared["advantages"], prepared["behaviour_logp"])
    prepared_for_critic = (prepared["returns"], prepared["values"])
    programs = [
        (fns["prepare"], (*policy, *critic, device_batch), 1),
        (
            fns["policy"],
            (*policy, learner.policy_opt_state, device_batch, *prepared_for_policy),
            1,
        ),
        (
            fns["critic"],
            (*critic, learner.critic_opt_state, device_batch, *prepared_for_critic),
            learner.config.critic.steps,
        ),
    ]
    total = 0.0
    for fn, args, times in programs:
        cost = fn.lower(*args).cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        total += times * float(cost["flops"])
    return total


def iteration_temp_bytes(learner, batch: dict[str, np.ndarray]) -> float:
    """XLA's scratch memory for one iteration (the compiled programs' `temp_size_in_bytes`;
    the largest of the step-by-step programs, which run one after the other): the learner's
    peak on top of its parameters, optimizer states and batch."""
    host = learner._host_batch(batch, compact=learner.config.pack_rows)
    device_batch = learner.placement.put_batch(host)
    fns = learner._functions(device_batch, learner._action_capacity(host))
    policy = (learner.policy_params, learner._policy_frozen)
    critic = (learner.critic_params, learner._critic_frozen)
    if learner.config.fused_iteration:
        args = (*policy, learner.policy_opt_state, *critic, learner.critic_opt_state)
        programs = [(fns["iteration"], (*args, device_batch))]
    else:
        prepared = fns["prepare"](*policy, *critic, device_batch)
        for_policy = (prepared["advantages"], prepared["behaviour_logp"])
        for_critic = (prepared["returns"], prepared["values"])
        programs = [
            (fns["prepare"], (*policy, *critic, device_batch)),
            (fns["policy"], (*policy, learner.policy_opt_state, device_batch, *for_policy)),
            (fns["critic"], (*critic, learner.critic_opt_state, device_batch, *for_critic)),
        ]
    return max(
        float(fn.lower(*args).compile().memory_analysis().temp_size_in_bytes)
        for fn, args in programs
    )


def head_position_count(learner, batch: dict[str, np.ndarray], rows: int, length: int) -> int:
    """Positions the LM head and the value head run at in one of `learner`'s iterations."""
    capacity = learner._action_capacity(
        learner._host_batch(batch, compact=learner.config.pack_rows)
    )
    if capacity is None:
        return rows * length
    if isinstance(capacity, int):
        return rows * capacity
    return capacity.groups * capacity.per_group


def main(argv: list[str]) -> None:
    config = parse_cli(argv, {"default": BenchConfig()}, prog="learner_throughput.py", save=False)
    from experiments.alfworld_sao import tiny
    from sao_jax.pipeline.setup import build_model, build_tokenizer
    from sao_jax.train import objectives
    from sao_jax.train.learner import Learner

    experiment = dataclasses.replace(tiny(), seed=config.seed)
    tokenizer = build_tokenizer(experiment)
    batch = recorded_batch(config) if config.atdp else windowed_batch(config, tokenizer.vocab_size)
    learner_config = dataclasses.replace(
        experiment.learner, critic=dataclasses.replace(experiment.learner.critic, warmup_steps=0)
    )
    if config.compare == "heads":
        variants = {
            where: dataclasses.replace(learner_config, head_positions=where)
            for where in ("all", "rows", "actions")
        }
    elif config.compare == "fused":
        variants = {
            path: dataclasses.replace(
                learner_config, head_positions="actions", fused_iteration=path == "fused"
            )
            for path in ("stepwise", "fused")
        }
    elif config.compare == "pack":
        variants = {
            name: dataclasses.replace(learner_config, pack_rows=name == "packed")
            for name in ("padded", "packed")
        }
    elif config.compare == "attention":
        variants = {"whole rows": learner_config, "query blocks": learner_config}
    else:
        raise ValueError(
            f"compare must be 'heads', 'fused', 'pack' or 'attention', got {config.compare!r}"
        )
    blocks = {"whole rows": 0}  # attention_query_block per variant (default: the preset's)
    learners = {  # same weights (seeded), own buffers
        name: Learner(
            cfg,
            build_model(
                dataclasses.replace(
                    experiment,
                    model=dataclasses.replace(
                        experiment.model, attention_query_block=blocks.get(name)
                    ),
                ),
                tokenizer,
            ),
        )
        for name, cfg in variants.items()
    }
    capacity = objectives.action_capacity_for(batch["loss_mask"])
    num_actions = int((batch["loss_mask"][:, 1:] != 0).sum())
    r, t = batch["tokens"].shape
    real_tokens = int((batch["segment_ids"] != 0).sum())
    backbone_positions = {
        name: learner._device_batch(batch).get("packed_tokens", batch["tokens"]).size
        for name, learner in learners.items()
    }
    model = next(iter(learners.values())).model_config
    rows = {  # what an iteration computes on: without the empty rows when packing
        name: learner._device_batch(batch, compact=learner.config.pack_rows)["tokens"].shape[0]
        for name, learner in learners.items()
    }
    head_positions = {
        name: head_position_count(learner, batch, rows[name], t)
        for name, learner in learners.items()
    }
    print(
        f"model: {model.num_layers} layers, d_model {model.d_model}, "
        f"{model.num_experts} experts, vocab {model.vocab_size}; "
        f"batch {r} x {t}, {real_tokens} real tokens in {int((batch['traj_index'] >= 0).sum())} "
        f"rows, {num_actions} action tokens (K = {capacity} per row); "
        f"critic.steps {learner_config.critic.steps}",
        flush=True,
    )
    for where, learner in learners.items():
        start = time.perf_counter()
        learner.iteration(batch)  # compiles
        print(f"{where}: first iteration (compile) {time.perf_counter() - start:.1f} s", flush=True)
    flops = {where: iteration_flops(learner, batch) for where, learner in learners.items()}
    temp = {where: iteration_temp_bytes(learner, batch) for where, learner in learners.items()}
    times: dict[str, list[float]] = {where: [] for where in learners}
    loads = []
    for _ in range(config.repeats):
        for where, learner in learners.items():
            loads.append(os.getloadavg()[0])
            start = time.perf_counter()
            learner.iteration(batch)
            times[where].append(time.perf_counter() - start)
    best = {where: min(ts) for where, ts in times.items()}
    first = next(iter(learners))
    label = {"heads": "heads at", "fused": "iteration", "pack": "rows", "attention": "attention"}[
        config.compare
    ]
    print(
        f"\n| {label:9} | backbone positions | real tokens | head positions | with signal | "
        f"GFLOP / iteration | XLA temp (MB) | s / iteration (best of {config.repeats}) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for where in learners:
        share = num_actions / head_positions[where]
        print(
            f"| {where:9} | {backbone_positions[where]:18,} | "
            f"{real_tokens / backbone_positions[where]:10.1%} | {head_positions[where]:14,} | "
            f"{share:10.1%} | {flops[where] / 1e9:17.1f} | {temp[where] / 1e6:13,.0f} | "
            f"{best[where]:11.3f} |"
        )
    print()
    for other in list(learners)[1:]:
        print(
            f"{first} / {other}: {best[first] / best[other]:.2f}x faster per iteration, "
            f"{flops[first] / flops[other]:.2f}x fewer FLOPs"
        )
    print(
        f"all runs (s): {times}; load avg (1 min) during timing: {min(loads):.2f}.."
        f"{max(loads):.2f}; {os.cpu_count()} CPUs, backend {jax.default_backend()}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
