"""`python -m experiments.alfworld_sao` end to end (micro preset), --resume, bad overrides, and
`python -m experiments.compare_algos` on two algorithms."""

import json
import re

import pytest

from atdp_io import AtdpStore, trained_on
from experiments import alfworld_sao, compare_algos, inspect_checkpoints
from sao_jax.checkpoint import Checkpointer
from sao_jax.metrics import read_metrics

# The micro preset, smaller still: the smoke run is about the plumbing, not the learning.
MICRO = [
    "--config",
    "micro",
    "progress=false",
    "tensorboard=false",
    "eval.num_games=2",
    "warm_start.demo_episodes=4",
    "rl.critic_head_fit=true",
    "rl.batch_episodes=1",  # micro plays 2 a version: a step trains on 1
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    # with a KL term towards the warm start: its reference rides through checkpoints and resume
    summary = alfworld_sao.main([*MICRO, "--out", str(out), "learner.kl.coef=0.1"])
    return out, summary


@pytest.mark.slow
def test_a_run_writes_metrics_summary_curve_and_checkpoints(finished_run):
    out, summary = finished_run
    saved = json.loads((out / "summary.json").read_text())
    for key in (
        "unseen_success_start",
        "unseen_success_end",
        "seen_success_end",
        "policy_steps",
        "wall_seconds",
    ):
        assert key in saved and saved[key] is not None, key
    assert saved["policy_steps"] == summary["policy_steps"] == 2
    assert saved["by_task_type"]["valid_unseen_end"]  # per task type numbers
    records = read_metrics(out)
    steps = [r["step"] for r in records]
    assert steps == sorted(steps) and steps[0] == 1
    assert any("bc/nll" in r and "bc/context_nll" in r for r in records)
    assert any(r.get("dagger/relabelled_turns", 0) > 0 for r in records)
    # the summary's warm-start block carries each DAgger round's success and the relabels
    (dagger,) = [r for r in records if "dagger/success" in r]  # micro: one round
    assert saved["warm_start"]["dagger1_success"] == dagger["dagger/success"]
    assert saved["warm_start"]["dagger_relabelled_turns"] == dagger["dagger/relabelled_turns"]
    assert any("eval/valid_unseen/success" in r for r in records)
    rl = [r for r in records if r.get("phase") == 1.0]
    assert len(rl) >= 2 and all("policy/clip_frac" in r and "critic/loss" in r for r in rl)
    assert all(r["policy/kl_loss"] == pytest.approx(0.1 * r["policy/kl_k3"]) for r in rl)
    assert all(r["batch/trajectories"] == 1 for r in rl if "policy/clip_frac" in r)
    assert any(r.get("phase") == 0.0 for r in records)  # the critic warm-up ran first
    fits = [r for r in records if "critic_fit/explained_variance" in r]
    assert len(fits) == 1 and fits[0]["critic_fit/tokens"] > 0  # its head fitted once, first
    assert fits[0]["step"] <= min(r["step"] for r in records if r.get("phase") == 0.0)
    assert (out / "learning_curve.png").stat().st_size > 10_000
    assert (out / "config.yaml").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    assert (out / "atdp" / "tenants" / "rollouts").is_dir()
    # lineage: the last checkpoint chains back to the warm start and names what it trained on
    latest = max(int(p.name) for p in (out / "checkpoints").iterdir() if p.name.isdigit())
    chain = trained_on.chain(out / "checkpoints" / str(latest))
    assert chain[-1].path == str(out / "warm_start" / "0") and chain[-1].parent is None
    tenants = {ref.tenant for ref in trained_on.trained_on(out / "checkpoints" / str(latest))}
    assert {"demos", "rollouts"} <= tenants


@pytest.mark.slow
def test_inspect_checkpoints_replays_the_runs_own_evaluations(finished_run, capsys):
    """The warm start and the last RL checkpoint, replayed game by game, win what the run
    reported at its start and end; the records and the comparison are written."""
    out, _ = finished_run
    saved = json.loads((out / "summary.json").read_text())
    last = saved["policy_steps"]
    result = inspect_checkpoints.main([f"run={out}", "out=" + str(out / "inspected")])
    policies = result["policies"]
    assert sorted(policies) == [0, last]  # the warm start and every kept RL checkpoint
    assert policies[0]["success"] == saved["unseen_success_start"]
    assert policies[last]["success"] == saved["unseen_success_end"]
    for step in (0, last):
        lines = (out / "inspected" / f"valid_unseen_step{step}.jsonl").read_text().splitlines()
        games = [json.loads(line) for line in lines]
        assert [g["game_index"] for g in games] == [0, 1]  # the run's eval.num_games
        assert all(len(g["expert"]) == len(g["commands"]) > 0 for g in games)
    pair = result["pairs"][f"0->{last}"]
    assert pair["both_won"] + pair["both_lost"] + pair["gained"] + pair["lost"] == 2
    assert json.loads((out / "inspected" / "valid_unseen_summary.json").read_text())["pairs"]
    assert "by policy step" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"no policy at step\(s\) \[7\]; it has \[0, "):
        inspect_checkpoints.main([f"run={out}", "policy_steps=[0,7]"])


