"""Scanned layers (`ModelConfig.scan_layers`) and rematerialisation (`ModelConfig.remat`).

Every check runs the same weights through the looped path (one module per layer, Python loop,
no checkpoint) and the path under test. The config has a dense layer in the middle, so the
scanned model has three groups (moe, dense, moe) and every kind of group boundary.

Tolerances come from float32 rounding: a dot product of length n is exact to n * eps times
the sum of its |terms| (Higham, Accuracy and Stability, 3.1); the two paths compute the same
sums but XLA may fuse and order them differently, which at most doubles that, and the
difference compounds once per layer. `tolerance` bounds it with the largest reduction of the
computation and the size of the values compared (which bound the |terms|, up to a factor).
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax.models import (
    CheckpointError,
    Critic,
    ModelConfig,
    get_model_config,
    init_model,
    load_hf_qwen3_moe,
    save_hf_qwen3_moe,
)
from sao_jax.models.config import REMAT_POLICIES
from sao_jax.models.safetensors_io import SafetensorsReader
from sao_jax.models.steps import next_token_loss
from sao_jax.models.transformer import (
    Transformer,
    stack_layer_params,
    unstack_layer_params,
    with_scan_layers,
)
from sao_jax.sharding import MeshConfig, make_mesh, one_off_compiler_options, state_shardings
from sao_jax.train.config import CRITIC_FFN_AND_HEAD

CONFIG = get_model_config(
    "test",
    num_layers=4,
    dense_layers=(2,),
    tie_embeddings=False,
    capacity_factor=1.0,  # some assignments are dropped: the dropped fraction is compared too
    initializer_range=0.1,
)
B, T = 2, 12
IDS = jnp.asarray(np.random.default_rng(0).integers(0, CONFIG.vocab_size, (B, T)), jnp.int32)
EPS = float(np.finfo(np.float32).eps)


def tolerance(config: ModelConfig, reference, *, tokens: int = 1) -> float:
    """2 * layers * n * eps * max|reference|, n the longest reduction (with `tokens` summed over
    in the backward pass)."""
    n = max(
        config.d_model,
        config.num_heads * config.head_dim,
        config.moe_intermediate_size,
        config.dense_intermediate_size,
        tokens,
    )
    scale = float(jnp.max(jnp.abs(jnp.asarray(reference))))
    return 2 * config.num_layers * n * EPS * max(scale, 1.0)


def _jit(fn):
    # Skip LLVM's optimisation passes on CPU: these programs run once (compiles 3-4x faster).
    return jax.jit(fn, compiler_options=one_off_compiler_options())


def _variant(model, *, scan_layers: bool, remat: str = "none"):
    """`model`'s weights in the given layout, under the given remat policy."""
    model = with_scan_layers(model, scan_layers)
    config = model.config.replace(remat=remat)
    abstract = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
    return nnx.merge(nnx.graphdef(abstract), nnx.state(model))


def _flat(model_or_state, config: ModelConfig) -> dict[tuple, jax.Array]:
    """Flat {looped path: array}, whichever layout the state is in."""
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)
    flat = {p: v.get_value() for p, v in nnx.to_flat_state(state)}
    return unstack_layer_params(config, flat) if config.scan_layers else flat


@pytest.fixture(scope="module")
def looped():
    return init_model(CONFIG)


@pytest.fixture(scope="module")
def scanned(looped):
    return _variant(looped, scan_layers=True)


@functools.cache
def _jitted_forward(graphdef):
    def run(state, ids, positions, kv_cache):
        m = nnx.merge(graphdef, state)
        out = m.forward(ids, positions=positions, kv_cache=kv_cache)
        return m.logits(out.hidden), out.aux, out.kv_cache

    return _jit(run)


def _forward(model, ids, positions=None, kv_cache=None):
    """(logits, aux, kv_cache); one jit per model structure, reused by every test."""
    graphdef, state = nnx.split(model)
    return _jitted_forward(graphdef)(state, ids, positions, kv_cache)


