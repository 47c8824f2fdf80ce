"""Test-session setup shared by every test module.

Runs before any test imports jax, so the flags below take effect:
- 8 fake CPU devices, so sharding and expert-parallel tests see a real 8-device mesh;
- absl flags marked parsed, because grain's worker processes read absl flags and would
  otherwise fail with "flags not parsed" under pytest;
- JAX's compilation caches cleared after every test module. XLA:CPU maps each compiled
  kernel's code and data into memory mappings of their own, which live as long as the cached
  executable; one process running the whole suite compiles tens of thousands of kernels,
  passes Linux's default vm.max_map_count (65,530), and the next mapping fails as a segfault
  wherever the process happens to be (seen in hypothesis-driven tracing and in serving load).
"""

import gc
import os

_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
if _FAKE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FAKE_DEVICES).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

flags.FLAGS.mark_as_parsed()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Drop every executable compiled for a module once the module is done (see above)."""
    yield
    jax.clear_caches()
    gc.collect()
