"""ProgressBar: postfix shows the chosen metrics, formatted; hidden off process 0."""

import io

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax.metrics import ProgressBar, format_metric


def test_format_metric():
    assert format_metric(3) == "3"
    assert format_metric(0.123456) == "0.1235"
    assert format_metric(np.float32(1234567.0)) == "1.235e+06"
    assert format_metric(jnp.float32(float("nan"))) == "nan"
    assert format_metric(-np.inf) == "-inf"
    assert format_metric(np.bool_(True)) == "True"
    assert format_metric("rl") == "rl"


def test_postfix_shows_chosen_keys_in_order():
    stream = io.StringIO()
    with ProgressBar(10, desc="train", keys=("success", "loss"), file=stream) as bar:
        bar.update(metrics={"loss": jnp.float32(0.52341), "success": 0.25, "hidden": 9.0})
        bar.update(2)
        assert bar.n == 3
    text = stream.getvalue()
    assert "train" in text and "3/10" in text
    assert "success=0.25, loss=0.5234" in text  # order of `keys`, not of the dict
    assert "hidden" not in text


def test_all_metrics_when_no_keys_and_resume_offset():
    stream = io.StringIO()
    with ProgressBar(20, initial=5, file=stream) as bar:
        bar.update(metrics={"kl": 0.001, "steps": 12})
        bar.write("evaluating")
    text = stream.getvalue()
    assert "6/20" in text and "kl=0.001" in text and "steps=12" in text
    assert "evaluating" in text


def test_hidden_off_process_zero(monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 3)
    stream = io.StringIO()
    with ProgressBar(5, file=stream) as bar:
        bar.update(metrics={"loss": 1.0})
    assert stream.getvalue() == ""