def test_groups_paths_and_shardings(looped, scanned):
    assert [(g.name, g.is_moe, g.start, g.stop) for g in CONFIG.layer_groups()] == [
        ("moe_group0", True, 0, 2),
        ("dense_group1", False, 2, 3),
        ("moe_group2", True, 3, 4),
    ]
    assert [g.name for g in CONFIG.replace(dense_layers=()).layer_groups()] == ["moe_group0"]
    paths = {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(scanned))}
    gate = paths["layers/moe_group0/moe/experts/gate_proj"]
    assert gate.get_value().shape == (2, 4, 32, 32)
    assert gate.get_metadata()["logical_axes"] == ("layers", "experts", "embed", "expert_mlp")
    assert paths["layers/dense_group1/mlp/up_proj/kernel"].get_value().shape == (1, 32, 64)
    assert paths["layers/moe_group2/attn/q_proj/kernel"].get_value().shape == (1, 32, 32)
    assert not any(re.search(r"^layers/\d", p) for p in paths)

    # The learner's and the critic's path patterns select the same parameters in both layouts.
    def selected(model, patterns):
        flat = {
            "/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model))
        }
        return sum(x.size for p, x in flat.items() if any(re.search(r, p) for r in patterns))

    for patterns in (CRITIC_FFN_AND_HEAD, (r"(^|/)attn/",), (r"(^|/)moe/router/",)):
        assert selected(scanned, patterns) == selected(looped, patterns) > 0
    critic = Critic.from_policy(scanned)
    assert selected(critic, CRITIC_FFN_AND_HEAD) == selected(
        Critic.from_policy(looped), CRITIC_FFN_AND_HEAD
    )

    # The stacked axis is never sharded; the others keep the looped layout's shardings.
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    specs = {
        "/".join(map(str, p)): v.get_value().spec
        for p, v in nnx.to_flat_state(state_shardings(nnx.state(scanned), mesh))
    }
    assert tuple(specs["layers/moe_group0/moe/experts/gate_proj"]) == (
        None,
        "expert",
        "fsdp",
        "tensor",
    )
    assert tuple(specs["layers/dense_group1/mlp/up_proj/kernel"]) == (None, "fsdp", "tensor")
    assert tuple(specs["layers/moe_group0/attn/q_norm/scale"]) == (None, None)

    # stack / unstack are inverse and with_scan_layers round-trips the weights exactly.
    flat = _flat(looped, CONFIG)
    back = unstack_layer_params(CONFIG, stack_layer_params(CONFIG, flat))
    assert back.keys() == flat.keys()
    again = _flat(with_scan_layers(scanned, False), CONFIG)
    for path, value in flat.items():
        np.testing.assert_array_equal(back[path], value)
        np.testing.assert_array_equal(again[path], value)


def test_scanned_init_gives_independent_layers():
    model = init_model(CONFIG.replace(scan_layers=True))
    q = model.layers.moe_group0.attn.q_proj.kernel[...]
    assert q.shape == (2, 32, 32) and not np.allclose(q[0], q[1])
    std = float(jnp.std(model.layers.moe_group0.moe.experts.gate_proj[...]))
    assert abs(std - CONFIG.initializer_range) < 0.01
    np.testing.assert_array_equal(model.layers.dense_group1.ffn_norm.scale[...], 1.0)


def test_forward_logits_and_moe_aux_equal_the_loop(looped, scanned):
    logits, aux, _ = _forward(looped, IDS)
    scan_logits, scan_aux, _ = _forward(scanned, IDS)
    tol = tolerance(CONFIG, logits)
    np.testing.assert_allclose(scan_logits, logits, atol=tol, rtol=0)
    assert float(jnp.std(logits)) > 100 * tol  # the comparison is not trivially loose
    assert scan_aux.expert_load.shape == aux.expert_load.shape == (3, 4)
    for name in ("load_balance_loss", "router_z_loss", "expert_load", "dropped_fraction"):
        expected = getattr(aux, name)
        np.testing.assert_allclose(
            getattr(scan_aux, name), expected, atol=tolerance(CONFIG, expected), rtol=0
        )
    assert float(aux.dropped_fraction) > 0  # capacity_factor=1.0 drops some assignments


