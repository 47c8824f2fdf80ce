"""DAgger relabeling: the expert's reply to each prompt, in the state the recorded commands led to."""

import dataclasses
import functools

import numpy as np
import pytest

from atdp_io import AtdpStore, EventKind, GovernanceUpdate, SourceRef
from sao_jax.envs.alfworld import SPLITS, AlfworldEnv, vocabulary
from sao_jax.pipeline.relabel import relabel_all, relabel_with_expert
from sao_jax.pipeline.warm_start import batches_per_epoch, heldout_games
from sao_jax.rollout import EnvConfig, RolloutConfig, collect_expert_demos
from sao_jax.tokenizers import WordTokenizer


@functools.cache
def tokenizer():
    return WordTokenizer.from_texts([" ".join(vocabulary())])


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    store = AtdpStore.open(str(tmp_path_factory.mktemp("atdp")))
    with store.writer("demos") as writer:
        collect_expert_demos(
            writer,
            tokenizer(),
            num_episodes=4,
            rollout=RolloutConfig(max_new_tokens=12, max_context_tokens=512),
            env=EnvConfig(size="small", max_steps=20),
        )
    reader = store.reader("demos", principal="demos")
    reader.refresh()
    trajectories = [reader.read(i) for i in reader.trajectory_ids()]
    assert len(trajectories) == 4
    return trajectories


def outputs(trajectory):
    return [e.llm.output_ids.tolist() for e in trajectory.events if e.kind == EventKind.LLM_CALL]


def test_the_expert_relabels_its_own_demonstration_identically(demos):
    for demo in demos:
        relabelled = relabel_with_expert(
            demo, tokenizer(), think=False, max_new_tokens=12, tenant="relabelled"
        )
        assert outputs(relabelled) == outputs(demo)
        assert relabelled.header.governance.tenant == "relabelled"
        assert relabelled.trajectory_id == f"{demo.trajectory_id}-relabel"
        assert relabelled.header.task["source"] == "expert_relabel"
        prompts = [e.llm.input_ids for e in relabelled.events if e.kind == EventKind.LLM_CALL]
        originals = [e.llm.input_ids for e in demo.events if e.kind == EventKind.LLM_CALL]
        assert all(np.array_equal(a, b) for a, b in zip(prompts, originals, strict=True))
        # relabelled turns carry no reward (they are cloning targets, not RL samples)
        assert all(not e.rewards for e in relabelled.events)
        for _, event in relabelled.llm_events():  # which expert relabelled: the demos' own
            assert event.llm.decoding.extra["policy"] == "expert-search"
            assert event.llm.model_id == "alfworld-expert-relabel-search"


def test_the_relabelling_expert_is_chosen_and_recorded(demos):
    demo = demos[0]
    relabelled = relabel_with_expert(
        demo, tokenizer(), think=False, max_new_tokens=12, expert="oracle"
    )
    for _, event in relabelled.llm_events():
        assert event.llm.decoding.extra["policy"] == "expert-oracle"
        assert event.llm.model_id == "alfworld-expert-relabel-oracle"
    with pytest.raises(ValueError, match="unknown expert 'planner'"):
        relabel_all(demos, tokenizer(), think=False, max_new_tokens=12, expert="planner")


def test_relabels_follow_the_recorded_commands_not_the_expert(demos):
    demo = demos[0]
    # The policy wasted its first step on `look` (no state change): the expert's answer to the
    # second prompt is the first move of its plan again, not the demo's second move.
    events = list(demo.events)
    steps = [i for i, e in enumerate(events) if e.kind == EventKind.ENV_STEP]
    first_step = events[steps[0]]
    events[steps[0]] = dataclasses.replace(
        first_step, action=dataclasses.replace(first_step.action, text="look")
    )
    detoured = dataclasses.replace(demo, events=tuple(events))
    relabelled = relabel_with_expert(detoured, tokenizer(), think=False, max_new_tokens=12)
    want = outputs(demo)
    got = outputs(relabelled)
    assert got[0] == want[0] and got[1] == want[0] != want[1]

    task = demo.header.task
    env = AlfworldEnv(task["split"], size=task["size"], max_steps=task["max_steps"])
    env.reset(task["index"])
    assert tokenizer().decode(got[0], skip_special_tokens=True) == (
        f"<action>{env.expert_action()}</action>"
    )


