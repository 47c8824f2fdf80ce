"""The learner records which trajectories each checkpoint trained on (atdp_io.trained_on)."""

from train_factories import TENANT, episode, exact_learner_config, loader, tiny_policy, write_store

from atdp_io import trained_on
from atdp_io.schema import SourceRef
from sao_jax.checkpoint import Checkpointer
from sao_jax.train.learner import Learner


def test_each_checkpoint_names_the_trajectories_its_weights_trained_on(tmp_path):
    episodes = [episode(f"e{i}", seed=i, reward=float(i % 2)) for i in range(4)]
    batches = list(
        loader(write_store(tmp_path / "store", episodes), rows=2, seq_len=48).epoch(
            shuffle=False, num_epochs=1
        )
    )
    assert len(batches) == 2  # two episodes per batch
    learner = Learner(exact_learner_config(), tiny_policy())
    learner.trained_on.parent = str(tmp_path / "warm_start" / "0")  # where its weights began
    ckpt = tmp_path / "ckpt"
    with Checkpointer(ckpt, max_to_keep=1, save_interval_steps=2) as checkpointer:
        learner.iteration(batches[0])
        assert learner.save(checkpointer, 1) is False  # skipped by the interval: keeps counting
        assert trained_on.steps(ckpt) == []
        assert learner.save(checkpointer, 2)
        learner.iteration(batches[1])
        assert learner.save(checkpointer, 4)
        checkpointer.wait_until_finished()
        assert checkpointer.all_steps() == [4]  # step 2 pruned, its sidecar kept
    first = {SourceRef(TENANT, "e0"), SourceRef(TENANT, "e1")}
    second = {SourceRef(TENANT, "e2"), SourceRef(TENANT, "e3")}
    assert set(trained_on.read_step(ckpt, 2).trajectories) == first
    step4 = trained_on.read_step(ckpt, 4)
    assert set(step4.trajectories) == second and step4.parent == str(ckpt / "2")
    assert step4.policy_version == learner.policy_version
    assert set(trained_on.trained_on(ckpt / "4")) == first | second
    assert [s.path for s in trained_on.chain(ckpt / "4")] == [str(ckpt / "4"), str(ckpt / "2")]

    resumed = Learner(exact_learner_config(), tiny_policy(seed=1))
    with Checkpointer(ckpt) as checkpointer:
        resumed.restore(checkpointer)
        assert resumed.trained_on.parent == str(ckpt / "4")
        resumed.save(checkpointer, 6)  # no new batch: all it knows comes from its parent
        checkpointer.wait_until_finished()
    step6 = trained_on.read_step(ckpt, 6)
    assert step6.parent == str(ckpt / "4") and step6.trajectories == {}
    assert set(trained_on.trained_on(ckpt / "6")) == first | second
