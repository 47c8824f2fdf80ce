"""Stage-1 acting turns with a skill in context read exactly as stage 2 re-scores with one."""

import numpy as np
import pytest
from seed_factories import demo_store, demo_trajectories, first_batch, word_tokenizer

from atdp_io import AtdpStore, EventKind, lineage
from sao_jax.pipeline.relabel import relabel_with_expert
from sao_jax.seed import RuleBasedAlfworldAnalyzer, from_trajectory, skill_block_ids
from sao_jax.seed.rescore import fit_block, skill_injected_batch
from sao_jax.seed.skill_acting import SOURCE, with_skill_in_context


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("skill_acting")
    demo_store(path, num_episodes=2)
    return AtdpStore.open(str(path), create=False)


def _oracle_relabel(trajectory, tenant="sft"):
    relabelled = relabel_with_expert(
        trajectory, word_tokenizer(), think=False, max_new_tokens=12, tenant=tenant, expert="oracle"
    )
    assert relabelled is not None
    return relabelled


def _rows(batch):
    """(tokens, positions, loss mask) of each row's real tokens, in row order."""
    out = []
    for r in np.flatnonzero(batch["traj_index"] >= 0):
        real = batch["segment_ids"][r] > 0
        out.append(
            (
                batch["tokens"][r][real].tolist(),
                batch["positions"][r][real].tolist(),
                batch["loss_mask"][r][real].tolist(),
            )
        )
    return out


@pytest.mark.parametrize("max_skill_tokens", [128, 16])  # 16: the block is cut
def test_rows_with_a_skill_are_the_rows_stage_two_rescores(store, max_skill_tokens):
    tokenizer = word_tokenizer()
    for k, episode in enumerate(demo_trajectories(store)):
        skill = RuleBasedAlfworldAnalyzer().analyze([from_trajectory(episode)])[0]
        block = skill_block_ids(tokenizer, skill.text)
        plain_tenant, skill_tenant = f"plain{max_skill_tokens}-{k}", f"skill{max_skill_tokens}-{k}"
        plain = _oracle_relabel(episode, plain_tenant)
        with_skill = with_skill_in_context(
            _oracle_relabel(episode, skill_tenant), block, max_skill_tokens=max_skill_tokens
        )
        with store.writer(plain_tenant) as writer:
            writer.append([plain])
        with store.writer(skill_tenant) as writer:
            writer.append([with_skill])
        plain_batch = first_batch(store, tenant=plain_tenant, seq_len=320)
        injected, stats = skill_injected_batch(
            plain_batch, {int(plain_batch["traj_index"][0]): block}, max_skill_tokens
        )
        assert stats["truncated"] == (len(block) > max_skill_tokens) * len(_rows(plain_batch))
        stage_one = first_batch(store, tenant=skill_tenant, seq_len=320 + max_skill_tokens)
        # token for token, position for position, the same targets
        assert _rows(stage_one) == _rows(injected)
        assert len(_rows(stage_one)) == sum(e.kind == EventKind.LLM_CALL for e in plain.events)


def test_every_prompt_gets_the_block_and_the_episode_keeps_its_lineage(store):
    tokenizer = word_tokenizer()
    episode = demo_trajectories(store)[0]
    skill = RuleBasedAlfworldAnalyzer().analyze([from_trajectory(episode)])[0]
    block = skill_block_ids(tokenizer, skill.text)
    relabelled = _oracle_relabel(episode)
    out = with_skill_in_context(relabelled, block, max_skill_tokens=len(block))
    calls = [(a.llm, b.llm) for a, b in zip(relabelled.events, out.events, strict=True) if a.llm]
    assert calls
    for before, after in calls:
        assert after.input_ids.tolist() == [*block, *before.input_ids.tolist()]
        assert after.output_ids.tolist() == before.output_ids.tolist()  # the expert's replies
    assert out.trajectory_id == f"{relabelled.trajectory_id}-skill"
    assert (
        out.header.task["source"] == SOURCE
        and out.header.task["index"] == (episode.header.task["index"])
    )
    # purged with the stored episode it was played in (not with the unstored relabel)
    assert out.header.derived_from == (lineage.source_ref(episode),)
    assert out.header.governance == relabelled.header.governance


def test_a_long_block_keeps_its_head_and_its_closing_markers():
    ids = list(range(40))
    assert fit_block(ids, 40) == (ids, False)
    assert fit_block(ids, 10) == ([*range(8), 38, 39], True)
    with pytest.raises(ValueError, match=">= 4"):
        fit_block(ids, 3)


def test_an_empty_block_is_refused(store):
    with pytest.raises(ValueError, match="empty skill block"):
        with_skill_in_context(demo_trajectories(store)[0], [], max_skill_tokens=16)
