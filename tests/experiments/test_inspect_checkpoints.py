"""`inspect_checkpoints records=[...]`: record files written before, compared game by game
without playing (two seeds, two settings, two runs)."""

import json

import pytest

from experiments import inspect_checkpoints
from sao_jax.rollout.inspection import GameRecord


def game(index, won, commands):
    return GameRecord(
        game_index=index,
        task_type="pick_and_place_simple",
        won=won,
        commands=tuple(commands),
        valid=(True,) * len(commands),
        admissible=(True,) * len(commands),
        expert=(None,) * len(commands),
        truncated_by=None if won else "step_limit",
        mode="won" if won else "wander",
    )


def write(path, games):
    path.write_text("".join(json.dumps(g.to_json()) + "\n" for g in games))
    return str(path)


WIN = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1", "put pen 1 in shelf 1"]
LOSS = ["go to bed 1", "go to desk 1", "go to bed 1", "go to desk 1"]


def test_two_record_files_are_compared_game_by_game(tmp_path, capsys):
    a = write(
        tmp_path / "a.jsonl",
        [game(0, True, WIN), game(1, True, WIN), game(2, False, LOSS), game(3, False, LOSS)],
    )
    b = write(
        tmp_path / "b.jsonl",
        [
            game(3, False, LOSS[:2] + WIN[:2]),
            game(2, True, WIN),
            game(1, False, LOSS),
            game(0, True, WIN),
        ],
    )
    result = inspect_checkpoints.main([f"records=[{a},{b}]"])
    assert result["policies"][1]["success"] == 0.5 and result["policies"][2]["success"] == 0.5
    pair = result["pairs"]["1->2"]
    assert (pair["both_won"], pair["both_lost"], pair["gained"], pair["lost"]) == (1, 1, 1, 1)
    assert pair["alike"] == 1  # game 0 only: game 3 is lost both times, but played otherwise
    out = capsys.readouterr().out
    assert f"1: {a}" in out and f"2: {b}" in out
    assert "both won 1, both lost 1, gained 1, lost 1; played move for move alike 1" in out


def test_bad_record_files_are_refused_naming_the_file(tmp_path):
    good = write(tmp_path / "good.jsonl", [game(0, True, WIN)])
    other_games = write(tmp_path / "other.jsonl", [game(5, True, WIN)])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    missing = tmp_path / "missing.jsonl"
    for records, message in [
        ([good], "two record files or more"),
        ([good, str(missing)], "missing.jsonl is not a record file"),
        ([good, str(garbage)], "garbage.jsonl is not a record file"),
        ([good, str(empty)], "empty.jsonl holds no games"),
        ([good, other_games], "same games"),
    ]:
        with pytest.raises(SystemExit, match=message):
            inspect_checkpoints.main([f"records=[{','.join(records)}]"])
    with pytest.raises(SystemExit, match="give one of the two"):
        inspect_checkpoints.main([f"records=[{good},{good}]", f"run={tmp_path}"])


def test_a_seed_run_is_read_and_a_run_without_policies_is_refused(tmp_path):
    """An `alfworld_seed` run's config.yaml (with its `hindsight` section) is read like an
    `alfworld_sao` one; a run that saved no policy yet is refused by name, not by traceback."""
    from experiments import alfworld_seed
    from sao_jax.config_fields import config_to_yaml

    (tmp_path / "config.yaml").write_text(config_to_yaml(alfworld_seed.PRESETS["micro"]))
    for asked in ([], ["policy_steps=[0]"]):
        with pytest.raises(SystemExit, match="holds no policy yet"):
            inspect_checkpoints.main([f"run={tmp_path}", *asked])
    with pytest.raises(SystemExit, match="is not a run directory"):
        inspect_checkpoints.main([f"run={tmp_path / 'absent'}"])
