"""SEED stage 2: the OPD term in the learner's gradient, and the skill-injected re-scoring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from seed_factories import demo_store, first_batch, tiny_policy, word_tokenizer

from atdp_io.grammar_masks import stop_bitmask
from sao_jax.losses import seed_distribution_loss, seed_opd_loss
from sao_jax.models import MoeAuxConfig
from sao_jax.seed import (
    Analyzer,
    RuleBasedAlfworldAnalyzer,
    SeedLearner,
    skill_block_ids,
    skill_injected_batch,
    skill_logprobs,
    skill_top_logprobs,
)
from sao_jax.train import Learner, LearnerConfig, objectives
from sao_jax.train.config import OpdConfig
from sao_jax.train.learner_steps import policy_loss_fn


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    store = demo_store(tmp_path_factory.mktemp("opd"), num_episodes=2)
    batch = first_batch(store, rows=8, seq_len=256)
    rng = np.random.default_rng(0)
    mask = batch["loss_mask"] > 0
    # behaviour log-probs near the policy's, rewards on the last action of each trajectory
    batch["rollout_logp"] = np.where(mask, -3.0 - rng.random(mask.shape), 0.0).astype(np.float32)
    return batch


def test_opd_term_changes_the_gradient_exactly_by_lambda_times_its_own(batch):
    policy = tiny_policy()
    graphdef, params = nnx.split(policy)
    device = {k: jnp.asarray(v) for k, v in batch.items()}
    rng = np.random.default_rng(1)
    advantages = jnp.asarray(rng.normal(size=batch["tokens"].shape), jnp.float32)
    skill_logp = jnp.asarray(
        np.where(batch["loss_mask"] > 0, -2.0 * rng.random(batch["tokens"].shape), 0.0),
        jnp.float32,
    )
    device["skill_logp"] = skill_logp
    lam = 0.37
    policy_loss = policy_loss_fn(LearnerConfig(algorithm="sao_seed"))

    def rl_loss(p, opd_term):
        return objectives.policy_gradient_loss(
            nnx.merge(graphdef, p), device, advantages, device["rollout_logp"], policy_loss,
            entropy_coef=0.0, moe_aux=MoeAuxConfig(), chunk_size=64,
            opd=opd_term,
        )[0]  # fmt: skip

    def opd_only(p, mode):
        logp, _, _ = objectives.policy_logprobs(nnx.merge(graphdef, p), device, chunk_size=64)
        return seed_opd_loss(logp, skill_logp, objectives.action_mask(device), mode=mode)[0]

    @jax.jit
    def gradients(p):
        out = {"without": jax.grad(rl_loss)(p, None)}
        for mode in ("gated", "signed"):
            opd = OpdConfig(weight=lam, beta=5.0, mode=mode)
            out[mode] = jax.grad(rl_loss)(p, opd)
            out[f"{mode}_direct"] = jax.grad(opd_only)(p, mode)
        return out

    grads = gradients(params)
    for mode in ("gated", "signed"):
        direct = grads[f"{mode}_direct"]
        diff = jax.tree.map(lambda a, b: a - b, grads[mode], grads["without"])
        scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(direct))
        assert scale > 0  # the term has a gradient to compare
        for got, want in zip(jax.tree.leaves(diff), jax.tree.leaves(direct), strict=True):
            np.testing.assert_allclose(got, lam * want, atol=2e-6 * scale + 1e-7)


def test_skill_rows_put_actions_at_their_positions_and_match_a_direct_forward(batch):
    tokenizer = word_tokenizer()
    policy = tiny_policy(seed=3)
    slots = sorted(set(batch["traj_index"][batch["traj_index"] >= 0]))
    skills = ["the mug is in drawer 1.", "go to cabinet 2 and take the apple.", "look"]
    blocks = {k: skill_block_ids(tokenizer, skills[i % 3]) for i, k in enumerate(slots)}
    S = 48
    injected, stats = skill_injected_batch(batch, blocks, S)
    mask = batch["loss_mask"] > 0
    assert injected["tokens"].shape == (batch["tokens"].shape[0], S + batch["tokens"].shape[1])
    np.testing.assert_array_equal(injected["tokens"][:, S:], batch["tokens"])
    np.testing.assert_array_equal(injected["loss_mask"][:, S:], batch["loss_mask"])
    assert not injected["loss_mask"][:, :S].any()
    assert stats["truncated"] == 0

    learner = Learner(LearnerConfig(algorithm="grpo"), tiny_policy(seed=3))
    skill_logp, _ = skill_logprobs(learner.policy_logprobs, batch, blocks, S)
    # the hand-built sequences "block + the row's real tokens", right-padded, one plain forward
    rows = [r for r in range(batch["tokens"].shape[0]) if batch["traj_index"][r] >= 0]
    sequences = [
        [*blocks[int(batch["traj_index"][r])], *batch["tokens"][r][batch["segment_ids"][r] > 0]]
        for r in rows
    ]
    width = max(map(len, sequences))
    tokens = np.zeros((len(rows), width), np.int32)
    segments = np.zeros((len(rows), width), np.int32)
    for i, sequence in enumerate(sequences):
        tokens[i, : len(sequence)], segments[i, : len(sequence)] = sequence, 1
    graphdef, state = nnx.split(policy)
    logits = jax.jit(lambda st, t, s: nnx.merge(graphdef, st)(t, segment_ids=s))(
        state, tokens, segments
    )
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
    for i, r in enumerate(rows):
        n = len(blocks[int(batch["traj_index"][r])])
        t = np.flatnonzero(mask[r])
        assert t.size
        direct = logp[i, n + t - 1, tokens[i, n + t]]
        np.testing.assert_allclose(skill_logp[r, t], direct, atol=2e-5)
    assert np.all(skill_logp[~mask] == 0)


def test_too_long_blocks_are_truncated_and_counted(batch):
    blocks = {0: list(range(5, 40))}
    injected, stats = skill_injected_batch(batch, blocks, 16)
    assert stats["truncated"] == sum(
        1 for r, k in enumerate(batch["traj_index"]) if k == 0 and batch["segment_ids"][r].any()
    )
    row = int(np.flatnonzero(batch["traj_index"] == 0)[0])
    np.testing.assert_array_equal(injected["tokens"][row, :16], [*range(5, 19), 38, 39])


def test_seed_learner_runs_the_opd_step_and_reports_its_cost(batch):
    tokenizer = word_tokenizer()
    config = LearnerConfig(algorithm="grpo_seed", opd=OpdConfig(weight=0.5))
    learner = SeedLearner(
        config,
        tiny_policy(),
        analyzer=_BatchAnalyzer(),
        tokenizer=tokenizer,
        max_skill_tokens=64,
    )
    seen = []
    learner.on_skills = lambda records, skills: seen.extend(zip(records, skills, strict=True))
    before = learner.policy_logprobs(batch)
    metrics = learner.iteration(batch)
    assert learner.policy_version == 1
    assert metrics["seed/skills"] == len(set(batch["traj_index"][batch["traj_index"] >= 0]))
    assert metrics["seed/analysis_seconds"] >= 0 and metrics["seed/rescore_seconds"] > 0
    assert len(seen) == metrics["seed/skills"]
    # the step's OPD loss is the formula on the pre-step log-probs and the re-scored skill_logp
    blocks = {i: skill_block_ids(tokenizer, "look") for i in range(16)}
    skill_logp, _ = skill_logprobs(
        Learner(config, tiny_policy()).policy_logprobs, batch, blocks, 64
    )
    mask = objectives.action_mask({k: jnp.asarray(v) for k, v in batch.items()})
    want, parts = seed_opd_loss(before, skill_logp, mask)
    np.testing.assert_allclose(metrics["policy/opd_loss"], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["policy/opd_gate_mean"], parts["gate_mean"], rtol=1e-4)


def test_bad_input_is_named(batch):
    learner = Learner(LearnerConfig(algorithm="grpo_seed"), tiny_policy())
    with pytest.raises(ValueError, match="skill_logp"):
        learner.iteration(batch)
    with pytest.raises(ValueError, match="no OPD term"):
        SeedLearner(
            LearnerConfig(algorithm="sao"),
            tiny_policy(),
            analyzer=RuleBasedAlfworldAnalyzer(),
            tokenizer=word_tokenizer(),
        )
    with pytest.raises(ValueError, match=r"OpdConfig\.mode must be one of"):
        OpdConfig(mode="both")


class _BatchAnalyzer(Analyzer):
    """A fixed skill for every episode."""

    name = "fixed"
    version = "v0"

    def analyze_texts(self, records):
        return ["look" for _ in records]


def test_the_teacher_scores_constrained_tokens_under_the_students_grammar_mask(batch):
    """A served call decoded under a grammar: its action tokens carry `mask_index` /
    `mask_table`. The skill-injected rows keep them aligned with the tokens, so with no skill
    block the teacher's log-probs equal the student's masked ones (and differ from unmasked)."""
    learner = Learner(LearnerConfig(algorithm="grpo"), tiny_policy(seed=5))
    vocab = learner.policy_module().config.vocab_size
    words = -(-vocab // 32)
    tokens, action = batch["tokens"], batch["loss_mask"] > 0
    # one mask per row: its own action tokens and ids 1..3 allowed, every other id masked out
    table = np.stack(
        [
            stop_bitmask(sorted({1, 2, 3, *tokens[r][action[r]].tolist()}), words)[None]
            for r in range(tokens.shape[0])
        ]
    )
    masked = dict(  # the loader gives masked rows the (identity) sampling keys too
        batch,
        mask_index=np.where(action, 0, -1).astype(np.int32),
        mask_table=table,
        sample_temperature=np.ones(tokens.shape, np.float32),
        sample_top_k=np.zeros(tokens.shape, np.int32),
        sample_top_p=np.ones(tokens.shape, np.float32),
    )
    student = learner.policy_logprobs(masked)
    teacher, _ = skill_logprobs(learner.policy_logprobs, masked, {}, 8)
    np.testing.assert_allclose(teacher[action], student[action], atol=2e-5)
    unmasked = learner.policy_logprobs(batch)
    assert np.all(student[action] >= unmasked[action] - 1e-5)  # renormalised over fewer ids
    assert np.max(student[action] - unmasked[action]) > 0.1


def _teacher_top(rng, batch, k, vocab):
    """A random teacher's top k at the action tokens: distinct ids, log-probs of a softmax."""
    mask = batch["loss_mask"] > 0
    logits = rng.normal(size=(*batch["tokens"].shape, vocab)) * 2
    full = np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1))
    ids = np.argsort(-full, axis=-1)[..., :k].astype(np.int32)
    top = np.take_along_axis(full, ids, -1)
    return np.where(mask[..., None], ids, 0), np.where(mask[..., None], top, 0.0)


