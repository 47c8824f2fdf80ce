"""TPU topologies, mesh presets and the per-device memory arithmetic of the dry-run, checked
against numbers worked out by hand for a small model."""

import pytest

from sao_jax.distributed.topology import mesh_preset, parse_topology
from sao_jax.models import get_model_config
from sao_jax.train import LearnerConfig
from sao_jax.train.algorithms import ALGORITHMS, get_algorithm
from sao_jax.train.memory import (
    GIB,
    Workload,
    activation_bytes,
    optimizer_bytes_per_element,
    plan_memory,
    shard_elements,
)


@pytest.mark.parametrize(
    ("name", "slices", "chips", "hosts", "hbm"),
    [
        ("v5p-64", 1, 32, 8, 95),
        ("v5p-8", 1, 4, 1, 95),
        ("v4-32", 2, 32, 8, 32),
        ("v5litepod-16", 1, 16, 4, 16),
        ("v5e-8", 1, 8, 1, 16),
        ("v6e-8", 1, 8, 1, 32),
        ("v6e-256", 4, 1024, 256, 32),
    ],
)
def test_topologies(name, slices, chips, hosts, hbm):
    topology = parse_topology(name, slices)
    assert (topology.chips, topology.hosts, topology.generation.hbm_gib) == (chips, hosts, hbm)
    assert topology.name == name.replace("v5e", "v5litepod")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("v7x-8", "unknown TPU generation 'v7x'"),
        ("v5p-63", "63 is not a whole number of chips"),
        ("v5e-10", "10 chips is not a whole number of 4-chip hosts"),
        ("tpu64", "is not of the form"),
    ],
)
def test_bad_topologies_are_named(name, message):
    with pytest.raises(ValueError, match=message):
        parse_topology(name)


def test_mesh_presets_fill_the_slice_and_split_slices_by_data():
    v5p = parse_topology("v5p-64", num_slices=2)
    preset = mesh_preset(v5p, num_experts=128)
    assert preset.resolve(v5p.chips, v5p.num_slices) == {
        "data": 2, "fsdp": 4, "expert": 8, "tensor": 1
    }  # fmt: skip
    # the expert axis shrinks to divide the experts (6) and a dense model has none
    assert mesh_preset(v5p, num_experts=6).ici.expert == 2
    assert mesh_preset(parse_topology("v6e-8"), num_experts=0).ici.expert == 1


SMALL = get_model_config("test", vocab_size=64, num_layers=1, capacity_factor=0.0)
MESH = {"data": 1, "fsdp": 2, "expert": 2, "tensor": 1}


def test_shards_split_only_where_an_axis_divides():
    # embed over fsdp (2), vocab over tensor (1); 63 rows: fsdp cannot split an odd dim
    assert shard_elements((64, 32), ("vocab", "embed"), MESH) == 64 * 16
    assert shard_elements((63, 32), ("embed", None), MESH) == 63 * 32
    assert shard_elements((4, 32, 32), ("experts", "embed", "expert_mlp"), MESH) == 2 * 16 * 32
    assert shard_elements((16,), None, MESH) == 16


