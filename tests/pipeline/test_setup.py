"""`Run` and `Job` on several processes: what they check before anything runs (a fake process
1 of 2, nothing joined)."""

import dataclasses

import pytest

from experiments import alfworld_sao, online_sao
from sao_jax.distributed import Job, ProcessInfo
from sao_jax.pipeline import job as pipeline_job
from sao_jax.pipeline import setup as pipeline_setup
from sao_jax.pipeline.online import OnlineJob
from sao_jax.pipeline.seed import SeedJob, with_seed
from sao_jax.seed.config import SeedConfig


def two_process_job(tmp_path):
    """A Job that says it is process 1 of 2 (nothing joined): what `Run` checks first."""
    return lambda spec, distributed=None: Job(ProcessInfo(1, 2, 4, 8, "cpu", "explicit"), None)


def test_a_batch_that_does_not_split_over_the_processes_is_refused_first(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline_job, "setup_job", two_process_job(tmp_path))
    config = alfworld_sao.parse(["--config", "micro", "--out", str(tmp_path / "out"), "rl.rows=15"])
    with pytest.raises(ValueError, match=r"rl.rows=15 does not split over 2 processes"):
        pipeline_job.run(config)
    assert not (tmp_path / "out" / "atdp").exists()


def test_experiments_without_a_multi_process_path_refuse_one(tmp_path):
    """SEED and the online runner build on `Run` but run one process: they say so."""
    job = two_process_job(tmp_path)(None)
    config = alfworld_sao.parse(["--config", "micro", "--out", str(tmp_path / "out")])
    with pytest.raises(NotImplementedError, match=r"joined 2 processes.*experiments.alfworld_sao"):
        pipeline_setup.Run(config, job)
    assert not (tmp_path / "out" / "atdp").exists()


def test_a_job_without_a_multi_process_path_refuses_one_through_its_hook(tmp_path, monkeypatch):
    """The online job (one live server, one learner) says `multi_process = False`: refused."""
    monkeypatch.setattr(pipeline_job, "setup_job", two_process_job(tmp_path))
    config = online_sao.parse(["--out", str(tmp_path / "out")])
    with pytest.raises(NotImplementedError, match=r"joined 2 processes"):
        OnlineJob(config)
    assert not (tmp_path / "out" / "atdp").exists()


def test_seed_runs_on_several_processes_past_the_hook(tmp_path, monkeypatch):
    """SEED's job has a multi-process path: the hook lets it through to the batch check."""
    monkeypatch.setattr(pipeline_job, "setup_job", two_process_job(tmp_path))
    config = alfworld_sao.parse(["--config", "micro", "--out", str(tmp_path / "out"), "rl.rows=15"])
    with pytest.raises(ValueError, match=r"rl.rows=15 does not split over 2 processes"):
        SeedJob(with_seed(config, SeedConfig()))
    assert not (tmp_path / "out" / "atdp").exists()


def test_evaluation_splits_default_to_the_envs_and_unknown_ones_are_refused(tmp_path, capsys):
    out = str(tmp_path / "out")
    config = alfworld_sao.parse(["--config", "micro", "--out", out])
    assert config.eval_splits == ("valid_seen", "valid_unseen")  # all but env.split, in order
    with pytest.raises(ValueError, match=r"eval.splits must name splits of the env.*nope"):
        dataclasses.replace(config, eval=dataclasses.replace(config.eval, splits=("nope",)))
    with pytest.raises(SystemExit) as exit_info:  # the command line says so before any run
        alfworld_sao.main(["--config", "micro", "--out", out, "eval.splits=[valid_seen,nope]"])
    assert exit_info.value.code == 2 and "eval.splits must name splits" in capsys.readouterr().err


def test_the_runs_loaders_rebuild_constrained_calls_masks_with_its_tokenizer(tmp_path):
    """Served traffic (the online job) may hold grammar-constrained calls: the run's loaders get
    a `MaskReplay` of the run's own tokenizer and the policy's vocabulary width."""
    config = alfworld_sao.parse(["--config", "micro", "--out", str(tmp_path / "out")])
    run = pipeline_setup.Run(config)
    loader = run.loader("rollouts", rows=config.rl.rows, seq_len=64)
    replay = loader.mask_replay
    assert replay is not None and replay.vocab_size == run.policy.config.vocab_size
    assert replay.words == -(-run.policy.config.vocab_size // 32)
    assert replay.tokenizer_json == run.tokenizer.backend.to_str()


def test_dagger_rounds_can_play_greedily_as_evaluation_does(tmp_path, capsys):
    """`warm_start.dagger_temperature=0`: the DAgger engine decodes greedily (the states
    evaluation reaches get relabelled); the RL engines keep `rollout.temperature`; a negative
    temperature is refused on the command line."""
    out = str(tmp_path / "out")
    config = alfworld_sao.parse(["--config", "micro", "--out", out])
    run = pipeline_setup.Run(config)
    with run.store.writer(run.tenant("dagger")) as writer:
        kwargs = dict(asynchronous=False, tenant="dagger", seed_offset=700)
        greedy = run.engine(run.publisher(), writer, temperature=0.0, **kwargs)
        sampling = run.engine(run.publisher(), writer, **kwargs)
    assert greedy.rollout.temperature == 0.0
    assert sampling.rollout.temperature == config.rollout.temperature == 1.0
    with pytest.raises(SystemExit) as exit_info:
        alfworld_sao.main(["--config", "micro", "--out", out, "warm_start.dagger_temperature=-1"])
    assert exit_info.value.code == 2
    assert "warm_start.dagger_temperature must be >= 0" in capsys.readouterr().err