@pytest.mark.parametrize("action_capacity", [None, 64])
def test_the_kl_term_changes_the_gradient_exactly_by_lambda_times_its_own(batch, action_capacity):
    """Mode "kl": the policy loss's gradient moves by lambda times the gradient of
    `seed_distribution_loss` of a plain dense forward's log-probs of the teacher's tokens,
    with the LM head at every position or at the action tokens only."""
    policy = tiny_policy()
    graphdef, params = nnx.split(policy)
    rng = np.random.default_rng(2)
    ids, top = _teacher_top(rng, batch, 5, policy.config.vocab_size)
    device = {k: jnp.asarray(v) for k, v in batch.items()}
    device.update(
        skill_logp=jnp.zeros(batch["tokens"].shape), skill_top_ids=ids, skill_top_logp=top
    )
    advantages = jnp.asarray(rng.normal(size=batch["tokens"].shape), jnp.float32)
    policy_loss = policy_loss_fn(LearnerConfig(algorithm="sao_seed"))
    mask = objectives.action_mask(device)
    lam = 0.41

    def rl_loss(p, opd_term):
        return objectives.policy_gradient_loss(
            nnx.merge(graphdef, p), device, advantages, device["rollout_logp"], policy_loss,
            entropy_coef=0.0, moe_aux=MoeAuxConfig(), chunk_size=64, opd=opd_term,
            action_capacity=action_capacity,
        )  # fmt: skip

    def kl_only(p):
        model = nnx.merge(graphdef, p)
        full = jax.nn.log_softmax(
            model(
                device["tokens"], positions=device["positions"], segment_ids=device["segment_ids"]
            ),
            axis=-1,
        )
        # the distribution before token t predicts it: column t - 1
        shifted = jnp.concatenate([full[:, :1], full[:, :-1]], axis=1)
        student = jnp.take_along_axis(shifted, device["skill_top_ids"], -1)
        return seed_distribution_loss(student, device["skill_top_logp"], mask)

    @jax.jit
    def gradients(p):
        without = jax.grad(lambda q: rl_loss(q, None)[0])(p)
        opd = OpdConfig(weight=lam, mode="kl", top_k=5)
        (_, metrics), with_kl = jax.value_and_grad(lambda q: rl_loss(q, opd), has_aux=True)(p)
        (direct_value, _), direct = jax.value_and_grad(kl_only, has_aux=True)(p)
        return without, with_kl, direct, metrics, direct_value

    without, with_kl, direct, metrics, direct_value = gradients(params)
    np.testing.assert_allclose(metrics["opd_kl"], direct_value, rtol=1e-4)
    assert float(metrics["opd_kl"]) > 0 and "opd_token_grad_share" not in metrics
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(direct))
    assert scale > 0
    diff = jax.tree.map(lambda a, b: a - b, with_kl, without)
    for got, want in zip(jax.tree.leaves(diff), jax.tree.leaves(direct), strict=True):
        np.testing.assert_allclose(got, lam * want, atol=2e-5 * scale + 1e-7)


