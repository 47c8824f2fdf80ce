"""The trained-on sidecar: loader batches name their trajectories, a learner's counts land next
to each checkpoint step and chain back through its parents."""

import json

import numpy as np
import pytest
from atdp_factories import NOW, agent_trajectory

from atdp_io import AtdpStore, SchemaError, trained_on
from atdp_io.loader import AtdpLoader, LoaderConfig
from atdp_io.schema import SourceRef


def test_loader_batches_name_the_trajectory_of_every_slot(tmp_path):
    store = AtdpStore.open(tmp_path)
    episodes = {f"acme/a{i}": agent_trajectory(f"a{i}", seed=i) for i in range(3)}
    episodes["globex/g0"] = agent_trajectory("g0", tenant="globex", seed=7)
    with store.writer("acme") as writer:
        writer.append([t for ref, t in episodes.items() if ref.startswith("acme/")])
    with store.writer("globex") as writer:
        writer.append([episodes["globex/g0"]])
    store.grant("acme", "learner", purpose="training", granted_by="acme")
    store.grant("globex", "learner", purpose="training", granted_by="globex")
    loader = AtdpLoader(
        store,
        ["acme", "globex"],
        principal="learner",
        config=LoaderConfig(rows=2, seq_len=64),
        clock=lambda: NOW,
    )
    seen = []
    for batch in loader.epoch(shuffle=False, num_epochs=1):
        refs = batch[trained_on.BATCH_KEY]
        assert refs.dtype == np.uint8 and refs.shape[0] == 2  # numeric: any array library takes it
        slots = batch["traj_index"][batch["traj_index"] >= 0]
        for k in np.unique(slots):
            ref = str(trained_on.decode_ref(refs[k]))
            seen.append(ref)
            # the slot's rows really are that trajectory: they start with its first prompt
            prompt = episodes[ref].events[0].llm.input_ids
            first_row = np.flatnonzero(batch["traj_index"] == k)[0]
            np.testing.assert_array_equal(batch["tokens"][first_row, : prompt.shape[0]], prompt)
        counts = trained_on.TrainedOn()
        counts.add_batch(batch, policy_version=3)
        assert sum(counts.pending.values()) == len(np.unique(slots))
    assert sorted(seen) == ["acme/a0", "acme/a1", "acme/a2", "globex/g0"]


def batch_of(*refs):
    return {
        trained_on.BATCH_KEY: trained_on.encode_refs(refs, len(refs) + 1),
        "traj_index": np.asarray([*range(len(refs)), -1], np.int32),
    }


def test_refs_round_trip_through_batch_bytes():
    refs = ["acme/a1", "skills/skill-xé9", "t/" + "x" * 256]
    encoded = trained_on.encode_refs(refs, 4)
    assert encoded.shape == (4, len(refs[2]))
    assert [str(trained_on.decode_ref(row)) for row in encoded[:3]] == refs
    with pytest.raises(ValueError, match="3 trajectories do not fit a batch of 2 rows"):
        trained_on.encode_refs(refs, 2)


def test_sidecars_chain_through_parents_and_survive_a_restart(tmp_path):
    run = tmp_path / "ckpt"
    counts = trained_on.TrainedOn(parent=str(tmp_path / "warm" / "0"))
    trained_on.write_step(tmp_path / "warm", 0, trained_on.TrainedOn())  # from scratch
    counts.add_batch(batch_of("acme/a1", "acme/a2"), policy_version=1)
    counts.add_batch(batch_of("acme/a1"), policy_version=2)
    trained_on.write_step(run, 10, counts, process=0)
    counts.saved(str(run / "10"))
    counts.add_batch(batch_of("skills/s1"), policy_version=3)
    trained_on.write_step(run, 20, counts, process=0)
    step = trained_on.read_step(run, 10)
    assert step.parent == str(tmp_path / "warm" / "0") and step.policy_version == 2
    assert step.trajectories == {SourceRef("acme", "a1"): 2, SourceRef("acme", "a2"): 1}
    assert trained_on.trained_on(run / "20") == {
        SourceRef("acme", "a1"): 2,
        SourceRef("acme", "a2"): 1,
        SourceRef("skills", "s1"): 1,
    }
    assert [s.path for s in trained_on.chain(run / "20")] == [
        str(run / "20"),
        str(run / "10"),
        str(tmp_path / "warm" / "0"),
    ]
    assert trained_on.steps(run) == [10, 20]
    hits = trained_on.checkpoints_trained_on([run], {SourceRef("acme", "a2")})
    assert sorted(hits) == [str(run / "10"), str(run / "20")]
    assert trained_on.checkpoints_trained_on([run], {SourceRef("skills", "s1")}) == {
        str(run / "20"): {SourceRef("skills", "s1")}
    }


def test_every_process_file_of_a_step_is_merged(tmp_path):
    for process, ref in enumerate(["acme/a1", "globex/g1"]):
        counts = trained_on.TrainedOn()
        counts.add_batch(batch_of(ref, "acme/shared"))
        trained_on.write_step(tmp_path, 5, counts, process=process)
    assert trained_on.read_step(tmp_path, 5).trajectories == {
        SourceRef("acme", "a1"): 1,
        SourceRef("globex", "g1"): 1,
        SourceRef("acme", "shared"): 2,
    }


def test_missing_or_damaged_sidecars_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trained-on sidecar for step 3"):
        trained_on.read_step(tmp_path, 3)
    assert trained_on.chain(tmp_path / "3") == []  # history unknown: an empty chain
    with pytest.raises(ValueError, match="expected a checkpoint step directory"):
        trained_on.chain(tmp_path)
    trained_on.write_step(tmp_path, 4, trained_on.TrainedOn())
    path = tmp_path / "lineage" / "4" / "process-0.jsonl"
    path.write_text(json.dumps({"format": "other"}) + "\n")
    with pytest.raises(SchemaError, match="not an atdp-trained-on v1 sidecar"):
        trained_on.read_step(tmp_path, 4)
    head = json.dumps({"format": "atdp-trained-on", "version": 1, "step": 4, "parent": None})
    path.write_text(head + '\n{"tenant": "acme"}\n')
    with pytest.raises(SchemaError, match="damaged sidecar"):
        trained_on.read_step(tmp_path, 4)
    path.write_text(head + '\n{"tenant": "a/b", "trajectory_id": "x", "batches": 1}\n')
    with pytest.raises(SchemaError, match=r"source\.tenant"):
        trained_on.read_step(tmp_path, 4)
