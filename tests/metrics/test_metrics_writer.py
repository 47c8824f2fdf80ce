"""MetricsWriter / read_metrics: JSONL format, non-finite values, TensorBoard, resume, process 0."""

import json
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.metrics import MetricsWriter, decode_value, encode_value, read_metrics


def tensorboard_events(run_dir):
    """Every event of the run's event files, in file order (TFRecord framing)."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for path in sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            events.append(Event.FromString(data[offset + 12 : offset + 12 + length]))
            offset += 12 + length + 4  # length, its crc, payload, payload crc
    return events


def tensorboard_scalars(run_dir):
    """tag -> [(step, value)]."""
    scalars = {}
    for event in tensorboard_events(run_dir):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_one_json_object_per_line_with_step(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write(0, {"loss": jnp.float32(2.5), "success": np.float64(0.25), "phase": "bc"})
        writer.write(
            1,
            {
                "loss": jnp.array([1.5]),
                "eval": {"seen": 0.5, "unseen": 0.25},
                "skipped": jnp.array(True),
                "tokens": np.int64(640),
            },
        )
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "loss": 2.5, "success": 0.25, "phase": "bc"},
        {
            "step": 1,
            "loss": 1.5,
            "eval/seen": 0.5,
            "eval/unseen": 0.25,
            "skipped": 1,
            "tokens": 640,
        },
    ]
    assert read_metrics(tmp_path) == [json.loads(line) for line in lines]


def test_non_finite_values_are_strings_in_json_and_floats_when_read(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(3, {"loss": float("nan"), "ratio": jnp.inf, "low": -np.inf, "ok": 1.0})
    raw = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert raw == {"step": 3, "loss": "nan", "ratio": "inf", "low": "-inf", "ok": 1.0}
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    assert math.isnan(record["loss"]) and record["ratio"] == math.inf and record["low"] == -math.inf
    for value in (1.0, 7, "text", None, math.inf, -math.inf):
        assert decode_value(encode_value(value)) == value


def test_tensorboard_receives_numeric_scalars(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for step in range(3):
            writer.write(step, {"loss": 1.0 / (step + 1), "eval": {"seen": step}, "note": "x"})
    scalars = tensorboard_scalars(tmp_path)
    assert set(scalars) == {"loss", "eval/seen"}
    assert [s for s, _ in scalars["loss"]] == [0, 1, 2]
    assert scalars["loss"][2][1] == pytest.approx(1 / 3)


def test_nan_is_kept_in_json_and_left_out_of_tensorboard(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.write(0, {"gap": 0.5, "loss": 1.0})
        writer.write(1, {"gap": float("nan"), "loss": 2.0})
    scalars = tensorboard_scalars(tmp_path)
    assert [s for s, _ in scalars["gap"]] == [0] and [s for s, _ in scalars["loss"]] == [0, 1]
    assert math.isnan(read_metrics(tmp_path)[1]["gap"])


def test_resume_drops_records_after_the_checkpoint(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for step in range(6):
            writer.write(step, {"loss": float(step)})
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 6, "loss"')  # the killed run's half-written line
    with MetricsWriter(tmp_path, resume_from_step=3) as writer:
        writer.write(4, {"loss": 40.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 40.0),
    ]
    assert dict(tensorboard_scalars(tmp_path)["loss"])[4] == 40.0
    # TensorBoard discards older events from step 4 on when it meets this purge marker
    from tensorboardX.proto.event_pb2 import SessionLog

    purges = [
        e.step for e in tensorboard_events(tmp_path) if e.session_log.status == SessionLog.START
    ]
    assert purges == [4]


def test_only_process_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    with MetricsWriter(tmp_path / "run") as writer:
        writer.write(0, {"loss": 1.0})
        with pytest.raises(ValueError, match="metric 'bad'"):  # validated on every process
            writer.write(1, {"bad": np.ones(3)})
    assert not (tmp_path / "run").exists()


def test_bad_metrics_are_named(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        with pytest.raises(ValueError, match=r"metric 'grad' must be .* shape \(2, 2\)"):
            writer.write(0, {"grad": np.ones((2, 2))})
        with pytest.raises(ValueError, match="'step' is reserved"):
            writer.write(0, {"step": 3})
        with pytest.raises(TypeError, match="step must be an int"):
            writer.write(1.5, {"loss": 1.0})
        with pytest.raises(ValueError, match="non-empty strings"):
            writer.write(0, {3: 1.0})
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(0, {"loss": 1.0})
    assert (tmp_path / "metrics.jsonl").read_text() == ""  # nothing half-written


def test_read_metrics_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{broken\n{"step": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not a metrics record"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"loss": 1}\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"line 2 .*'step'"):
        read_metrics(tmp_path)
