"""`sao_jax.losses` is importable by any JAX stack: only jax, chex and numpy get loaded."""

import subprocess
import sys

import sao_jax.losses

HEAVY_MODULES = ("flax", "orbax", "tensorstore", "grain", "aiohttp", "optax", "torch")


def test_import_loads_no_framework_or_io_package():
    probe = (
        "import sys, sao_jax.losses\n"
        f"loaded = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"importing sao_jax.losses loaded {result.stdout.strip()}"


def test_public_api_names_exist():
    issue_api = [
        "token_logprobs",
        "sao_policy_loss",
        "sao_value_loss",
        "action_only_gae",
        "adaptive_lambda",
        "group_advantages",
        "ppo_clip_loss",
        "seed_opd_loss",
        "kl_estimate",
        "get_policy_loss",
    ]
    for name in issue_api:
        assert callable(getattr(sao_jax.losses, name)), name
        assert name in sao_jax.losses.__all__, name
