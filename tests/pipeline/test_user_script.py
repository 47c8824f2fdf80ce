"""examples/train_arithmetic_sao.py, the README's library example: at most 30 lines, shown in the
README as it is, and it trains SAO on the arithmetic env end to end (a tiny budget)."""

import json
import runpy
from pathlib import Path

import pytest

from atdp_io import AtdpStore
from sao_jax.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_arithmetic_sao.py"


def test_the_script_is_short_and_the_readme_shows_it_as_it_is():
    text = SCRIPT.read_text()
    assert len(text.splitlines()) <= 30
    assert text.strip() in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_the_script_trains_sao_on_arithmetic_and_writes_every_output(tmp_path):
    train = runpy.run_path(str(SCRIPT))["train"]  # not as __main__: nothing runs yet
    summary = train(str(tmp_path), clone_steps=2, policy_steps=2, games=2)

    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["policy_steps"] == summary["policy_steps"] == 2
    assert saved["eval_splits"] == ["valid_seen", "valid_unseen"]
    for key in ("seen_success_start", "seen_success_end", "unseen_success_start"):
        assert 0.0 <= saved[key] <= 1.0, key
    assert set(saved["by_task_type"]["valid_unseen_end"]) <= {"add", "sub", "mul", "mixed", "word"}
    assert saved["warm_start"]["expert_success"] == 1.0  # the env's expert solves its tasks
    records = read_metrics(tmp_path)
    assert any("bc/nll" in r for r in records)
    assert any("eval/valid_unseen/success" in r for r in records)
    assert any("policy/clip_frac" in r for r in records)
    assert any(p.name.isdigit() for p in (tmp_path / "checkpoints").iterdir())
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000
    # the agent played arithmetic tasks, recorded through ATDP like every other env's
    store = AtdpStore.open(str(tmp_path / "atdp"))
    reader = store.reader("rollouts", principal="rollouts")
    reader.refresh()
    tasks = [reader.read(i).header.task for i in reader.trajectory_ids()]
    assert tasks and {t["env"] for t in tasks} == {"arithmetic"}