def test_the_teacher_keeps_its_top_k_with_the_skill_in_context_in_one_forward(batch):
    """`skill_top_logprobs` gives the sampled tokens' `skill_logp` of `skill_logprobs` and, at
    each action token, the k most likely tokens of the skill-conditioned distribution."""
    tokenizer = word_tokenizer()
    slots = sorted(set(batch["traj_index"][batch["traj_index"] >= 0]))
    blocks = {k: skill_block_ids(tokenizer, "the mug is in drawer 1.") for k in slots}
    config = LearnerConfig(algorithm="sao_seed", opd=OpdConfig(mode="kl", top_k=6))
    learner = Learner(config, tiny_policy(seed=4))
    teacher, stats = skill_top_logprobs(learner.policy_top_logprobs, batch, blocks, 32)
    want, _ = skill_logprobs(learner.policy_logprobs, batch, blocks, 32)
    mask = batch["loss_mask"] > 0
    np.testing.assert_allclose(teacher["skill_logp"], want, atol=2e-5)
    assert teacher["skill_top_ids"].shape == (*mask.shape, 6) and stats["truncated"] == 0
    # the sampled token is among the top 6 exactly when its log-prob reaches the 6th's
    top, ids = teacher["skill_top_logp"], teacher["skill_top_ids"]
    inside = np.any(ids == batch["tokens"][..., None], axis=-1)
    np.testing.assert_array_equal(inside[mask], want[mask] >= top[..., -1][mask] - 1e-5)
    assert np.all(np.diff(top[mask], axis=-1) <= 1e-6) and np.all(top[mask] <= 0)
    assert np.all(ids[~mask] == 0) and np.all(top[~mask] == 0)


