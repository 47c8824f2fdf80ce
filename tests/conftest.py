"""Test-session setup shared by every test module.

Runs before any test imports jax, so the flags below take effect:
- 8 fake CPU devices, so sharding and expert-parallel tests see a real 8-device mesh;
- XLA's CPU backend (LLVM) at optimisation level 0: the suite is dominated by compiling
  thousands of small programs, not by running them; level 0 compiles the learner's fused
  iteration ~1.5x faster and the tests compare paths, not speed (benchmarks run at the default
  level). Set `xla_backend_optimization_level` in XLA_FLAGS yourself to test another level;
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

from sao_jax.xla_flags import with_cpu_device_count, with_default  # no JAX import

os.environ["XLA_FLAGS"] = with_default(
    with_cpu_device_count(os.environ.get("XLA_FLAGS", ""), 8),
    "--xla_backend_optimization_level=0",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest
from absl import flags

flags.FLAGS.mark_as_parsed()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_code():
    """Drop every executable compiled for a module once the module is done (see above)."""
    yield
    jax.clear_caches()
    gc.collect()
