"""A run whose batches fit none of its prompts (e.g. the tiny preset with a longer
`rollout.history_length`) stops at the command line, naming the settings to change, instead of
dropping every episode and waiting forever."""

import dataclasses
import re

import grain
import pytest

from atdp_io import AtdpStore
from atdp_io.loader import AtdpLoader, LoaderConfig
from experiments import alfworld_sao
from sao_jax.pipeline import cli
from sao_jax.pipeline.lengths import (
    DEMOS,
    DemoLengths,
    SequenceLengthError,
    check_sequence_lengths,
    measure_demonstrations,
    size_sequences,
    stored_demo_lengths,
)
from sao_jax.pipeline.setup import build_tokenizer
from sao_jax.rollout import collect_expert_demos

ONE_SHARD = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


# The papers' longer prompt wording: its rows straddle 256 tokens, which these checks need.
PAPER = "rollout.prompt_style=paper"


def _config(tmp_path, *overrides):
    return alfworld_sao.parse(["--out", str(tmp_path / "run"), "progress=false", PAPER, *overrides])


def _lengths(config, num_episodes=64):
    return measure_demonstrations(
        build_tokenizer(config), config.rollout, config.env, num_episodes=num_episodes
    )


@pytest.mark.timeout(60)
def test_a_longer_history_stops_at_the_command_line_and_its_advice_works(tmp_path, capsys):
    argv = [
        "--out",
        str(tmp_path / "run"),
        "progress=false",
        PAPER,
        "rollout.history_length=2",
        "warm_start.seq_len=256",
        "rl.seq_len=256",
    ]
    with pytest.raises(SystemExit) as exit_info:
        alfworld_sao.main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    for setting in ("rollout.history_length=2", "warm_start.seq_len=256", "rl.seq_len=256"):
        assert setting in error
    assert "wait forever" in error
    assert not (tmp_path / "run" / "atdp").exists()  # nothing ran
    advice = re.search(r"Set warm_start\.seq_len=(\d+) rl\.seq_len=(\d+)", error)
    assert advice and min(int(advice[1]), int(advice[2])) > 256

    # what it says to set is enough: the same check passes (every sampled episode fits)
    fixed = _config(
        tmp_path,
        "rollout.history_length=2",
        f"warm_start.seq_len={advice[1]}",
        f"rl.seq_len={advice[2]}",
    )
    assert check_sequence_lengths(fixed, _lengths(fixed, num_episodes=256)) == []


@pytest.mark.timeout(60)
def test_the_default_rows_are_sized_so_that_no_demonstration_is_dropped(tmp_path):
    config = _config(tmp_path)
    assert config.warm_start.seq_len == config.rl.seq_len == 0  # auto
    lengths = _lengths(config, num_episodes=256)
    sized = size_sequences(config, lengths)
    assert sized.warm_start.seq_len >= lengths.longest_row.max()
    assert sized.warm_start.seq_len % 32 == 0 and sized.rl.seq_len % 32 == 0
    assert sized.rl.seq_len >= lengths.longest_prompt.max() + config.rollout.max_new_tokens
    assert check_sequence_lengths(config, lengths) == []
    # the command line sizes them before the run starts, and keeps an explicit value
    assert cli.check_lengths(config).warm_start.seq_len == sized.warm_start.seq_len
    explicit = _config(tmp_path, "warm_start.seq_len=512")
    assert cli.check_lengths(explicit).warm_start.seq_len == 512


@pytest.mark.timeout(60)
def test_a_shorter_explicit_row_runs_and_warns_what_its_batches_drop(tmp_path):
    config = _config(tmp_path, "warm_start.seq_len=256", "rl.seq_len=256")
    lengths = _lengths(config)
    warnings = check_sequence_lengths(config, lengths)
    dropped = int((lengths.longest_row > 256).sum())
    assert 0 < dropped < lengths.longest_row.size  # some episodes fit, some do not
    assert len(warnings) == 2
    assert warnings[0].startswith("warm_start.seq_len=256") and f"drops {dropped} of" in warnings[0]
    assert warnings[1].startswith("rl.seq_len=256")


@pytest.mark.timeout(60)
def test_without_behaviour_cloning_only_the_rl_batches_are_checked(tmp_path):
    config = _config(
        tmp_path, "rollout.history_length=2", "warm_start.seq_len=256", "rl.seq_len=512"
    )
    lengths = _lengths(config)
    with pytest.raises(SequenceLengthError, match=r"warm_start\.seq_len=256 x warm_start\.rows"):
        check_sequence_lengths(config, lengths)
    no_cloning = dataclasses.replace(
        config, warm_start=dataclasses.replace(config.warm_start, steps=0, epochs=0.0)
    )
    assert check_sequence_lengths(no_cloning, lengths) == []
    too_few_rows = dataclasses.replace(no_cloning, rl=dataclasses.replace(config.rl, rows=1))
    with pytest.raises(SequenceLengthError, match=r"rl\.rows=\d+"):
        check_sequence_lengths(too_few_rows, lengths)


@pytest.mark.timeout(60)
def test_a_context_cap_below_the_first_prompt_also_stops_at_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        alfworld_sao.main(["--out", str(tmp_path / "run"), "rollout.max_context_tokens=64"])
    assert exit_info.value.code == 2
    assert "max_context_tokens=64" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_measured_lengths_predict_exactly_what_the_loader_drops(tmp_path):
    config = _config(tmp_path, "rollout.history_length=2")
    store = AtdpStore.open(str(tmp_path / "atdp"))
    with store.writer(DEMOS) as writer:
        collect_expert_demos(
            writer, build_tokenizer(config), num_episodes=24, rollout=config.rollout, env=config.env
        )
    lengths = stored_demo_lengths(store, config.rollout.layout)
    seq_len = int(lengths.longest_row.min()) + 8  # some fit, some do not
    loader = AtdpLoader(
        store,
        [DEMOS],
        principal=DEMOS,
        config=LoaderConfig(rows=64, seq_len=seq_len, layout=config.rollout.layout),
    )
    rows = sum(int((b["traj_index"] >= 0).sum()) for b in loader.epoch(shard=ONE_SHARD))
    fits = lengths.longest_row <= seq_len
    assert 0 < fits.sum() < fits.size
    assert loader.stats.snapshot()["dropped_too_long"] == int((~fits).sum())
    assert rows == int(lengths.num_rows[fits].sum())  # windowed: one row per turn


def test_lengths_extended_by_more_episodes_are_those_of_all_of_them_in_order(tmp_path):
    config = _config(tmp_path)
    store = AtdpStore.open(str(tmp_path / "atdp"))
    with store.writer(DEMOS) as writer:
        collect_expert_demos(
            writer, build_tokenizer(config), num_episodes=12, rollout=config.rollout, env=config.env
        )
    reader = store.reader(DEMOS, principal=DEMOS)
    reader.refresh()
    episodes = [reader.read(i) for i in reader.trajectory_ids()]
    layout = config.rollout.layout
    whole = DemoLengths.of(episodes, layout)
    joined = DemoLengths.of(episodes[:5], layout).extended(DemoLengths.of(episodes[5:], layout))
    for name in ("longest_row", "num_rows", "longest_prompt"):
        assert getattr(joined, name).tolist() == getattr(whole, name).tolist(), name
    empty = DemoLengths.of([], layout)
    assert empty.extended(whole).num_rows.tolist() == whole.num_rows.tolist()
    assert empty.extended(whole).num_rows.dtype.kind == "i"  # an empty part keeps counts ints
