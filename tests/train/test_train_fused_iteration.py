"""The fused learner iteration (one program: prepare -> policy epochs -> K critic steps, each a
guarded update under `lax.scan`) against the step-by-step sequence it replaced (`prepare`, each
`policy` step, each `critic` step jitted apart and called in order from Python): SAO, PPO with
two epochs and GRPO, in the critic warm-up and after, a non-finite batch, an 8-device mesh."""

import dataclasses

import jax
import numpy as np
import pytest
from train_factories import episode, first_batch, tiny_policy, write_store

from sao_jax.sharding import MeshConfig, make_mesh
from sao_jax.train import ClipConfig, CriticConfig, KlConfig, LearnerConfig, OptimizerConfig
from sao_jax.train.learner import Learner
from sao_jax.train.learner_steps import policy_steps

LR = 1e-3
EPS32 = float(np.finfo(np.float32).eps)
TENSOR_RTOL = 1e-2  # see assert_same_run


def config(**changes) -> LearnerConfig:
    base = LearnerConfig(
        policy_optimizer=OptimizerConfig(learning_rate=LR),
        critic_optimizer=OptimizerConfig(learning_rate=LR),
        critic=CriticConfig(warmup_steps=1),
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """Three batches whose rollout log-probs sit near the starting policy's (DIS keeps some
    tokens, drops others), plus a GRPO batch of two prompt groups."""
    store = tmp_path_factory.mktemp("store")
    episodes = [episode(f"e{i}", seed=i, reward=float(i % 3 == 0)) for i in range(6)]
    batch = first_batch(write_store(store / "sao", episodes), rows=8, seq_len=48)
    logp = Learner(config(), tiny_policy()).policy_logprobs(batch)
    near = []
    for seed in range(3):
        noise = np.random.default_rng(seed).uniform(-0.6, 0.6, logp.shape).astype(np.float32)
        near.append(dict(batch, rollout_logp=np.where(batch["loss_mask"] > 0, logp + noise, 0.0)))
    prompts = [np.arange(3, 9), np.arange(10, 16)]
    grouped = [
        episode(f"g{i}", seed=i, prompt=prompts[i // 2], reward=r)
        for i, r in enumerate([1.0, 0.0, 1.0, 0.0])
    ]
    group_batch = first_batch(write_store(store / "grpo", grouped), rows=4, seq_len=48)
    return {"near": near, "grouped": [group_batch, group_batch]}


def stepwise_iteration(learner: Learner, batch) -> tuple[dict[str, float], dict[str, int]]:
    """The step-by-step iteration: the kept separate jitted functions in order, one host read.
    Updates `learner`'s params and optimizer states (not its counters); returns host metrics
    (without the host-side `batch/staleness_*`, `phase` and counter entries) and skip counts."""
    host = learner._host_batch(batch, compact=learner.config.pack_rows)
    capacity = learner._action_capacity(host)
    device_batch = learner.placement.put_batch(host)
    if not learner.in_warmup:
        device_batch = learner.with_reference_logp(device_batch, capacity)
    fns = learner._functions(device_batch, capacity)
    critic = learner.algorithm.uses_critic
    critic_args = (learner.critic_params, learner._critic_frozen) if critic else ()
    prepared = fns["prepare"](
        learner.policy_params, learner._policy_frozen, *critic_args, device_batch
    )
    metrics = {f"batch/{k}": v for k, v in prepared["stats"].items()}
    skipped = {"policy": [], "critic": []}
    if not learner.in_warmup:
        for _ in range(policy_steps(learner.config)):
            learner.policy_params, learner.policy_opt_state, policy_metrics = fns["policy"](
                learner.policy_params,
                learner._policy_frozen,
                learner.policy_opt_state,
                device_batch,
                prepared["advantages"],
                prepared["behaviour_logp"],
            )
            skipped["policy"].append(policy_metrics["skipped"])
        metrics.update({f"policy/{k}": v for k, v in policy_metrics.items()})
    if critic:
        for _ in range(learner.config.critic.steps):
            learner.critic_params, learner.critic_opt_state, critic_metrics = fns["critic"](
                learner.critic_params,
                learner._critic_frozen,
                learner.critic_opt_state,
                device_batch,
                prepared["returns"],
                prepared["values"],
            )
            skipped["critic"].append(critic_metrics["skipped"])
        metrics.update({f"critic/{k}": v for k, v in critic_metrics.items()})
    metrics, skipped = jax.device_get((metrics, skipped))
    if learner.in_warmup:
        learner.counters.warmup_iterations += 1  # keeps `in_warmup` in step with the fused one
    return {k: float(v) for k, v in metrics.items()}, {k: int(sum(v)) for k, v in skipped.items()}


def states(learner: Learner) -> dict[str, np.ndarray]:
    """Every trained array: params and optimizer states of the policy (and critic), by path."""
    trees = {"policy": learner.policy_params, "policy_opt": learner.policy_opt_state}
    if learner.algorithm.uses_critic:
        trees.update(critic=learner.critic_params, critic_opt=learner.critic_opt_state)
    out = {}
    for name, tree in trees.items():
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            out[name + jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


def assert_same_run(
    fused: dict[str, np.ndarray], reference: dict[str, np.ndarray], start: dict[str, np.ndarray]
):
    """Params / moments of two runs of the same steps from `start` agree within float32
    rounding, tensor by tensor.

    The two programs run the same operations on the same inputs, but XLA fuses them differently
    once prepare and the steps share a program, so a gradient entry may differ by its rounding
    error. Adam divides each entry by its running RMS: most weights then move by lr times that
    relative error (~1e-7), while an entry whose gradient is within its own rounding error of
    zero (a sum of many terms that cancel) may move by a sizeable part of lr. Such entries are
    few, so over a tensor the difference of the two runs stays far below 1% of what the tensor
    moved (`TENSOR_RTOL`); a missing, repeated or misdirected step is ~100% of it. Moments are
    compared to their own norm the same way, plus a few ulps of the tensor for weights that
    did not move."""
    assert fused.keys() == reference.keys()
    for name, ref in reference.items():
        got = fused[name]
        if name.startswith(("policy[", "critic[")):  # weights: relative to their update
            moved = np.linalg.norm(ref - start[name])
        else:  # optimizer moments (and step counts: exact)
            moved = np.linalg.norm(ref.astype(np.float64))
        bound = TENSOR_RTOL * moved + 8 * EPS32 * np.linalg.norm(ref.astype(np.float64))
        assert np.linalg.norm((got - ref).astype(np.float64)) <= bound, name


def assert_same_metrics(fused: dict[str, float], reference: dict[str, float], tokens: int):
    """Metrics of the two paths: same keys; values equal within the float32 rounding bound of a
    reduction over the batch's `tokens` positions (relative `tokens * eps`, the worst case of a
    float32 sum of that many terms), absolute `tokens * eps` near 0 (metrics are O(1))."""
    host_only = {"batch/staleness_mean", "batch/staleness_max", "phase", "policy_version"}
    host_only |= {"skipped_policy_steps", "skipped_critic_steps"}
    assert set(fused) - host_only == set(reference)
    tol = tokens * EPS32
    for key, value in reference.items():
        assert fused[key] == pytest.approx(value, rel=tol, abs=tol), key


def run_both(cfg: LearnerConfig, batches, *, mesh=None):
    """The same iterations through the fused learner and the step-by-step one; checks metrics,
    counters and every trained array after each iteration."""
    fused = Learner(cfg, tiny_policy(), mesh=mesh)
    reference = Learner(cfg, tiny_policy(), mesh=mesh)
    start = states(reference)
    assert_same_run(states(fused), start, start)
    for batch in batches:
        warmup = fused.in_warmup
        assert reference.in_warmup == warmup
        before = dataclasses.replace(fused.counters)
        metrics = fused.iteration(batch)
        expected, skipped = stepwise_iteration(reference, batch)
        assert metrics["phase"] == (0.0 if warmup else 1.0)
        assert_same_metrics(metrics, expected, batch["tokens"].size)
        steps = 0 if warmup else policy_steps(cfg)
        critic_steps = cfg.critic.steps if fused.algorithm.uses_critic else 0
        assert fused.counters.policy_version == before.policy_version + steps - skipped["policy"]
        assert fused.counters.critic_steps == before.critic_steps + critic_steps - skipped["critic"]
        assert (
            fused.counters.skipped_policy_steps == before.skipped_policy_steps + skipped["policy"]
        )
        assert_same_run(states(fused), states(reference), start)
    return fused, reference, start


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"algorithm": "sao"}, id="sao"),
        pytest.param({"algorithm": "sao", "kl": KlConfig(coef=0.5)}, id="sao-kl"),
        pytest.param(
            {"algorithm": "ppo", "clip": ClipConfig(ppo_epochs=2)},
            id="ppo-2-epochs",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_fused_iteration_matches_the_step_by_step_one_in_warmup_and_after(batches, changes):
    cfg = config(**changes)
    fused, _, _ = run_both(cfg, batches["near"])  # 1 warm-up iteration, then 2 full ones
    assert fused.counters.warmup_iterations == 1
    assert fused.counters.policy_version == 2 * policy_steps(cfg)
    assert fused.counters.critic_steps == 3 * cfg.critic.steps


@pytest.mark.slow
def test_fused_grpo_iteration_matches_the_step_by_step_one(batches):
    fused, _, _ = run_both(config(algorithm="grpo"), batches["grouped"])
    assert fused.counters.policy_version == 2 and fused.critic_params is None


def test_a_non_finite_batch_skips_every_fused_step_and_leaves_the_weights(batches):
    clean, poisoned = batches["near"][0], batches["near"][1]
    poisoned = dict(poisoned, rewards=np.where(poisoned["loss_mask"] > 0, np.nan, 0.0))
    cfg = config(
        algorithm="ppo", clip=ClipConfig(ppo_epochs=2), critic=CriticConfig(warmup_steps=0)
    )
    fused, reference, start = run_both(cfg, [clean])  # real optimizer moments to protect
    before = states(fused)
    metrics = fused.iteration(poisoned)
    _, skipped = stepwise_iteration(reference, poisoned)
    assert skipped == {"policy": 2, "critic": 2}
    assert metrics["policy/skipped"] == 1.0 and metrics["critic/skipped"] == 1.0
    assert (fused.counters.skipped_policy_steps, fused.counters.skipped_critic_steps) == (2, 2)
    assert fused.policy_version == 2  # the clean iteration's two epochs only
    after = states(fused)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert_same_run(after, states(reference), start)


@pytest.mark.slow
def test_fused_iteration_on_a_mesh_matches_the_step_by_step_one_and_keeps_shardings(batches):
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, expert=2, tensor=1))
    fused, reference, _ = run_both(
        config(critic=CriticConfig(steps=3, warmup_steps=1)), batches["near"][:2], mesh=mesh
    )
    for learner in (fused, reference):
        kernel = learner.policy_params["layers"][0]["moe"]["experts"]["gate_proj"].get_value()
        assert kernel.sharding.spec[0] == "expert"
    for a, b in zip(
        jax.tree.leaves((fused.critic_params, fused.critic_opt_state)),
        jax.tree.leaves((reference.critic_params, reference.critic_opt_state)),
        strict=True,
    ):
        assert a.sharding == b.sharding


def test_the_step_by_step_switch_runs_the_reference_path(batches):
    cfg = config(fused_iteration=False, critic=CriticConfig(warmup_steps=0))
    learner, reference = Learner(cfg, tiny_policy()), Learner(cfg, tiny_policy())
    metrics = learner.iteration(batches["near"][0])
    expected, _ = stepwise_iteration(reference, batches["near"][0])
    assert {k: metrics[k] for k in expected} == expected  # the same jitted calls: bit-identical
    for name, value in states(reference).items():
        np.testing.assert_array_equal(states(learner)[name], value, err_msg=name)
