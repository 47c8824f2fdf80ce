"""The learner: DIS gradient, frozen critic attention, K critic steps, warm-up, non-finite skips,
PPO / GRPO paths, resume, sharded steps, config errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from train_factories import episode, exact_learner_config, first_batch, tiny_policy, write_store

from sao_jax.checkpoint import Checkpointer
from sao_jax.losses import adaptive_lambda, sao_policy_loss
from sao_jax.sharding import MeshConfig, make_mesh
from sao_jax.train import ClipConfig, CriticConfig, LearnerConfig, OptimizerConfig
from sao_jax.train.learner import Learner
from sao_jax.train.partition import path_string

LR = 1e-3


def config(**changes) -> LearnerConfig:
    return exact_learner_config(LR, **changes)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    episodes = [episode(f"e{i}", seed=i, reward=float(i % 3 == 0)) for i in range(6)]
    return first_batch(write_store(tmp_path_factory.mktemp("store"), episodes), rows=8, seq_len=48)


def flat(state) -> dict[str, np.ndarray]:
    return {path_string(p): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def near_policy_logprobs(learner, batch, seed=0):
    """Rollout log-probs near the current policy's: some ratios inside DIS's band, some out."""
    logp = learner.policy_logprobs(batch)
    noise = np.random.default_rng(seed).uniform(-0.6, 0.6, logp.shape).astype(np.float32)
    return dict(batch, rollout_logp=np.where(batch["loss_mask"] > 0, logp + noise, 0.0))


def reference_logprobs(policy, batch):
    """log pi(token t | tokens < t) from the model's plain logits (not the learner's code)."""
    logits = policy(batch["tokens"], positions=batch["positions"], segment_ids=batch["segment_ids"])
    logp = jax.nn.log_softmax(logits, axis=-1)
    taken = jnp.take_along_axis(logp[:, :-1], batch["tokens"][:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(taken, ((0, 0), (1, 0)))


def test_policy_step_follows_the_dis_gradient(batch):
    learner = Learner(config(), tiny_policy())
    batch = near_policy_logprobs(learner, batch)
    graphdef, before, frozen = nnx.split(learner.policy_module(), nnx.Param, ...)
    mask = batch["loss_mask"].astype(np.float32)
    # The critic starts with a zero value head, so GAE's advantages are lambda-returns of V = 0.
    lam = float(adaptive_lambda(jnp.float32(mask[0].sum()), 1.5))
    advantages = np.zeros_like(mask)
    for row in range(mask.shape[0]):
        running = 0.0
        for t in reversed(np.flatnonzero(mask[row])):
            running = batch["rewards"][row, t] + lam * running
            advantages[row, t] = running
    np.testing.assert_allclose(learner.advantages(batch)["advantages"], advantages, atol=1e-6)

    def logp_of(params):
        return reference_logprobs(nnx.merge(graphdef, params, frozen), batch)

    logp, vjp = jax.vjp(jax.jit(logp_of), before)
    ratio = np.exp(np.asarray(logp) - batch["rollout_logp"])
    keep = (mask > 0) & (ratio > 0.7) & (ratio < 6.0)
    assert 0 < keep.sum() < mask.sum()  # both kept and dropped tokens are exercised
    # DIS: gradient of -r * A on kept tokens, 0 on dropped ones, over all action tokens.
    (formula_grad,) = vjp(jnp.asarray(np.where(keep, -ratio * advantages, 0.0) / mask.sum()))
    direct_grad = jax.jit(
        jax.grad(lambda p: sao_policy_loss(logp_of(p), batch["rollout_logp"], advantages, mask)[0])
    )(before)
    formula, direct = flat(formula_grad), flat(direct_grad)
    for name in formula:
        np.testing.assert_allclose(direct[name], formula[name], rtol=1e-4, atol=1e-8)

    metrics = learner.iteration(batch)
    assert metrics["policy/clip_frac"] == pytest.approx(1 - keep.sum() / mask.sum(), abs=1e-6)
    after = flat(nnx.state(learner.policy_module(), nnx.Param))
    start = flat(before)
    for name, g in formula.items():
        # Adam's first step: -lr * g / (|g| + eps), elementwise.
        big = np.abs(g) > 1e-5
        expected = -LR * g / (np.abs(g) + 1e-8)
        np.testing.assert_allclose((after[name] - start[name])[big], expected[big], atol=3e-6)


def test_critic_attention_stays_frozen_while_its_ffn_and_head_train(batch):
    policy = tiny_policy()
    initial = flat(nnx.state(policy, nnx.Param))
    learner = Learner(config(), policy)
    for seed in range(2):
        learner.iteration(near_policy_logprobs(learner, batch, seed))
    critic = flat(nnx.state(learner.critic_module(), nnx.Param))
    policy_now = flat(nnx.state(learner.policy_module(), nnx.Param))
    frozen = [n for n in critic if "/attn/" in n or n.startswith(("embed", "final_norm"))]
    trained = [n for n in critic if "/moe/" in n or n.startswith("value_head")]
    assert frozen and trained and len(frozen) + len(trained) + 4 == len(critic)  # + 4 ffn norms
    for name in frozen:
        np.testing.assert_array_equal(critic[name], initial[name], err_msg=name)
    for name in trained:
        reference = initial.get(name, np.zeros_like(critic[name]))
        assert not np.array_equal(critic[name], reference), name
    # the policy itself is not frozen
    assert not np.array_equal(
        policy_now["layers/0/attn/q_proj/kernel"], initial["layers/0/attn/q_proj/kernel"]
    )


def test_warmup_then_k_critic_steps_per_policy_step(batch):
    learner = Learner(config(critic=CriticConfig(steps=3, warmup_steps=2)), tiny_policy())
    policy_start = flat(nnx.state(learner.policy_module(), nnx.Param))
    critic_start = flat(learner.critic_params)
    phases = [learner.iteration(batch)["phase"] for _ in range(2)]
    assert phases == [0.0, 0.0]
    assert (learner.counters.policy_version, learner.counters.critic_steps) == (0, 6)
    unchanged = flat(nnx.state(learner.policy_module(), nnx.Param))
    for name, value in policy_start.items():
        np.testing.assert_array_equal(unchanged[name], value)
    assert any(
        not np.array_equal(v, critic_start[k]) for k, v in flat(learner.critic_params).items()
    )
    metrics = learner.iteration(batch)
    assert metrics["phase"] == 1.0 and metrics["policy_version"] == 1.0
    assert (learner.counters.policy_version, learner.counters.critic_steps) == (1, 9)
    assert "policy/clip_frac" in metrics and "critic/explained_variance" in metrics


def test_a_non_finite_loss_skips_the_update_and_never_touches_the_weights(batch):
    learner = Learner(config(), tiny_policy())
    batch = near_policy_logprobs(learner, batch)  # DIS keeps tokens, so NaN reaches the loss
    learner.iteration(batch)  # real optimizer moments to protect
    snapshot = jax.tree.map(
        np.asarray,
        (
            learner.policy_params,
            learner.policy_opt_state,
            learner.critic_params,
            learner.critic_opt_state,
        ),
    )
    poisoned = dict(batch, rewards=np.where(batch["loss_mask"] > 0, np.nan, batch["rewards"]))
    metrics = learner.iteration(poisoned)
    assert metrics["policy/skipped"] == 1.0 and metrics["critic/skipped"] == 1.0
    assert learner.counters.skipped_policy_steps == 1
    assert learner.counters.skipped_critic_steps == 2  # both of the K = 2 critic steps
    assert learner.policy_version == 1  # a skipped step publishes nothing new
    after = (
        learner.policy_params,
        learner.policy_opt_state,
        learner.critic_params,
        learner.critic_opt_state,
    )
    for old, new in zip(jax.tree.leaves(snapshot), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(np.asarray(new), old)
    clean = learner.iteration(batch)  # and training goes on
    assert clean["policy/skipped"] == 0.0 and np.isfinite(clean["policy/loss"])
    assert learner.policy_version == 2


@pytest.mark.slow
def test_ppo_takes_its_ratio_against_the_learners_own_old_logprobs(batch):
    learner = Learner(config(algorithm="ppo", clip=ClipConfig(ppo_epochs=1)), tiny_policy())
    # rollout log-probs far from the policy: PPO must ignore them
    garbage = dict(
        batch, rollout_logp=np.where(batch["loss_mask"] > 0, -9.0, 0.0).astype(np.float32)
    )
    # the old log-probs are the policy's on the action tokens (the head runs nowhere else)
    actions = batch["loss_mask"] > 0
    actions[:, 0] = False
    behaviour = learner.advantages(garbage)["behaviour_logp"]
    np.testing.assert_allclose(
        behaviour[actions], learner.policy_logprobs(batch)[actions], atol=1e-6
    )
    assert (behaviour[~actions] == 0).all()
    metrics = learner.iteration(garbage)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["policy/clip_frac"] == 0.0 and learner.policy_version == 1
    two = Learner(config(algorithm="ppo", clip=ClipConfig(ppo_epochs=2)), tiny_policy())
    metrics = two.iteration(garbage)  # the 2nd epoch sees the ratio move away from 1
    assert two.policy_version == 2 and metrics["policy/approx_kl"] > 0
    assert metrics["policy/ratio_mean"] != pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("algorithm", ["grpo", "grpo_dis"])
def test_grpo_scores_rollouts_against_their_group_without_a_critic(algorithm, tmp_path):
    prompts = [np.arange(3, 9), np.arange(10, 16)]
    rewards = [1.0, 0.0, 1.0, 1.0]  # group 0: one success, one failure; group 1: all succeed
    episodes = [
        episode(f"g{i}", seed=i, prompt=prompts[i // 2], reward=r) for i, r in enumerate(rewards)
    ]
    batch = first_batch(write_store(tmp_path, episodes), rows=4, seq_len=48)
    learner = Learner(config(algorithm=algorithm), tiny_policy())
    assert learner.critic_params is None
    with pytest.raises(ValueError, match="has no critic"):
        learner.critic_module()
    adv = learner.advantages(batch)["advantages"]
    per_row = [
        set(np.unique(a[m > 0]).round(4).tolist())
        for a, m in zip(adv, batch["loss_mask"], strict=True)
    ]
    assert per_row == [{1.0}, {-1.0}, {0.0}, {0.0}]
    metrics = learner.iteration(batch)
    assert metrics["batch/group_size_mean"] == 2.0 and "critic/loss" not in metrics
    assert ("policy/approx_kl" in metrics) == (algorithm == "grpo")  # PPO-clip vs DIS loss


def test_resume_continues_exactly_where_the_saved_run_stood(batch, tmp_path):
    batches = [near_policy_logprobs(Learner(config(), tiny_policy()), batch, s) for s in range(4)]
    first = Learner(config(critic=CriticConfig(warmup_steps=1)), tiny_policy())
    for b in batches[:2]:
        first.iteration(b)
    with Checkpointer(tmp_path / "ckpt") as checkpointer:
        first.save(checkpointer, 2, items={"train": {"rng": jax.random.key(7)}}, metadata={"x": 1})
        checkpointer.wait_until_finished()
        continued = [first.iteration(b) for b in batches[2:]]
        resumed = Learner(
            config(critic=CriticConfig(warmup_steps=1)), tiny_policy(seed=1)
        )  # other weights
        restored = resumed.restore(checkpointer, items={"train": {"rng": jax.random.key(0)}})
    assert restored.step == 2 and restored.metadata["x"] == 1
    assert (
        jax.random.key_data(restored.items["train"]["rng"]).tolist()
        == jax.random.key_data(jax.random.key(7)).tolist()
    )
    assert resumed.counters == dataclasses.replace(
        first.counters, iterations=2, policy_version=1, critic_steps=4, warmup_iterations=1
    )
    again = [resumed.iteration(b) for b in batches[2:]]
    assert again == continued
    assert resumed.counters == first.counters
    for a, b in zip(
        jax.tree.leaves((first.policy_params, first.critic_params, first.policy_opt_state)),
        jax.tree.leaves((resumed.policy_params, resumed.critic_params, resumed.policy_opt_state)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    wrong = Learner(config(algorithm="ppo"), tiny_policy())
    with (
        Checkpointer(tmp_path / "ckpt") as checkpointer,
        pytest.raises(ValueError, match="algorithm 'sao'"),
    ):
        wrong.restore(checkpointer)


@pytest.mark.slow
def test_sharded_learner_matches_the_single_device_one(batch):
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, expert=2, tensor=1))
    # Adam's first step is lr * g / (|g| + eps): with eps 1e-8, a gradient of ~1e-8 whose
    # float32 rounding differs with the reduction order moves its weight by a large part of
    # lr; eps 1e-3 makes small updates proportional to their gradients
    adam = OptimizerConfig(learning_rate=LR, max_grad_norm=0.0, eps=1e-3)
    kw = dict(policy_optimizer=adam, critic_optimizer=adam)
    single = Learner(config(**kw), tiny_policy())
    sharded = Learner(config(**kw), tiny_policy(), mesh=mesh)
    b = near_policy_logprobs(single, batch)
    one, two = single.iteration(b), sharded.iteration(b)
    for key in ("policy/loss", "policy/clip_frac", "critic/loss", "batch/advantage_mean"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    spec = (
        sharded.policy_params["layers"][0]["moe"]["experts"]["gate_proj"].get_value().sharding.spec
    )
    assert spec[0] == "expert"  # experts stay on the expert axis after the update
    a, c = flat(single.policy_params), flat(sharded.policy_params)
    for name in a:
        np.testing.assert_allclose(c[name], a[name], atol=2e-6, err_msg=name)


def test_a_zero_learning_rate_steps_without_changing_the_weights(batch):
    # the frozen control of a learning run: same iterations and counters, weights unmoved
    frozen = OptimizerConfig(learning_rate=0.0, weight_decay=0.1)
    learner = Learner(config(policy_optimizer=frozen, critic_optimizer=frozen), tiny_policy())
    policy_start = flat(nnx.state(learner.policy_module(), nnx.Param))
    critic_start = flat(learner.critic_params)
    metrics = learner.iteration(batch)
    assert metrics["policy_version"] == 1.0 and np.isfinite(metrics["policy/loss"])
    for name, value in flat(nnx.state(learner.policy_module(), nnx.Param)).items():
        np.testing.assert_array_equal(value, policy_start[name], err_msg=name)
    for name, value in flat(learner.critic_params).items():
        np.testing.assert_array_equal(value, critic_start[name], err_msg=name)
    for bad in (-1e-4, float("nan")):
        with pytest.raises(ValueError, match="learning_rate must be >= 0"):
            OptimizerConfig(learning_rate=bad)


def test_bad_configs_and_batches_are_named():
    with pytest.raises(ValueError, match="unknown algorithm 'sa0'"):
        LearnerConfig(algorithm="sa0")
    with pytest.raises(ValueError, match="not a regex"):
        LearnerConfig(critic_trainable=("moe/(",))
    with pytest.raises(ValueError, match=r"critic: trainable pattern 'mpl/' matches no parameter"):
        Learner(config(critic_trainable=("mpl/",)), tiny_policy())
    with pytest.raises(ValueError, match=r"CriticConfig\.steps must be >= 1"):
        CriticConfig(steps=0)
    learner = Learner(config(algorithm="grpo"), tiny_policy())
    with pytest.raises(ValueError, match=r"batch lacks .*'rollout_logp'"):
        learner.iteration({"tokens": np.zeros((2, 4), np.int32)})


def test_sao_makes_rewarded_windowed_replies_likelier_and_penalised_ones_rarer(tmp_path):
    # End to end through the loader's windowed rows (reward on the last turn's row only), linked
    # GAE, DIS and Adam: a sign error anywhere on that path moves the log-probs the wrong way.
    episodes = [
        episode(f"w{i}", seed=i, concat=False, reward=1.0 if i % 2 == 0 else -1.0) for i in range(4)
    ]
    batch = first_batch(write_store(tmp_path, episodes), rows=12, seq_len=24, layout="windowed")
    assert len(np.unique(batch["traj_index"][batch["traj_index"] >= 0])) == 4
    learner = Learner(config(), tiny_policy())
    on_policy = dict(batch, rollout_logp=learner.policy_logprobs(batch))
    start = on_policy["rollout_logp"]
    for _ in range(3):
        learner.iteration(on_policy)
    moved = learner.policy_logprobs(batch) - start
    rows_return = np.asarray(
        [float(batch["rewards"][batch["traj_index"] == k].sum()) for k in batch["traj_index"]]
    )
    mask = (batch["loss_mask"] > 0) & (batch["traj_index"] >= 0)[:, None]
    mask[:, 0] = False
    rewarded, penalised = mask & (rows_return > 0)[:, None], mask & (rows_return < 0)[:, None]
    assert rewarded.any() and penalised.any()
    # every turn of a trajectory moves, not only the rewarded last one (GAE links the rows)
    first_turns = batch["turn_index"] == 0
    assert moved[rewarded & first_turns[:, None]].mean() > 0
    assert moved[penalised & first_turns[:, None]].mean() < 0
    assert moved[rewarded].mean() > 0 > moved[penalised].mean()
