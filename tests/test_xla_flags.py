"""`sao_jax.xla_flags`: the fake CPU device count and flag defaults in an XLA_FLAGS string,
set before JAX starts (so the module must not import JAX)."""

import subprocess
import sys

import pytest

from sao_jax.xla_flags import cpu_device_count, with_cpu_device_count, with_default

COUNT = "--xla_force_host_platform_device_count"


def test_device_count_replaces_every_earlier_count_and_keeps_other_flags_in_order():
    flags = f"--a=1 {COUNT}=8 --b {COUNT}=2"
    assert with_cpu_device_count(flags, 4) == f"--a=1 --b {COUNT}=4"
    assert cpu_device_count(with_cpu_device_count(flags, 4)) == 4
    assert with_cpu_device_count("", 2) == f"{COUNT}=2"


def test_device_count_none_removes_the_flag_and_a_bad_count_is_refused():
    assert with_cpu_device_count(f"{COUNT}=8 --a=1", None) == "--a=1"
    assert cpu_device_count("--a=1") is None
    assert cpu_device_count(f"{COUNT}=8 {COUNT}=3") == 3  # the last one given, as XLA reads it
    with pytest.raises(ValueError, match=">= 1"):
        with_cpu_device_count("--a=1", 0)


def test_a_default_is_added_only_when_its_name_is_unset():
    assert with_default("--a=1", "--t=600") == "--a=1 --t=600"
    assert with_default("--t=5 --a=1", "--t=600") == "--t=5 --a=1"
    assert with_default("", "--t=600") == "--t=600"
    # a name that merely starts like another is a different flag
    assert with_default("--tt=5", "--t=600") == "--tt=5 --t=600"


def test_importing_it_does_not_start_jax():
    code = "import sys, sao_jax.xla_flags; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