@pytest.mark.slow
def test_inspect_checkpoints_under_sampling(finished_run, capsys):
    """`temperature` / `samples_per_game`: each game played N times by the sampled policy,
    written beside the greedy records, no game-by-game pairs; bad settings exit clearly."""
    out, _ = finished_run
    inspected = out / "inspected_sampled"
    argv = [f"run={out}", f"out={inspected}", "policy_steps=[0]"]
    result = inspect_checkpoints.main([*argv, "temperature=1", "samples_per_game=3"])
    assert result["pairs"] == {} and result["policies"][0]["games"] == 6  # 2 games x 3
    lines = (inspected / "valid_unseen_t1x3_step0.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["game_index"] for line in lines) == [0, 0, 0, 1, 1, 1]
    assert (inspected / "valid_unseen_t1x3_summary.json").is_file()
    assert "Sampled games (temperature 1, 3 a game)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="greedy play repeats itself"):
        inspect_checkpoints.main([*argv, "samples_per_game=3"])


@pytest.mark.slow
def test_replies_kept_to_the_listed_actions_from_a_reused_warm_start(finished_run, tmp_path):
    """`rollout.reply_choices` end to end: the reused warm start is evaluated again under the
    choices (its saved evaluation played free replies), and no reply of RL or evaluation is
    refused or malformed; the learner's ratio at the sampling weights is 1."""
    out, first = finished_run
    run = tmp_path / "choices"
    summary = alfworld_sao.main(
        [*MICRO, "--out", str(run), f"warm_start.from_run={out}", "rollout.reply_choices=true"]
    )
    records = read_metrics(run)
    starts = [r for r in records if "eval/valid_unseen/inadmissible_rate" in r]
    assert len(starts) == 2  # evaluated again at the start, and at the end
    assert all(r["eval/valid_unseen/inadmissible_rate"] == 0.0 for r in starts)
    assert all(r["eval/valid_unseen/invalid_reply_rate"] == 0.0 for r in starts)
    saved = read_metrics(out)
    free = next(r for r in saved if "eval/valid_unseen/inadmissible_rate" in r)
    assert (
        free["eval/valid_unseen/inadmissible_rate"] + free["eval/valid_unseen/invalid_reply_rate"]
        > 0
    )
    rl = [r for r in records if "policy/ratio_mean" in r]
    assert rl and all(
        r["rollout/inadmissible_rate"] == 0.0 for r in rl if "rollout/inadmissible_rate" in r
    )
    assert rl[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert summary["policy_steps"] == first["policy_steps"]


@pytest.mark.slow
def test_failed_task_replay_from_the_command_line(finished_run, tmp_path):
    """`env.replay_failed` end to end: RL's task stream plays lost games again (the micro
    policy loses nearly every game), at most `replay_limit` more times each, and the metrics
    count each replay."""
    run = three_synchronous_steps(
        finished_run, tmp_path, "env.replay_failed=0.9", "env.replay_limit=1"
    )
    (games,) = rl_games_by_engine(run).values()
    replayed = [r["rollout/replayed_tasks"] for r in read_metrics(run) if "rollout/episodes" in r]
    assert replayed[-1] == len(games) - len(set(games)) > 0
    assert replayed == sorted(replayed)  # a running count
    assert max(games.count(g) for g in games) == 2  # replay_limit=1: one replay a game


@pytest.mark.slow
def test_rollout_temperature_schedule_from_the_command_line(finished_run, tmp_path):
    """`rl.final_temperature` end to end: each synchronous round's episodes are played and
    recorded at the schedule's temperature for that policy step, and the learner trains on
    them (the recorded behaviour log-probs give a DIS ratio of 1 at the first step)."""
    run = three_synchronous_steps(
        finished_run,
        tmp_path,
        "rl.final_temperature=0.4",
        "rl.batch_episodes=0",  # a step trains on its round: 2 episodes, one temperature
    )
    records = [r for r in read_metrics(run) if "rollout/temperature" in r]
    assert [r["rollout/temperature"] for r in records] == pytest.approx([1.0, 0.8, 0.6])
    assert records[0]["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    played = {}
    for trajectory_id, trajectory in rl_trajectories(run):
        group = int(re.search(r"-g(\d+)-", trajectory_id).group(1))
        calls = [e.llm for e in trajectory.events if e.llm is not None]
        temperatures = {c.decoding.temperature for c in calls}
        assert len(temperatures) == 1  # an episode keeps the temperature it started with
        (temperature,) = temperatures
        assert all(("sampled_logprobs" in c.decoding.extra) == (temperature != 1.0) for c in calls)
        played[group] = temperature
    rounds = [played[g] for g in sorted(played)]
    assert rounds == pytest.approx([1.0] * 2 + [0.8] * 2 + [0.6] * 2)  # micro: 2 a version


@pytest.mark.slow
def test_repeat_penalty_from_the_command_line(finished_run, tmp_path):
    """`rollout.repeat_penalty` end to end: the RL episodes' steps that repeat an answer carry
    the penalty as a `novelty` reward (and no other step does), and the metrics count them."""
    run = three_synchronous_steps(
        finished_run,
        tmp_path,
        "rollout.repeat_penalty=-0.5",
        "rollout.reply_choices=true",  # every command admitted: the micro policy circles
    )
    repeated = steps = 0
    for _, trajectory in rl_trajectories(run):
        for event in trajectory.events:
            if event.llm is not None or "repeated_observation" not in event.result:
                continue
            novelty = [r.value for r in event.rewards if r.source == "novelty"]
            flagged = event.result["repeated_observation"]
            assert novelty == ([-0.5] if flagged else [])
            repeated, steps = repeated + flagged, steps + 1
    assert steps and repeated
    rates = [r["rollout/repeat_rate"] for r in read_metrics(run) if "rollout/repeat_rate" in r]
    assert rates and 0 < rates[-1] <= 1
    # each iteration's recent rate covers the steps played since the one before: weighted by
    # those steps, they add up to the cumulative rate of the whole phase
    records = [r for r in read_metrics(run) if "rollout/env_steps" in r]
    counted = [0] + [r["rollout/env_steps"] for r in records]
    weighted = sum(
        r.get("rollout/recent/repeat_rate", 0.0) * (now - before)
        for r, before, now in zip(records, counted, counted[1:], strict=False)
    )
    assert any("rollout/recent/repeat_rate" in r for r in records)
    assert weighted == pytest.approx(records[-1]["rollout/repeat_rate"] * counted[-1])


def test_inspect_checkpoints_refuses_a_directory_that_holds_no_run(tmp_path):
    with pytest.raises(SystemExit, match="is not a run directory"):
        inspect_checkpoints.main([f"run={tmp_path}"])
    with pytest.raises(SystemExit, match="is not a run directory"):
        inspect_checkpoints.main([])


@pytest.mark.slow
def test_resume_continues_the_run_to_more_policy_steps(finished_run):
    out, first = finished_run
    before = read_metrics(out)
    summary = alfworld_sao.main(["--out", str(out), "--resume", "rl.policy_steps=3"])
    assert summary["policy_steps"] == 3
    assert summary["unseen_success_start"] == first["unseen_success_start"]  # not re-evaluated
    after = read_metrics(out)
    assert after[: len(before) - 1] == before[: len(before) - 1]
    assert not any("bc/nll" in r for r in after[len(before) :])  # no second warm start
    versions = [r["policy_version"] for r in after if "policy_version" in r]
    assert versions[-1] == 3.0
    # the resumed learner is held to the warm start, not to the weights it resumed from: the
    # first resumed step already sees the two earlier steps' drift
    (resumed,) = [r for r in after[len(before) :] if "policy/kl_k3" in r]
    assert resumed["policy/kl_k3"] > 1e-9
    # the resumed phase plays new games: it does not replay the first segment's in order
    segments = rl_games_by_engine(out)
    assert len(segments) == 2
    first, second = sorted(segments.values(), key=len, reverse=True)
    assert second and second != first[: len(second)]


@pytest.mark.slow
def test_failed_games_waiting_for_a_replay_survive_a_resume(finished_run, tmp_path):
    # one step per episode: every game is lost and queued for a replay (limit 2 each)
    run = three_synchronous_steps(
        finished_run, tmp_path, "env.replay_failed=0.99", "env.max_steps=1"
    )
    with Checkpointer(run / "checkpoints", create=False) as saved:
        (state,) = saved.metadata()["task_replay"][0]  # process 0, its one worker
    waiting = state["waiting"]
    assert len(waiting) >= 2 and state["replays_served"] > 0
    alfworld_sao.main(["--out", str(run), "--resume", "rl.policy_steps=5"])
    segments = rl_games_by_engine(run)
    resumed = min(segments.values(), key=len)  # the resumed engine played fewer
    # its first draws replay the saved queue, oldest first (a fresh queue would start empty and
    # draw from 3,553 games)
    assert resumed[:2] == waiting[:2]
    with Checkpointer(run / "checkpoints", create=False) as saved:
        (later,) = saved.metadata()["task_replay"][0]
    assert later["replays_served"] > state["replays_served"]  # counted on, not from zero


def three_synchronous_steps(finished_run, tmp_path, *overrides: str):
    """A run of 3 synchronous RL steps from the finished run's warm start, with `overrides`;
    its directory."""
    out, _ = finished_run
    run = tmp_path / "rl"
    alfworld_sao.main(
        [
            *MICRO,
            "--out",
            str(run),
            f"warm_start.from_run={out}",
            "rl.asynchronous=false",
            "rl.policy_steps=3",
            *overrides,
        ]
    )
    return run


def rl_trajectories(out):
    """(trajectory id, trajectory) of every RL episode in the run's `rollouts` tenant."""
    store = AtdpStore.open(str(out / "atdp"), create=False)
    reader = store.reader("rollouts", principal="rollouts")
    reader.refresh()
    for trajectory_id in reader.trajectory_ids():
        yield trajectory_id, reader.read(trajectory_id)


def rl_games_by_engine(out) -> dict[str, list[int]]:
    """The RL episodes' game indices in the run's `rollouts` tenant, per rollout engine (its
    run id's random part), in the order each engine's worker played them."""
    played: dict[str, list[tuple[int, int]]] = {}
    for trajectory_id, trajectory in rl_trajectories(out):
        engine, group = re.search(r"-r([0-9a-f]{8})-w0-g(\d+)-", trajectory_id).groups()
        index = trajectory.header.task["index"]
        played.setdefault(engine, []).append((int(group), index))
    return {engine: [index for _, index in sorted(games)] for engine, games in played.items()}


def test_bad_overrides_exit_with_a_message_naming_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        alfworld_sao.main(["--out", str(tmp_path), "learner.critic_stepz=3"])
    assert exit_info.value.code == 2
    assert "learner.critic_stepz" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_sao.main(["--out", str(tmp_path), "learner.algorithm=sa0"])
    assert "unknown algorithm 'sa0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_sao.main(["--out", str(tmp_path), "rl.rows=many"])
    assert "rl.rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_sao.main(["--out", str(tmp_path), "rl.batch_episodes=-1"])
    assert "rl.batch_episodes must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_sao.main(["--out", str(tmp_path), "rl.final_temperature=0"])
    assert "rl.final_temperature must be a number > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        alfworld_sao.main(
            ["--out", str(tmp_path), "rollout.temperature=0", "rl.final_temperature=0.5"]
        )
    assert "rollout.temperature is 0" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.slow
def test_compare_algos_runs_each_algorithm_from_one_warm_start(tmp_path, capsys):
    result = compare_algos.main(
        [
            "--out",
            str(tmp_path),
            "preset=micro",
            "algorithms=[sao,grpo]",
            "seeds=[0]",
            "env_steps=8",
            "run_overrides=[progress=false,tensorboard=false,eval.num_games=2,"
            "warm_start.demo_episodes=4]",
        ]
    )
    rows = {row["algorithm"]: row for row in result["rows"]}
    assert set(rows) == {"SAO", "GRPO"}
    sao, grpo = result["runs"]["sao"][0], result["runs"]["grpo"][0]
    assert sao["unseen_success_start"] == grpo["unseen_success_start"]  # one warm start
    assert sao["rl_env_steps"] >= 8 and grpo["rl_env_steps"] >= 8
    assert not (tmp_path / "grpo-seed0" / "warm_start").exists()
    assert (tmp_path / "comparison.png").stat().st_size > 10_000
    assert "GRPO" in (tmp_path / "comparison.txt").read_text()
    gain = rows["SAO"]["unseen_gain"]
    assert gain[0] in "+-" and "±" not in gain  # one seed: its value alone, signed
    assert gain in (tmp_path / "comparison.txt").read_text()  # printed as written

    # A comparison started from earlier runs' warm starts (`warm_start_runs`, one per seed)
    # gives that seed's warm start to every algorithm (its runs save none of their own).
    again = compare_algos.main(
        [
            "--out",
            str(tmp_path / "again"),
            "preset=micro",
            "algorithms=[grpo,grpo_dis]",
            "seeds=[0]",
            "env_steps=4",
            "run_overrides=[tensorboard=false,eval.num_games=2]",
            f"warm_start_runs={tmp_path / 'sao-seed{seed}'}",
        ]
    )
    # the RL bar counts toward the budget that ends the phase: environment steps
    err = capsys.readouterr().err
    assert "RL (GRPO)" in err and "env step" in err and "/4 [" in err
    starts = {s["unseen_success_start"] for runs in again["runs"].values() for s in runs}
    assert starts == {sao["unseen_success_start"]}
    assert not (tmp_path / "again" / "grpo-seed0" / "warm_start").exists()


def test_compare_algos_starts_each_seed_from_its_own_warm_start_run(tmp_path):
    config = compare_algos.CompareConfig(
        out_dir=str(tmp_path), preset="micro", seeds=(0, 2), warm_start_runs="base/s{seed}"
    )
    assert [config.warm_start_of(seed) for seed in (0, 2)] == ["base/s0", "base/s2"]
    run = compare_algos.run_config(config, "grpo", 2, config.warm_start_of(2))
    assert run.warm_start.from_run == "base/s2" and run.seed == 2
    assert compare_algos.CompareConfig(preset="micro").warm_start_of(0) is None
    # one run for several seeds is refused; so is a missing run, before anything runs
    with pytest.raises(ValueError, match=r"put \{seed\} where the seed goes"):
        compare_algos.CompareConfig(seeds=(0, 1), warm_start_runs="base/run")
    missing = str(tmp_path / "nothing_s{seed}")
    with pytest.raises(FileNotFoundError, match=r"seed 0.s run .*nothing_s0 holds no warm_start"):
        compare_algos.main(
            ["--out", str(tmp_path / "c"), "seeds=[0]", f"warm_start_runs={missing}"]
        )
    assert not list((tmp_path / "c").glob("*-seed*"))  # no run started


def test_compare_algos_releases_each_runs_compiled_programs():
    import jax

    probe = jax.jit(lambda x: x + 1)
    probe(1.0)
    assert probe._cache_size() == 1
    compare_algos.release_compiled_programs()  # what compare() does after every run
    assert probe._cache_size() == 0
