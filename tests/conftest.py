"""Test-session setup shared by every test module.

Runs before any test imports jax, so the flags below take effect:
- 8 fake CPU devices, so sharding and expert-parallel tests see a real 8-device mesh;
- absl flags marked parsed, because grain's worker processes read absl flags and would
  otherwise fail with "flags not parsed" under pytest.
"""

import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAKE_DEVICES).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()
