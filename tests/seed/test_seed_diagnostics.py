"""SEED stage-2 diagnostics: the teacher-student gap (mean, distribution, per skill kind), the
gate rate and the OPD term's share of the policy gradient, on batches where they are known."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from seed_factories import demo_store, first_batch, tiny_policy, word_tokenizer

from sao_jax.losses import SKILL_KINDS
from sao_jax.models import MoeAuxConfig
from sao_jax.seed import (
    RuleBasedAlfworldAnalyzer,
    SeedLearner,
    from_batch,
    kind_bits,
    with_task_specs,
)
from sao_jax.train import Learner, LearnerConfig, objectives
from sao_jax.train.config import OpdConfig
from sao_jax.train.learner_steps import policy_loss_fn

# no entropy bonus, no MoE aux loss: the policy loss is the RL objective plus the OPD term
QUIET = dict(entropy_coef=0.0, moe=MoeAuxConfig(load_balance_weight=0.0, router_z_weight=0.0))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return demo_store(tmp_path_factory.mktemp("diagnostics"), num_episodes=3)


@pytest.fixture(scope="module")
def batch(store):
    batch = first_batch(store, rows=12, seq_len=256)
    mask = batch["loss_mask"] > 0
    batch["rollout_logp"] = np.where(mask, -2.5, 0.0).astype(np.float32)
    return batch


def _slots(batch):
    return sorted(int(k) for k in set(batch["traj_index"][batch["traj_index"] >= 0]))


def _row_kinds(batch, kinds_of_slot):
    return np.asarray(
        [kind_bits(kinds_of_slot.get(int(k), ())) for k in batch["traj_index"]], np.int32
    )


@pytest.mark.parametrize("mode", ["signed", "gated"])
def test_teacher_equal_to_student_gives_zero_gap(batch, mode):
    policy = tiny_policy()
    graphdef, params = nnx.split(policy)
    device = {k: jnp.asarray(v) for k, v in batch.items() if k != "trajectory_refs"}
    capacity = objectives.action_capacity_for(batch["loss_mask"])
    logp, _, _ = objectives.policy_logprobs(policy, device, chunk_size=64, action_capacity=capacity)
    device["skill_logp"] = logp  # the teacher is the student, token for token
    slots = _slots(batch)
    device["skill_kinds"] = jnp.asarray(_row_kinds(batch, {slots[0]: ("fact", "procedure")}))
    opd = OpdConfig(weight=0.5, mode=mode)
    advantages = jnp.asarray(np.random.default_rng(0).normal(size=batch["tokens"].shape))
    _, metrics = objectives.policy_gradient_loss(
        policy, device, advantages, device["rollout_logp"], policy_loss_fn(LearnerConfig()),
        opd=opd, chunk_size=64, action_capacity=capacity, entropy_coef=0.0,
        moe_aux=QUIET["moe"],
    )  # fmt: skip
    for key in ("delta_mean", "delta_abs_mean", "delta_std", "delta_p10", "delta_p50",
                "delta_p90", "gate_rate", "gap_fact", "gap_procedure"):  # fmt: skip
        assert float(metrics[f"opd_{key}"]) == 0.0, key
    assert np.isnan(metrics["opd_gap_failed_command"]) and np.isnan(metrics["opd_gap_other"])
    rows = np.asarray(batch["traj_index"]) == slots[0]
    mask = np.asarray(objectives.action_mask(device))
    share = mask[rows].sum() / mask.sum()
    np.testing.assert_allclose(metrics["opd_kind_share_fact"], share, rtol=1e-6)
    np.testing.assert_allclose(metrics["opd_kind_share_procedure"], share, rtol=1e-6)

    norm = objectives.opd_gradient_norm(
        lambda p: nnx.merge(graphdef, p), params, device, opd, chunk_size=64,
        action_capacity=capacity,
    )  # fmt: skip
    if mode == "signed":
        # no gap, no signal: the signed term has no gradient at all
        assert float(norm) == 0.0 and float(metrics["opd_token_grad_share"]) == 0.0
    else:
        # the gate is 1/2 at a zero gap: the gated term still pushes every sampled token up
        assert float(norm) > 0.0 and float(metrics["opd_token_grad_share"]) > 0.0


def test_a_known_shift_gives_the_known_gap_per_kind_and_distribution(batch):
    config = LearnerConfig(algorithm="grpo_seed", opd=OpdConfig(weight=0.1), **QUIET)
    learner = Learner(config, tiny_policy())
    logp = learner.policy_logprobs(batch)
    slots = _slots(batch)
    assert len(slots) >= 3
    shifts = {slots[0]: 0.5, slots[1]: -0.25, slots[2]: 0.0}
    kinds = {slots[0]: ("fact",), slots[1]: ("procedure", "failed_command"), slots[2]: ("other",)}
    shift = np.asarray([shifts.get(int(k), 0.0) for k in batch["traj_index"]], np.float32)
    mask = np.asarray(objectives.action_mask({"loss_mask": jnp.asarray(batch["loss_mask"])})) > 0
    skill_logp = np.where(batch["loss_mask"] > 0, logp + shift[:, None], 0.0).astype(np.float32)
    metrics = learner.iteration(
        {**batch, "skill_logp": skill_logp, "skill_kinds": _row_kinds(batch, kinds)}
    )
    deltas = np.broadcast_to(shift[:, None], mask.shape)[mask]
    np.testing.assert_allclose(metrics["policy/opd_gap_fact"], 0.5, atol=1e-4)
    np.testing.assert_allclose(metrics["policy/opd_gap_procedure"], -0.25, atol=1e-4)
    np.testing.assert_allclose(metrics["policy/opd_gap_failed_command"], -0.25, atol=1e-4)
    np.testing.assert_allclose(metrics["policy/opd_gap_other"], 0.0, atol=1e-4)
    np.testing.assert_allclose(metrics["policy/opd_delta_mean"], deltas.mean(), atol=1e-4)
    np.testing.assert_allclose(metrics["policy/opd_delta_std"], deltas.std(), atol=1e-4)
    for q in (10, 50, 90):
        want = np.quantile(deltas, q / 100)
        np.testing.assert_allclose(metrics[f"policy/opd_delta_p{q}"], want, atol=1e-3)
    # the tokens the term pushes up: those of the positive-shift trajectory (the zero-shift
    # one's deltas are rounding noise around 0, either side)
    zero = np.broadcast_to((shift == 0.0)[:, None], mask.shape)[mask]
    positive = (deltas > 0).mean()
    assert positive <= metrics["policy/opd_gate_rate"] <= positive + zero.mean() + 1e-6
    for kind in SKILL_KINDS:
        assert 0.0 < metrics[f"policy/opd_kind_share_{kind}"] < 1.0
    assert "policy/opd_grad_share" not in metrics  # the exact share is off by default


def test_grad_share_is_one_when_the_rl_gradient_vanishes(batch):
    # GRPO with equal rewards: every advantage is 0, so the whole gradient is the OPD term's
    opd = OpdConfig(weight=0.3, mode="signed", grad_share=True)
    config = LearnerConfig(algorithm="grpo_seed", opd=opd, **QUIET)
    learner = Learner(config, tiny_policy())
    flat = {**batch, "rewards": np.zeros_like(batch["rewards"])}
    logp = learner.policy_logprobs(flat)
    skill_logp = np.where(flat["loss_mask"] > 0, logp + 0.4, 0.0).astype(np.float32)
    metrics = learner.iteration({**flat, "skill_logp": skill_logp})
    assert metrics["policy/grad_norm"] > 0
    np.testing.assert_allclose(metrics["policy/opd_grad_share"], 1.0, rtol=1e-3)
    np.testing.assert_allclose(metrics["policy/opd_token_grad_share"], 1.0, rtol=1e-3)
    assert metrics["policy/opd_token_grad_cos"] == 0.0  # no RL gradient to agree with
    assert "policy/opd_gap_fact" not in metrics  # no skill_kinds: no per-kind gap


def test_seed_learner_reads_rule_skills_of_a_batch_with_their_kinds(store, batch):
    records = from_batch(batch, word_tokenizer())
    assert all(r.game is None for r in records.values())  # rows carry no game spec
    filled = with_task_specs(records, store)
    assert all(r.game and {"split", "index"} <= set(r.game) for r in filled.values())
    learner = SeedLearner(
        LearnerConfig(algorithm="grpo_seed", opd=OpdConfig(weight=0.1)),
        tiny_policy(),
        analyzer=RuleBasedAlfworldAnalyzer(),
        tokenizer=word_tokenizer(),
        max_skill_tokens=96,
        store=store,
    )
    metrics = learner.iteration(batch)
    # expert episodes: where the objects were, and the procedure
    assert metrics["seed/skills_fact"] == metrics["seed/skills_procedure"] == 1.0
    assert metrics["seed/skills_other"] == 0.0
    assert np.isfinite(metrics["policy/opd_gap_fact"])
    np.testing.assert_allclose(
        metrics["policy/opd_gap_fact"], metrics["policy/opd_delta_mean"], atol=1e-5
    )
    assert np.isnan(metrics["policy/opd_gap_other"])
    assert {p.kind for s in learner.last_skills for p in s.parts} == {"fact", "procedure"}


def test_bad_kinds_are_named():
    from sao_jax.losses import seed_gap_by_kind

    logp = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match=r"row_kinds must be \[B\]"):
        seed_gap_by_kind(logp, logp, jnp.ones((2, 3)), jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="unknown kind 'hint'"):
        kind_bits(["fact", "hint"])
