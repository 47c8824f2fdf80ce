"""SEED on served traffic: `python -m experiments.online_sao learner.algorithm=sao_seed` through
the real gateway on loopback (the agent a real subprocess speaking the `openai` client), and the
records SEED reads from what the gateway recorded."""

import dataclasses
import json

import pytest

from atdp_io import AtdpStore, EventKind
from experiments import online_sao
from sao_jax.envs.alfworld import make_game
from sao_jax.envs.base import parse_reply
from sao_jax.metrics import read_metrics
from sao_jax.pipeline.online_config import OnlineConfig
from sao_jax.pipeline.seed import SeedExperimentConfig
from sao_jax.seed import SeedConfig, from_trajectory, load_skills, make_analyzer

MICRO = [
    "--config", "micro", "progress=false", "tensorboard=false", "warm_start.steps=0",
    "learner.algorithm=sao_seed", "learner.opd.weight=0.5",
    "hindsight.max_skill_new_tokens=8", "hindsight.max_skill_tokens=48",
]  # fmt: skip


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("online_seed")
    summary = online_sao.main([*MICRO, "--out", str(out)])
    return out, summary


@pytest.fixture(scope="module")
def served(seed_run):
    out, _ = seed_run
    reader = AtdpStore.open(str(out / "atdp")).reader("online", principal="online")
    reader.refresh()
    closed = [t for t in map(reader.read, reader.trajectory_ids()) if t.outcome is not None]
    lines = (out / "agent" / "episodes.jsonl").read_text().splitlines()
    return closed, {e["trajectory_id"]: e for e in map(json.loads, lines)}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the run (module fixture): online_sao's plus SEED's compiles
def test_online_sao_seed_trains_the_opd_term_on_served_traffic(seed_run):
    out, summary = seed_run
    saved = json.loads((out / "summary.json").read_text())
    assert (
        saved["algorithm"] == "sao_seed" and saved["policy_steps"] == summary["policy_steps"] == 2
    )
    assert saved["serving"]["agent_exit_status"] == 0 and saved["serving"]["requests"] > 0
    rl = [r for r in read_metrics(out) if "serving/requests" in r]
    assert [r["policy_version"] for r in rl] == [1.0, 2.0]
    for record in rl:
        # skills were written for the served episodes, the re-scored teacher differs from the
        # student, and the OPD term is in the policy loss
        assert record["seed/skills"] > 0 and record["seed/rescore_seconds"] > 0
        assert record["policy/opd_loss"] != 0.0 and record["policy/opd_delta_abs_mean"] > 0
        # the OPD term's part of the gradient (above 1 when it pulls against the RL term)
        assert record["policy/opd_token_grad_share"] > 0
        assert -1 <= record["policy/opd_token_grad_cos"] <= 1
    assert saved["seed_opd_loss"] != 0.0 and saved["seed_analysis_seconds_per_iter"] > 0
    store = AtdpStore.open(str(out / "atdp"), create=False)
    skills = load_skills(store, tenant="skills")
    assert skills and {s.skill.analyzer for s in skills} == {"self_policy"}
    # every skill names a served episode as its source
    ids = {s.skill.trajectory_id for s in skills}
    reader = store.reader("online", principal="online")
    reader.refresh()
    assert ids <= set(reader.trajectory_ids())


@pytest.mark.slow
def test_served_trajectories_become_records_of_what_the_agent_did(served):
    closed, episodes = served
    assert closed
    rules = make_analyzer("rule", config=SeedConfig())
    for trajectory in closed:
        episode = episodes[trajectory.trajectory_id]
        record = from_trajectory(trajectory)
        # the agent's replies, read by the harness as it read them; a malformed one is ""
        replies = [c["reply"] for c in episode["calls"]]
        assert list(record.actions) == [parse_reply(r, think=False).action or "" for r in replies]
        game = make_game("train", episode["game"], size=record.game["size"])
        assert record.task == game.task.sentence
        assert record.success == episode["won"] and record.game["index"] == episode["game"]
        prompts = [e.observation["content"] for e in trajectory.events
                   if e.kind == EventKind.MESSAGE]  # fmt: skip
        assert len(record.observations) == len(prompts) == len(replies)
        assert all(obs and obs in prompt for obs, prompt in zip(record.observations, prompts,
                                                                 strict=True))  # fmt: skip
        # the rule-based analyzer reads a served episode like any other: ground truth first
        (skill,) = rules.analyze([record])
        target = next(i for i in game.items if i.cls == game.task.object_cls)
        assert skill.parts[0].text == (
            f"The {target.name} is in {game.receptacles[target.start].name}."
        )
    # a served session that never reached the model has nothing to analyse: a clear error
    silent = dataclasses.replace(
        closed[0], events=tuple(e for e in closed[0].events if e.kind != EventKind.LLM_CALL)
    )
    with pytest.raises(ValueError, match=f"{closed[0].trajectory_id}.*has no actions"):
        from_trajectory(silent)


def test_online_config_takes_sao_seed_only_among_seed_algorithms():
    config = online_sao.micro()
    seeded = OnlineConfig(**{**vars(config), "learner": _with_algorithm(config, "sao_seed")})
    experiment = seeded.experiment()
    assert isinstance(experiment, SeedExperimentConfig)
    assert experiment.hindsight.sft_steps == 0  # stage 1 is off online unless asked for
    assert not isinstance(config.experiment(), SeedExperimentConfig)
    with pytest.raises(ValueError, match=r"one of \('sao', 'sao_seed'\) online, got 'grpo_seed'"):
        OnlineConfig(**{**vars(config), "learner": _with_algorithm(config, "grpo_seed")})


def _with_algorithm(config, name):
    return dataclasses.replace(config.learner, algorithm=name)