def test_a_kl_seed_learner_steps_on_the_teachers_distribution(batch):
    tokenizer = word_tokenizer()
    config = LearnerConfig(
        algorithm="grpo_seed", opd=OpdConfig(weight=0.5, mode="kl", top_k=4, grad_share=True)
    )
    learner = SeedLearner(
        config, tiny_policy(), analyzer=_BatchAnalyzer(), tokenizer=tokenizer, max_skill_tokens=64
    )
    reference = Learner(config, tiny_policy())  # the same weights, before the step
    metrics = learner.iteration(batch)
    assert learner.policy_version == 1
    blocks = {i: skill_block_ids(tokenizer, "look") for i in range(16)}
    teacher, _ = skill_top_logprobs(reference.policy_top_logprobs, batch, blocks, 64)
    mask = objectives.action_mask({k: jnp.asarray(v) for k, v in batch.items()})
    want, parts = seed_distribution_loss(
        _student_logp_of(reference, batch, teacher["skill_top_ids"]),
        teacher["skill_top_logp"],
        mask,
    )
    np.testing.assert_allclose(metrics["policy/opd_loss"], want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["policy/opd_teacher_mass"], parts["teacher_mass"], rtol=1e-4)
    assert metrics["policy/opd_grad_share"] > 0 and np.isfinite(metrics["policy/opd_delta_mean"])


def _student_logp_of(learner, batch, ids):
    """The learner's policy's log-probs of `ids` [R, T, K], one dense forward."""
    model = learner.policy_module()
    full = jax.nn.log_softmax(
        model(
            jnp.asarray(batch["tokens"]),
            positions=jnp.asarray(batch["positions"]),
            segment_ids=jnp.asarray(batch["segment_ids"]),
        ),
        axis=-1,
    )
    shifted = jnp.concatenate([full[:, :1], full[:, :-1]], axis=1)
    return jnp.take_along_axis(shifted, jnp.asarray(ids), -1)


def test_a_kl_learner_without_the_teachers_top_k_is_refused(batch):
    config = LearnerConfig(algorithm="sao_seed", opd=OpdConfig(mode="kl"))
    learner = Learner(config, tiny_policy())
    learner.counters.warmup_iterations = config.critic.warmup_steps  # past the critic warm-up
    skill_logp = np.zeros(batch["tokens"].shape, np.float32)
    with pytest.raises(ValueError, match=r"skill_top_ids"):
        learner.iteration({**batch, "skill_logp": skill_logp})
    with pytest.raises(ValueError, match=r"top_k must be >= 1"):
        OpdConfig(mode="kl", top_k=0)
    with pytest.raises(ValueError, match="needs mode='signed'"):
        OpdConfig(mode="kl", clip=1.0)
