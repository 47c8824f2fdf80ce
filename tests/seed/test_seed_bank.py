"""The skill bank: ATDP round trip, inspect CLI, serving memory, stage-1 SFT data."""

import numpy as np
import pytest
from seed_factories import demo_store, demo_trajectories, first_batch, word_tokenizer

from atdp_io import AtdpStore
from sao_jax.seed import (
    SKILL_BLOCK_TITLE,
    RuleBasedAlfworldAnalyzer,
    from_trajectory,
    label_and_store,
    load_skills,
    memory_block,
    with_skill_memory,
    write_skills,
)
from sao_jax.seed.__main__ import main as seed_cli
from sao_jax.seed.templates import analysis_prompt_ids


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bank")
    demo_store(path, num_episodes=4)
    return str(path)


@pytest.fixture(scope="module")
def store(bank_dir):
    return AtdpStore.open(bank_dir, create=False)


def test_skills_round_trip_through_atdp_with_provenance(store):
    records = [from_trajectory(t) for t in demo_trajectories(store)]
    skills = RuleBasedAlfworldAnalyzer().analyze(records)
    ids = write_skills(store, records, skills, word_tokenizer(), tenant="bank-a")
    assert len(ids) == len(skills)
    loaded = load_skills(store, tenant="bank-a")
    assert sorted((s.skill for s in loaded), key=repr) == sorted(
        skills, key=repr
    )  # all provenance kept
    assert sorted(s.bank_id for s in loaded) == sorted(ids)
    task_type = records[0].task_type
    of_type = load_skills(store, tenant="bank-a", task_type=task_type)
    assert of_type and {s.skill.task_type for s in of_type} == {task_type}
    assert len(load_skills(store, tenant="bank-a", limit=2)) == 2
    with pytest.raises(ValueError, match="limit"):
        load_skills(store, tenant="bank-a", limit=0)
    with pytest.raises(ValueError, match="2 records but 1 skills"):
        write_skills(store, records[:2], skills[:1], word_tokenizer(), tenant="bank-a")


def test_inspect_cli_prints_the_bank(store, bank_dir, capsys):
    records = [from_trajectory(t) for t in demo_trajectories(store)]
    skills = RuleBasedAlfworldAnalyzer().analyze(records)
    write_skills(store, records, skills, word_tokenizer(), tenant="bank-b")
    path = bank_dir
    assert seed_cli(["inspect", path, "--tenant", "bank-b", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "3 skill(s)" in out
    assert sum(s.text[:30] in out for s in skills) >= 1
    task_type = records[0].task_type
    seed_cli(["inspect", path, "--tenant", "bank-b", "--task-type", task_type])
    out = capsys.readouterr().out
    assert task_type in out
    with pytest.raises(SystemExit):
        seed_cli(["inspect", path, "--tenant", "nobody"])
    assert "no tenant 'nobody'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        seed_cli(["inspect", path + "-missing"])
    assert "no ATDP store" in capsys.readouterr().err


def test_memory_block_for_serving(store):
    records = [from_trajectory(t) for t in demo_trajectories(store)]
    skills = RuleBasedAlfworldAnalyzer().analyze(records)
    task_type = records[0].task_type
    block = memory_block(skills, task_type)
    assert block.startswith(f"{SKILL_BLOCK_TITLE}: ")
    assert skills[0].text in block
    messages = [{"role": "user", "content": "hello"}]
    injected = with_skill_memory(messages, skills, task_type)
    assert injected[0] == {"role": "system", "content": block}
    assert injected[1:] == messages
    assert with_skill_memory(messages, skills, "no_such_type") == messages
    assert memory_block(skills, "no_such_type") is None


def test_stage_one_data_is_nll_on_skill_tokens_given_the_episode(store):
    tokenizer = word_tokenizer()
    trajectories = demo_trajectories(store)
    stats, skills = label_and_store(
        store, trajectories, RuleBasedAlfworldAnalyzer(), tokenizer, tenant="sft", batch_size=3
    )
    assert stats["skills"] == len(trajectories) and stats["skipped"] == 0
    assert [s.trajectory_id for s in skills] == [t.trajectory_id for t in trajectories]
    batch = first_batch(store, tenant="sft", rows=8, seq_len=320)
    # the episode each stored skill was written about
    about = {s.skill.text: s.skill.trajectory_id for s in load_skills(store, tenant="sft")}
    records = {t.trajectory_id: from_trajectory(t) for t in trajectories}
    rows = np.flatnonzero(batch["traj_index"] >= 0)
    assert len(rows) == len(trajectories)
    for r in rows:
        mask = batch["loss_mask"][r] > 0
        skill = tokenizer.decode(batch["tokens"][r][mask], skip_special_tokens=True)
        assert skill in about  # the trained tokens are exactly the skill (+ end of turn)
        prompt = batch["tokens"][r][: np.flatnonzero(mask)[0]]
        assert list(prompt) == analysis_prompt_ids(tokenizer, records[about[skill]])