def test_kv_cache_prefill_and_decode_equal_the_loop(looped, scanned):
    cache_len = 16

    def empty():
        shape = (B, CONFIG.num_kv_heads, cache_len, CONFIG.head_dim)
        return tuple((jnp.zeros(shape), jnp.zeros(shape)) for _ in range(CONFIG.num_layers))

    prompt = 5
    positions = jnp.broadcast_to(jnp.arange(prompt), (B, prompt))
    results = []
    for model in (looped, scanned):
        logits, _, cache = _forward(model, IDS[:, :prompt], positions, empty())
        steps = [logits]
        for t in range(prompt, prompt + 3):  # decode one token at a time
            logits, _, cache = _forward(model, IDS[:, t : t + 1], jnp.full((B, 1), t), cache)
            steps.append(logits)
        results.append((steps, cache))
    (loop_steps, loop_cache), (scan_steps, scan_cache) = results
    assert len(scan_cache) == CONFIG.num_layers
    for ours, expected in zip(scan_steps, loop_steps, strict=True):
        np.testing.assert_allclose(ours, expected, atol=tolerance(CONFIG, expected), rtol=0)
    for (k, v), (k_ref, v_ref) in zip(scan_cache, loop_cache, strict=True):
        assert k.shape == k_ref.shape == (B, CONFIG.num_kv_heads, cache_len, CONFIG.head_dim)
        np.testing.assert_allclose(k, k_ref, atol=tolerance(CONFIG, k_ref), rtol=0)
        np.testing.assert_allclose(v, v_ref, atol=tolerance(CONFIG, v_ref), rtol=0)
        assert not np.any(k[:, :, prompt + 3 :])  # nothing written past the decoded tokens
    with pytest.raises(ValueError, match="kv_cache has 1 layers, model has 4"):
        scanned.forward(IDS[:, :1], kv_cache=empty()[:1])


def _grads(model):
    graphdef, state = nnx.split(model)
    mask = jnp.ones_like(IDS)

    def loss(params):
        return next_token_loss(nnx.merge(graphdef, params), IDS, mask)

    (value, metrics), grads = _jit(jax.value_and_grad(loss, has_aux=True))(state)
    return value, metrics, _flat(grads, model.config)


@pytest.fixture(scope="module")
def reference_grads(looped):
    return _grads(looped)


# Every policy once, and remat in both layouts (one compile each: the file stays under a minute).
@pytest.mark.parametrize(
    "scan_layers, remat",
    [(True, "none"), (True, "full"), (False, "dots_with_no_batch_dims")],
)
def test_gradients_equal_the_loop(looped, reference_grads, scan_layers, remat):
    value, metrics, grads = reference_grads
    model = _variant(looped, scan_layers=scan_layers, remat=remat)
    ours, our_metrics, our_grads = _grads(model)
    np.testing.assert_allclose(ours, value, atol=tolerance(CONFIG, value), rtol=0)
    for name, expected in metrics.items():
        np.testing.assert_allclose(our_metrics[name], expected, atol=tolerance(CONFIG, expected))
    assert our_grads.keys() == grads.keys()
    tokens = B * T
    for path, expected in grads.items():
        np.testing.assert_allclose(
            our_grads[path],
            expected,
            atol=tolerance(CONFIG, expected, tokens=tokens),
            rtol=0,
            err_msg="/".join(map(str, path)),
        )
    router = grads[("layers", 3, "moe", "router", "kernel")]
    assert float(jnp.max(jnp.abs(router))) > 0  # the aux loss reaches the last router


def test_remat_policies_keep_less_for_the_backward_pass(looped):
    """Residual bytes of the VJP: full < dots_with_no_batch_dims < none, in both layouts."""

    def kept(scan_layers, remat):
        model = _variant(looped, scan_layers=scan_layers, remat=remat)
        graphdef, state = nnx.split(model)
        mask = jnp.ones_like(IDS)

        def loss(p):
            return next_token_loss(nnx.merge(graphdef, p), IDS, mask)[0]

        # What the backward pass keeps: the VJP's residuals (traced only, never compiled).
        residuals = jax.eval_shape(lambda p: jax.vjp(loss, p)[1], state)
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(residuals))

    assert REMAT_POLICIES == ("none", "full", "dots_with_no_batch_dims")
    for scan_layers in (False, True):
        none, full, dots = (kept(scan_layers, r) for r in REMAT_POLICIES)
        assert full < dots < none, (scan_layers, full, dots, none)


def test_bad_remat_names_are_refused_clearly():
    with pytest.raises(ValueError, match=r"ModelConfig.remat must be one of \('none', 'full'"):
        CONFIG.replace(remat="selective")
    with pytest.raises(ValueError, match="got 'Full'"):
        get_model_config("test", remat="Full")
    config = CONFIG.replace(scan_layers=True, remat="full")
    assert ModelConfig.from_dict(config.to_dict()) == config
    # configs written before these fields existed load with today's behaviour
    old = {k: v for k, v in CONFIG.to_dict().items() if k not in ("scan_layers", "remat")}
    assert ModelConfig.from_dict(old) == CONFIG and not CONFIG.scan_layers