def test_relabel_all_skips_what_cannot_be_relabelled(demos):
    too_short = relabel_all(demos, tokenizer(), think=False, max_new_tokens=2)
    assert too_short == []
    assert len(relabel_all(demos, tokenizer(), think=False, max_new_tokens=12)) == len(demos)


def test_an_epoch_counts_the_batches_the_loader_fills_without_splitting_an_episode():
    assert batches_per_epoch(np.array([4, 4, 4, 4]), 8) == 2
    assert batches_per_epoch(np.array([5, 4, 5]), 8) == 3  # an episode never straddles batches
    assert batches_per_epoch(np.array([3, 9, 3]), 8) == 1  # one over a batch is dropped
    assert batches_per_epoch(np.array([], int), 8) == 0


def test_held_out_games_are_the_last_of_the_train_split_and_never_demonstrated():
    train, held = heldout_games(64, SPLITS["train"])
    assert len(held) == 64 and held[-1] == SPLITS["train"] - 1
    assert not set(train) & set(held) and len(train) + len(held) == SPLITS["train"]
    with pytest.raises(ValueError, match="heldout_episodes"):
        heldout_games(SPLITS["train"], SPLITS["train"])


def test_relabelled_episodes_are_derived_data_of_the_episode(demos):
    demo = dataclasses.replace(
        demos[0],
        annotations=(GovernanceUpdate(demos[0].trajectory_id, 1.0, "retention", expires_at=123.0),),
    )
    relabelled = relabel_with_expert(
        demo, tokenizer(), think=False, max_new_tokens=12, tenant="relabelled"
    )
    assert relabelled.header.derived_from == (SourceRef("demos", demo.trajectory_id),)
    governance = relabelled.header.governance
    assert governance.tenant == "relabelled"
    assert governance.expires_at == 123.0  # the episode's retention as updated, not as written
    assert dataclasses.replace(governance, tenant="demos", expires_at=None) == dataclasses.replace(
        demo.header.governance, expires_at=None
    )


def test_a_reused_warm_start_is_evaluated_again_when_the_evaluation_changes(tmp_path):
    """`evaluation_changes` names the settings in which a run evaluates otherwise than the run
    whose warm start it reuses; sampling, rewards and the learner do not count."""
    from sao_jax.config_fields import apply_overrides, config_to_yaml
    from sao_jax.pipeline.config import ExperimentConfig
    from sao_jax.pipeline.warm_start import evaluation_changes

    earlier = apply_overrides(ExperimentConfig(), ["rollout.prompt_style=compact"])
    (tmp_path / "config.yaml").write_text(config_to_yaml(earlier))
    same = apply_overrides(
        earlier,
        ["rollout.temperature=0.7", "rollout.inadmissible_penalty=-1.0", "learner.kl.coef=1.0"],
    )
    assert evaluation_changes(same, str(tmp_path)) == []
    other = apply_overrides(
        earlier,
        ["rollout.reply_choices=true", "env.max_steps=20", "eval.num_games=10"],
    )
    assert evaluation_changes(other, str(tmp_path)) == [
        "rollout.reply_choices",
        "env.max_steps",
        "eval.num_games",
    ]
    assert evaluation_changes(other, str(tmp_path / "no_run_here")) == []


def test_a_warm_start_of_another_job_is_compared_on_its_evaluation_settings_only(tmp_path):
    """An `alfworld_sao` run may reuse an `alfworld_seed` warm start: that run's config.yaml has
    a `hindsight` section the plain schema does not know, and only the evaluation settings are
    compared (an SAO baseline from a SEED warm start used to fail on the unknown key)."""
    from sao_jax.config_fields import apply_overrides, config_to_yaml
    from sao_jax.pipeline.config import ExperimentConfig
    from sao_jax.pipeline.seed import SeedExperimentConfig
    from sao_jax.pipeline.warm_start import evaluation_changes

    seed_run = apply_overrides(
        SeedExperimentConfig(), ["hindsight.warm_start_skill_fraction=0.5", "env.max_steps=15"]
    )
    (tmp_path / "config.yaml").write_text(config_to_yaml(seed_run))
    plain = ExperimentConfig()
    assert evaluation_changes(apply_overrides(plain, ["env.max_steps=15"]), str(tmp_path)) == []
    assert evaluation_changes(plain, str(tmp_path)) == ["env.max_steps"]
