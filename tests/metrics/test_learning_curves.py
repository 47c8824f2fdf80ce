"""plot_learning_curves: a PNG with one panel per metric, several runs overlaid, clear errors."""

import math

import numpy as np
import pytest
from matplotlib.image import imread

from sao_jax.metrics import MetricsWriter, plot_learning_curves
from sao_jax.metrics.plots import ema, series


def write_run(run_dir, seed):
    rng = np.random.default_rng(seed)
    with MetricsWriter(run_dir, tensorboard=False) as writer:
        for step in range(60):
            metrics = {
                "loss": 2.0 * math.exp(-step / 20) + 0.1 * rng.random(),
                "success": min(1.0, step / 50 + 0.05 * rng.random()),
            }
            if step == 30:
                metrics["loss"] = float("nan")
            if step % 20 == 0:
                metrics["eval"] = {"unseen": step / 100}
            writer.write(step, metrics)
    return run_dir


def test_png_with_one_panel_per_key(tmp_path):
    run = write_run(tmp_path / "run", seed=0)
    out = plot_learning_curves(run / "metrics.jsonl", tmp_path / "curves.png", title="tiny")
    image = imread(out)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 600
    assert image.std() > 0.01  # something was drawn


def test_several_runs_and_chosen_keys(tmp_path):
    runs = {"sao": write_run(tmp_path / "a", 0), "grpo": write_run(tmp_path / "b", 1)}
    one = plot_learning_curves(runs, tmp_path / "one.png", keys=["success"])
    two = plot_learning_curves(runs, tmp_path / "two.png", keys=["success", "eval/unseen"])
    assert imread(two).shape[1] > imread(one).shape[1]  # panels side by side


def test_series_is_step_ordered_keeps_last_duplicate_and_ema_is_debiased():
    records = [{"step": 2, "x": 1.0}, {"step": 0, "x": 3.0}, {"step": 1, "y": 5}]
    steps, values = series([*records, {"step": 2, "x": 7.0}], "x")
    assert steps.tolist() == [0, 2] and values.tolist() == [3.0, 7.0]
    assert ema(np.array([4.0, 4.0, 4.0]), 0.9).tolist() == pytest.approx([4.0, 4.0, 4.0])
    smoothed = ema(np.array([0.0, 10.0]), 0.5)
    assert smoothed[0] == 0.0 and 0.0 < smoothed[1] < 10.0


def test_errors(tmp_path):
    run = write_run(tmp_path / "run", seed=0)
    with pytest.raises(
        ValueError,
        match=r"no numeric metric \['acc'\].*available: \['loss', 'success', 'eval/unseen'\]",
    ):
        plot_learning_curves(run, tmp_path / "x.png", keys=["acc"])
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_learning_curves([{"step": 0, "phase": "bc"}], tmp_path / "x.png")
    with pytest.raises(ValueError, match="smoothing weight"):
        plot_learning_curves(run, tmp_path / "x.png", smoothing=1.0)
    with pytest.raises(FileNotFoundError):
        plot_learning_curves(tmp_path / "absent", tmp_path / "x.png")


def test_only_process_zero_draws(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", seed=0)
    monkeypatch.setattr("jax.process_index", lambda: 1)
    # other hosts have no metrics.jsonl (MetricsWriter writes on process 0 only): never read
    assert plot_learning_curves(tmp_path / "absent", tmp_path / "other.png") is None
    assert plot_learning_curves(run, tmp_path / "other.png") is None
    assert not (tmp_path / "other.png").exists()
    monkeypatch.setattr("jax.process_index", lambda: 0)
    assert plot_learning_curves(run, tmp_path / "zero.png").exists()