@pytest.mark.parametrize("fused", [False, True])
def test_hf_round_trip_through_a_scanned_model(looped, scanned, tmp_path, fused):
    """HF -> scanned model -> HF gives identical tensors (both expert layouts)."""
    save_hf_qwen3_moe(looped, tmp_path / "src", fused_experts=fused)
    loaded = load_hf_qwen3_moe(tmp_path / "src", scan_layers=True)
    assert loaded.config.scan_layers
    assert loaded.layers.moe_group0.moe.experts.down_proj[...].shape == (2, 4, 32, 32)
    save_hf_qwen3_moe(loaded, tmp_path / "back", fused_experts=fused)
    src, back = SafetensorsReader(tmp_path / "src"), SafetensorsReader(tmp_path / "back")
    assert src.tensor_names() == back.tensor_names()
    for key in src.tensor_names():
        np.testing.assert_array_equal(back.get(key), src.get(key), err_msg=key)
    # The stacked weights are exactly those of `scanned` (the looped model's, stacked), whose
    # logits equal the looped model's (test_forward_logits_and_moe_aux_equal_the_loop).
    expected = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(scanned))}
    imported = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(loaded))}
    assert imported.keys() == expected.keys()
    for path, value in expected.items():
        np.testing.assert_array_equal(imported[path], value, err_msg="/".join(map(str, path)))
    if fused:
        return
    # Onto a mesh: each device reads only its own blocks of the stacked tensors.
    mesh = make_mesh(MeshConfig(fsdp=2, expert=2, tensor=2))
    sharded = load_hf_qwen3_moe(tmp_path / "src", scan_layers=True, mesh=mesh)
    gate = sharded.layers.moe_group2.moe.experts.gate_proj[...]
    assert tuple(gate.sharding.spec) == (None, "expert", "fsdp", "tensor")
    on_mesh = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.state(sharded))}
    for path, value in expected.items():
        np.testing.assert_array_equal(on_mesh[path], value)


def test_scanned_hf_import_reports_shape_mismatches(looped, tmp_path):
    save_hf_qwen3_moe(looped, tmp_path)
    with pytest.raises(CheckpointError, match=r"shape mismatch for layers/moe_group0/moe/experts"):
        load_hf_qwen3_moe(tmp_path, scan_layers=True, moe_intermediate_size=16)


def test_transformer_class_is_kept(scanned):
    assert type(scanned) is Transformer
    assert type(with_scan_layers(Critic.from_policy(scanned), False)) is Critic


def test_expert_parallel_dispatch_inside_the_scan(looped):
    """The shard_map + all-to-all dispatch runs in the scan body on an 8-device mesh and gives
    the single-device loop's results (dropless, so capacity plays no part; 24 tokens split 3
    per device)."""
    dropless = CONFIG.replace(capacity_factor=0.0)
    mesh = make_mesh(MeshConfig(fsdp=2, expert=4))
    results = []
    for config in (dropless, dropless.replace(moe_dispatch="expert_parallel", scan_layers=True)):
        graphdef = nnx.graphdef(nnx.eval_shape(lambda c=config: Transformer(c, rngs=nnx.Rngs(0))))
        state = nnx.state(with_scan_layers(looped, config.scan_layers))
        if config.moe_dispatch == "expert_parallel":
            state = jax.device_put(state, state_shardings(state, mesh))
            with jax.set_mesh(mesh):
                results.append(_forward(nnx.merge(graphdef, state), IDS))
                hlo = _jitted_forward(graphdef).lower(state, IDS, None, None).as_text()
            assert "all_to_all" in hlo and "while" in hlo  # the exchange, inside the scan
        else:
            results.append(_forward(nnx.merge(graphdef, state), IDS))
    (logits, aux, _), (scan_logits, scan_aux, _) = results
    np.testing.assert_allclose(scan_logits, logits, atol=tolerance(CONFIG, logits), rtol=0)
    for name in ("load_balance_loss", "router_z_loss", "expert_load", "dropped_fraction"):
        expected = getattr(aux, name)
        np.testing.assert_allclose(
            getattr(scan_aux, name), expected, atol=tolerance(CONFIG, expected), rtol=0
        )
    assert float(scan_aux.dropped_fraction) == 0.0