def test_memory_terms_match_hand_arithmetic():
    workload = Workload(train_rows=8, seq_len=16, rollout_slots=8, context=64, logprob_chunk=8)
    (plan,) = plan_memory(SMALL, MESH, workload, hbm_bytes=GIB)
    terms = {t.name: t.bytes for t in plan.terms}
    # Policy leaves, elements on one device (fsdp splits `embed`, expert splits `experts`):
    embedding = 64 * 32 // 2
    attention = (32 * 32 + 32 * 16 + 32 * 16 + 32 * 32) // 2  # q, k, v, o: embed over fsdp
    norms = 16 + 16 + 32 + 32 + 32  # q/k norm, attn/ffn norm, final norm (replicated)
    router = 32 * 4 // 2
    experts = 3 * (4 // 2) * (32 // 2) * 32  # gate, up, down: experts / 2, embed / 2
    policy = embedding + attention + norms + router + experts
    assert terms["policy params"] == 4 * policy
    value_head = 32 // 2 + 1  # kernel [D, 1] over fsdp, bias [1]
    critic = embedding + attention + norms + router + experts + value_head
    assert terms["critic params"] == 4 * critic
    # float32 params: AdamW keeps 2 x f32 moments, no master copy; the critic trains moe/
    # (router + experts) and the value head only.
    critic_trainable = router + experts + value_head
    assert terms["optimizer state"] == 8 * (policy + critic_trainable)
    assert terms["gradients"] == 4 * max(policy, critic_trainable)
    assert terms["rollout params"] == 4 * policy
    # KV cache: 8 slots over data x fsdp x expert (4), 1 kv head, 64 positions, 16 wide, K + V
    assert terms["KV cache"] == 2 * 1 * (8 // 4) * 1 * 64 * 16 * 4
    # Activations, remat=none: 8 rows / 4 batch shards = 2 rows x 16 tokens per device.
    tokens, d, c = 2 * 16, 32, 4
    attention_acts = 4 * d * c + (2 * 2 + 3 * 1) * 16 * c + 2 * 16 * (4 + c) + (2 * 16 + d) * c
    moe_acts = 2 * 4 * 4 + 2 * (2 * d + 3 * 32) * c + 2 * d * c
    head = tokens * d * c + 2 * 8 * 64 * 4 * 2
    assert terms["activations"] == tokens * (attention_acts + moe_acts) + head
    full, note = activation_bytes(
        SMALL, Workload(train_rows=8, seq_len=16, logprob_chunk=8, remat="full"), MESH
    )
    assert full == tokens * (d * c + attention_acts + moe_acts) + head
    assert "remat=full" in note and "2 rows x 16 tokens per device" in note
    # dots_with_no_batch_dims: the layer input, the q/k/v/o outputs (2 heads, 1 kv head of 16)
    # and the f32 router logits (4 experts) are saved, plus one layer's share.
    dots, note = activation_bytes(
        SMALL,
        Workload(train_rows=8, seq_len=16, logprob_chunk=8, remat="dots_with_no_batch_dims"),
        MESH,
    )
    saved = (d + 2 * 16 + 2 * 1 * 16 + d) * c + 4 * 4
    assert dots == tokens * (saved + attention_acts + moe_acts) + head
    assert "remat=dots_with_no_batch_dims" in note
    assert plan.total == sum(terms.values()) and plan.fits


def test_remat_names_are_the_models_and_order_the_activations():
    from sao_jax.models.config import REMAT_POLICIES as MODEL_REMAT_POLICIES
    from sao_jax.train.memory import REMAT_POLICIES

    assert REMAT_POLICIES is MODEL_REMAT_POLICIES
    deep = get_model_config("test", num_layers=8, dense_layers=(3,))
    acts = {
        remat: activation_bytes(deep, Workload(train_rows=8, seq_len=64, remat=remat), MESH)[0]
        for remat in REMAT_POLICIES
    }
    assert acts["full"] < acts["dots_with_no_batch_dims"] < acts["none"]


def test_scanned_layers_take_the_same_memory():
    """Stacked layer parameters (leading unsharded "layers" axis) shard like the looped ones."""
    deep = get_model_config("test", num_layers=3, dense_layers=(1,), capacity_factor=0.0)
    workload = Workload(train_rows=8, seq_len=16, rollout_slots=8, context=64)
    (looped,) = plan_memory(deep, MESH, workload, hbm_bytes=GIB)
    (scanned,) = plan_memory(deep.replace(scan_layers=True), MESH, workload, hbm_bytes=GIB)
    assert [(t.name, t.bytes) for t in scanned.terms] == [(t.name, t.bytes) for t in looped.terms]


def test_low_precision_parameters_add_a_master_copy():
    assert optimizer_bytes_per_element("float32") == 8
    assert optimizer_bytes_per_element("bfloat16") == 12
    bf16 = SMALL.replace(param_dtype="bfloat16", dtype="bfloat16")
    (f32_plan,) = plan_memory(SMALL, MESH, Workload(), hbm_bytes=GIB)
    (bf16_plan,) = plan_memory(bf16, MESH, Workload(), hbm_bytes=GIB)
    f32 = {t.name: t.bytes for t in f32_plan.terms}
    half = {t.name: t.bytes for t in bf16_plan.terms}
    assert half["policy params"] * 2 == f32["policy params"]
    assert half["optimizer state"] * 8 == f32["optimizer state"] * 12


def test_a_plan_over_budget_is_refused_with_the_dominant_term_and_excess():
    workload = Workload(train_rows=8, seq_len=2048, rollout_slots=8, context=64)
    (plan,) = plan_memory(SMALL, MESH, workload, hbm_bytes=64 * 1024**2, usable_fraction=0.5)
    assert not plan.fits
    over = (plan.total - 32 * 1024**2) / GIB
    assert f"by {over:.2f} GiB" in plan.refusal()
    assert "largest term: activations" in plan.refusal()
    assert "DOES NOT FIT" in plan.table()


def test_disaggregated_plans_split_training_and_rollout():
    train, rollout = plan_memory(
        SMALL, MESH, Workload(), hbm_bytes=GIB, rollout_mesh={"data": 4, "tensor": 1}
    )
    assert [t.name for t in rollout.terms] == ["rollout params", "KV cache"]
    assert "KV cache" not in [t.name for t in train.terms]
    with pytest.raises(ValueError, match=r"unknown axes \['model'\]"):
        plan_memory(SMALL, {"model": 2}, Workload(), hbm_bytes=GIB)
    with pytest.raises(ValueError, match=r"Workload\.remat must be one of \('none', 'full'"):
        Workload(remat="selective")
    assert (
        plan_memory(
            SMALL, MESH, Workload(), hbm_bytes=GIB, learner=LearnerConfig(algorithm="grpo")
        )[0]
        .terms[1]
        .name
        == "gradients"
    )  # no critic


def test_per_host_sampling_is_one_plan_with_the_rollout_laid_out_per_host():
    """Colocated, but each host's engine holds a whole copy over its own chips."""
    per_host = {"data": 2, "fsdp": 2, "expert": 1, "tensor": 1}  # 2 hosts x 2 chips
    (plan,) = plan_memory(
        SMALL, MESH, Workload(), hbm_bytes=GIB, rollout_mesh=per_host, rollout_colocated=True
    )
    (shared,) = plan_memory(SMALL, MESH, Workload(), hbm_bytes=GIB)
    _, apart = plan_memory(SMALL, MESH, Workload(), hbm_bytes=GIB, rollout_mesh=per_host)
    terms = {t.name: t.bytes for t in plan.terms}
    # training terms as in the shared-mesh plan, rollout terms as on the per-host mesh
    for term in shared.terms[:-2]:
        assert terms[term.name] == term.bytes, term.name
    for term in apart.terms:
        assert terms[term.name] == term.bytes, term.name
    assert terms["rollout params"] > shared.terms[-2].bytes  # less sharded than the learner's
    assert "each host" in plan.group and plan.total == sum(terms.values())
    with pytest.raises(ValueError, match="rollout_colocated needs the rollout_mesh"):
        plan_memory(SMALL, MESH, Workload(), hbm_bytes=GIB, rollout_colocated=True)


def test_the_launcher_takes_the_models_remat_names(capsys):
    from experiments.launch_tpu import main

    base = ["--topology", "v5p-8", "--tpu", "pod", "--zone", "z1", "--bucket", "gs://b/run"]
    model = ["--model", "small", "--dry-run", "--train-rows", "4", "--seq-len", "256"]
    rows = {}
    for remat in ("none", "full", "dots_with_no_batch_dims"):
        main([*base, *model, "--remat", remat])
        out = capsys.readouterr().out
        assert f"remat={remat} (" in out
        line = next(x for x in out.splitlines() if x.strip().startswith("activations"))
        rows[remat] = float(line.split()[1])
    assert rows["full"] < rows["dots_with_no_batch_dims"] < rows["none"]
    with pytest.raises(SystemExit):
        main([*base, *model, "--remat", "selective"])
    assert "invalid choice: 'selective'" in capsys.readouterr().err
    # A launch hands the remat to the job's model (ModelSpec.remat).
    assert main([*base, "--remat", "full"]) == 0
    assert "model.remat=full" in capsys.readouterr().out


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_each_algorithms_plan_counts_the_critic_only_if_it_trains_one(algorithm):
    """GRPO-style algorithms hold no value model: no critic params, no critic optimizer state,
    no critic activations; SAO and PPO hold all three."""
    workload = Workload(train_rows=8, seq_len=16, rollout_slots=8, context=64, logprob_chunk=8)
    learner = LearnerConfig(algorithm=algorithm)
    (plan,) = plan_memory(SMALL, MESH, workload, hbm_bytes=GIB, learner=learner)
    terms = {t.name: t for t in plan.terms}
    # the policy-only figures, worked out as in test_memory_terms_match_hand_arithmetic
    policy = terms["policy params"].bytes // 4
    critic_trainable = 4 * 32 // 2 + 3 * (4 // 2) * (32 // 2) * 32 + 32 // 2 + 1
    policy_acts, _ = activation_bytes(SMALL, workload, MESH)
    critic_acts, _ = activation_bytes(SMALL, workload, MESH, value_head=True)
    # the critic's head keeps one f32 value (and its gradient) per token, not a log-prob chunk
    tokens = 2 * 16
    assert policy_acts - critic_acts == 2 * 8 * 64 * 4 * 2 - tokens * 4 * 2
    if get_algorithm(algorithm).uses_critic:
        assert algorithm in ("sao", "ppo", "sao_seed")
        assert terms["critic params"].bytes == 4 * (policy + 32 // 2 + 1)
        assert terms["optimizer state"].bytes == 8 * (policy + critic_trainable)
        assert "policy + critic" in terms["optimizer state"].note
        assert terms["activations"].bytes == max(policy_acts, critic_acts)
        assert "policy or critic step" in terms["activations"].note
    else:
        assert algorithm.startswith("grpo")
        assert not any("critic" in name for name in terms)
        assert terms["optimizer state"].bytes == 8 * policy
        assert terms["gradients"].bytes == 4 * policy
        assert terms["activations"].bytes == policy_acts
        assert "no critic" in terms["activations"].note
        assert "critic" not in terms["optimizer state"].note
    assert plan.total == sum(t.bytes for t in plan.terms)


def test_a_critic_with_the_larger_step_sets_the_activations():
    """With a large log-prob chunk the policy's step is larger; with a one-position chunk and
    long rows the critic's per-token values outweigh it, and the plan takes the critic's."""
    short_chunk = Workload(train_rows=8, seq_len=512, logprob_chunk=1)
    policy_acts, _ = activation_bytes(SMALL, short_chunk, MESH)
    critic_acts, _ = activation_bytes(SMALL, short_chunk, MESH, value_head=True)
    assert critic_acts > policy_acts
    (plan,) = plan_memory(SMALL, MESH, short_chunk, hbm_bytes=GIB)  # SAO by default
    activations = next(t for t in plan.terms if t.name == "activations")
    assert activations.bytes == critic_acts and "(critic larger)" in activations.note
    (grpo,) = plan_memory(
        SMALL, MESH, short_chunk, hbm_bytes=GIB, learner=LearnerConfig(algorithm="grpo")
    )
    assert next(t for t in grpo.terms if t.name == "activations").bytes == policy_acts
