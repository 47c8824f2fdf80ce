"""SEED's teacher-student gap per skill kind, on the actions a cloned policy got right vs wrong.

The point of a hindsight skill is that, with it in context, the policy gives the right actions
more probability than it did when acting. This measures that directly for a cloned policy:

1. the policy of `run_dir` (an `experiments.alfworld_sao` / `alfworld_seed` run: its
   `warm_start/` checkpoint, what `warm_start.from_run` reads; its config.yaml gives the
   model, env and prompts) plays `episodes` episodes of `split` into a scratch ATDP store;
2. the env's rule-based analyzer (`sao_jax.seed.config.hindsight_rules`) writes each
   episode's skill as tagged sentences, and labels each action correct (the oracle expert's
   choice in the replayed state, or the winning one) or wrong;
3. every batch is re-scored with a skill of each kind alone in context ("fact",
   "failed_command", "procedure") and with the whole skill ("all"), exactly as SEED's stage 2
   does (`rescore.skill_logprobs`); the gap is `log pi(a | skill + context) - log pi(a |
   context)` on each action token.

Printed: per kind and label, the mean gap per action token, the mean gap of a whole action
(summed over its tokens), and how many actions / tokens it covers (an episode without a
sentence of a kind, e.g. no failed command, is left out of that kind). Also written to
`out_dir/skill_gap.json`.

    python benchmarks/seed_skill_gap.py run_dir=runs/alfworld_sao/X [episodes=64]
        [split=train] [max_skill_tokens=128] [out_dir=/tmp/seed_skill_gap]
        [policy_dir=runs/alfworld_seed/Y/checkpoints]   # another policy of the same model
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from sao_jax.config_cli import parse_cli

KINDS = ("fact", "failed_command", "procedure", "all")
LABELS = ("correct", "wrong")


@dataclasses.dataclass
class GapConfig:
    """Attributes:
    run_dir: the run whose cloned policy (`warm_start/`) and config (`config.yaml`) are used.
    policy_dir: measure this policy instead of the cloned one: a checkpoint directory of a run
        of the same model (e.g. a SEED run's `checkpoints/`, after stage 1 and RL); its latest
        step's `policy` is restored.
    episodes: episodes the policy plays (greedy or sampled as the run's rollout config says).
    split: the env split they are played on.
    max_skill_tokens: S, the skill-block budget (the rule analyzer keeps what fits).
    out_dir: scratch directory for the played episodes (deleted first); the JSON goes there.
    seed: offsets the games and sampling.
    """

    run_dir: str = ""
    policy_dir: str = ""
    episodes: int = 64
    split: str = "train"
    max_skill_tokens: int = 128
    out_dir: str = "/tmp/seed_skill_gap"
    seed: int = 0


def load_run_config(run_dir: Path):
    """The run's `ExperimentConfig` from its config.yaml (`alfworld_seed` or `alfworld_sao`)."""
    from experiments import alfworld_sao, alfworld_seed
    from sao_jax.config_cli import load_config

    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise SystemExit(f"error: {run_dir} holds no config.yaml: not an experiment run directory")
    if not (run_dir / "warm_start").is_dir():
        raise SystemExit(f"error: {run_dir} holds no warm_start/ checkpoint (a cloned policy)")
    text = saved.read_text()
    header = [
        ln.removeprefix("# preset: ").strip()
        for ln in text.splitlines()
        if ln.startswith("# preset: ")
    ]
    presets = alfworld_seed.PRESETS if "\nhindsight:" in text else alfworld_sao.PRESETS
    base = presets.get(header[0] if header else "tiny", next(iter(presets.values())))
    return load_config(saved, base)


def action_labels_of(batch, records, rules) -> np.ndarray:
    """[R, T] per action token: 1 correct, 0 wrong, -1 not an action token (actions in the
    order `from_batch` reads them: turn order, then each contiguous run of `loss_mask`)."""
    from sao_jax.seed.records import _mask_spans

    mask = np.asarray(batch["loss_mask"]) > 0
    traj, turn = np.asarray(batch["traj_index"]), np.asarray(batch["turn_index"])
    out = np.full(mask.shape, -1, np.int8)
    for k, record in records.items():
        labels = rules.action_labels(record.game, record.task, record.actions)
        labels += [False] * (len(record.actions) - len(labels))  # after a win: none
        position = 0
        for r in sorted(np.flatnonzero(traj == k), key=lambda r: turn[r]):
            for start, end in _mask_spans(mask[r]):
                out[r, start:end] = int(labels[position])
                position += 1
    return out


def measure(config: GapConfig) -> dict:
    from sao_jax.checkpoint import Checkpointer, checkpoint_directory
    from sao_jax.pipeline.setup import WARM_START_DIR, Run
    from sao_jax.rollout import WeightPublisher
    from sao_jax.seed import from_batch, hindsight_rules, with_task_specs
    from sao_jax.seed.kinds import check_pairs
    from sao_jax.seed.rescore import skill_logprobs
    from sao_jax.seed.templates import skill_block_ids
    from sao_jax.train import Learner

    run_dir = Path(config.run_dir)
    base = load_run_config(run_dir)
    rules = hindsight_rules(base.env.name)
    if rules is None:
        raise SystemExit(f"error: env {base.env.name!r} has no rule-based hindsight")
    out = Path(config.out_dir)
    shutil.rmtree(out, ignore_errors=True)
    experiment = dataclasses.replace(
        base,
        out_dir=str(out),
        resume=False,
        atdp_path="",
        checkpoint_dir="",
        seed=base.seed + config.seed,
        env=dataclasses.replace(base.env, split=config.split),
        progress=False,
        tensorboard=False,
    )
    run = Run(experiment)
    experiment = run.config  # row lengths left at 0 (the presets) sized as the experiment does
    policy_dir = checkpoint_directory(config.policy_dir or run_dir / WARM_START_DIR)
    with Checkpointer(policy_dir, create=False) as saved:
        run.policy = saved.restore({"policy": run.policy}).items["policy"]
    tokenizer = run.tokenizer
    publisher = WeightPublisher()
    publisher.publish(run.policy, 0)
    with run.store.writer("gap") as writer:
        engine = run.engine(publisher, writer, asynchronous=False, tenant="gap", seed_offset=7)
        played = engine.generate(config.episodes)
    overhead = len(skill_block_ids(tokenizer, "x")) - len(tokenizer.encode("x"))
    budget = config.max_skill_tokens - overhead
    learner = Learner(experiment.learner, run.policy)
    loader = run.loader("gap", rows=experiment.rl.rows, seq_len=experiment.rl.seq_len)
    sums = {(k, lab): [0.0, 0, 0] for k in KINDS for lab in LABELS}  # gap, tokens, actions
    skill_tokens = {k: [] for k in KINDS}
    for batch in loader.epoch(shuffle=False, num_epochs=1):
        records = with_task_specs(
            from_batch(batch, tokenizer, think=experiment.rollout.think, env=base.env.name),
            run.store,
        )
        labels = action_labels_of(batch, records, rules)
        student = learner.policy_logprobs(batch)
        # each episode's sentences, most important first (what a budget keeps)
        parts = {
            k: check_pairs(rules.hindsight(r.game, r.task, r.actions, r.success), str(k))
            for k, r in records.items()
        }
        for kind in KINDS:
            texts = {}
            for k, found in parts.items():
                chosen = [p for p in found if kind in ("all", p.kind)]
                text = _fit(chosen, tokenizer, budget)
                if text:
                    texts[k] = text
            if not texts:
                continue
            blocks = {k: skill_block_ids(tokenizer, t) for k, t in texts.items()}
            skill_tokens[kind] += [len(b) for b in blocks.values()]
            teacher, _ = skill_logprobs(
                learner.policy_logprobs, batch, blocks, config.max_skill_tokens
            )
            covered = np.isin(np.asarray(batch["traj_index"]), list(texts))[:, None]
            gap = teacher - student
            for value, label in ((1, "correct"), (0, "wrong")):
                tokens = (labels == value) & covered
                entry = sums[(kind, label)]
                entry[0] += float(gap[tokens].sum())
                entry[1] += int(tokens.sum())
                # an action is a run of its label's tokens
                entry[2] += int((tokens & ~np.pad(tokens[:, :-1], ((0, 0), (1, 0)))).sum())
    rows = []
    for kind in KINDS:
        for label in LABELS:
            gap_sum, tokens, actions = sums[(kind, label)]
            rows.append(
                {
                    "kind": kind,
                    "actions": label,
                    "gap_per_token": gap_sum / tokens if tokens else None,
                    "gap_per_action": gap_sum / actions if actions else None,
                    "num_actions": actions,
                    "num_tokens": tokens,
                    "block_tokens_mean": float(np.mean(skill_tokens[kind]))
                    if skill_tokens[kind]
                    else None,
                }
            )
    result = {
        "run_dir": str(run_dir),
        "split": config.split,
        "episodes": played["episodes"],
        "success_rate": played["success_rate"],
        "rules": f"{rules.env}:{rules.version}",
        "rows": rows,
        "expert_replies": expert_reply_gap(run, learner, config.max_skill_tokens),
    }
    (out / "skill_gap.json").write_text(json.dumps(result, indent=2))
    return result


def expert_reply_gap(run, learner, max_skill_tokens: int) -> dict:
    """Does the teacher know better where the student did not? The oracle expert's reply in
    every state the policy played (`relabel_with_expert`), scored with the episode's whole
    skill block in front of the prompt (`with_skill_in_context`, as stage 2 injects it) and
    without; per reply (summed over its tokens): the mean gap, the mean log-prob of each, the
    same over the replies the plain policy gives less than 1/e, and there the share the
    skill-reading policy gives more than 1/2. `by_kind`: the same with a block of only that
    kind's sentences (an episode without one is scored without a block: gap 0) -- which part
    of a skill carries what the teacher knows (a fact about this episode's objects, or a rule
    that holds in every game)."""
    from sao_jax.pipeline.relabel import relabel_with_expert
    from sao_jax.seed import episode_records, make_analyzer, skill_block_ids
    from sao_jax.seed.config import SeedConfig
    from sao_jax.seed.skill_acting import with_skill_in_context

    experiment, tokenizer = run.config, run.tokenizer
    reader = run.store.reader("gap", principal="gap")
    reader.refresh()
    played = [reader.read(i) for i in reader.trajectory_ids()]
    analyzer = make_analyzer(
        "rule", config=SeedConfig(max_skill_tokens=max_skill_tokens), tokenizer=tokenizer,
        env=experiment.env.name,
    )  # fmt: skip
    records, _ = episode_records(played)
    skills = {s.trajectory_id: s for s in analyzer.analyze(records)}
    overhead = len(skill_block_ids(tokenizer, "x")) - len(tokenizer.encode("x"))
    budget = max_skill_tokens - overhead

    def oracle(trajectory, tenant: str):
        return relabel_with_expert(
            trajectory, tokenizer, think=experiment.rollout.think,
            max_new_tokens=experiment.rollout.max_new_tokens, tenant=tenant, expert="oracle",
        )  # fmt: skip

    texts: dict[str, dict[str, str]] = {kind: {} for kind in KINDS}
    plain = []
    for trajectory in played:
        skill = skills.get(trajectory.trajectory_id)
        relabelled = oracle(trajectory, "gap-expert")
        if skill is None or relabelled is None:
            continue
        plain.append(relabelled)
        texts["all"][trajectory.trajectory_id] = skill.text
        for kind in KINDS[:-1]:
            texts[kind][trajectory.trajectory_id] = _fit(
                [p for p in skill.parts if p.kind == kind], tokenizer, budget
            )
    with run.store.writer("gap-expert") as writer:
        writer.append(plain)
    seq_len = experiment.rl.seq_len
    without = _reply_logprobs(run, learner, "gap-expert", seq_len)
    before = np.array([lp for _, lp in without])
    unlikely = before < -1.0

    def scored(kind: str) -> dict:
        tenant = f"gap-expert-{kind}"
        skilled = []
        for trajectory in played:
            text = texts[kind].get(trajectory.trajectory_id)
            if text is None:
                continue
            relabelled = oracle(trajectory, tenant)  # the same relabel, in its own tenant
            block = skill_block_ids(tokenizer, text) if text else []
            skilled.append(
                with_skill_in_context(relabelled, block, max_skill_tokens=max_skill_tokens)
                if block
                else relabelled
            )
        with run.store.writer(tenant) as writer:
            writer.append(skilled)
        with_skill = _reply_logprobs(run, learner, tenant, seq_len + max_skill_tokens)
        if [r for r, _ in without] != [r for r, _ in with_skill]:
            raise RuntimeError("expert_reply_gap: the two replays do not hold the same replies")
        after = np.array([lp for _, lp in with_skill])
        return {
            "replies": int(before.size),
            "gap_per_reply": float((after - before).mean()),
            "logp_without": float(before.mean()),
            "logp_with": float(after.mean()),
            "unlikely_replies": int(unlikely.sum()),
            "unlikely_gap_per_reply": float((after - before)[unlikely].mean())
            if unlikely.any()
            else None,
            "unlikely_share_above_half": float((after[unlikely] > np.log(0.5)).mean())
            if unlikely.any()
            else None,
        }

    result = scored("all")
    result["by_kind"] = {kind: scored(kind) for kind in KINDS[:-1]}
    return result


def _reply_logprobs(run, learner, tenant: str, seq_len: int) -> list[tuple[tuple, float]]:
    """(reply tokens, summed log-prob) of every reply in `tenant`, in stored order."""
    loader = run.loader(tenant, rows=run.config.rl.rows, seq_len=seq_len)
    out = []
    for batch in loader.epoch(shuffle=False, num_epochs=1):
        logp = np.asarray(learner.policy_logprobs(batch))
        mask = np.asarray(batch["loss_mask"]) > 0
        tokens, traj = np.asarray(batch["tokens"]), np.asarray(batch["traj_index"])
        turn = np.asarray(batch["turn_index"])
        order = sorted(np.flatnonzero(traj >= 0), key=lambda r: (traj[r], turn[r]))
        out += [(tuple(tokens[r][mask[r]].tolist()), float(logp[r][mask[r]].sum())) for r in order]
    return out


def _fit(parts, tokenizer, budget: int) -> str:
    """The skill text of `parts` within `budget` tokens (most important first, as the
    analyzer gives them; a sentence that does not fit is left out)."""
    from sao_jax.seed.kinds import fit_parts, parts_text

    kept = fit_parts(parts, lambda text: len(tokenizer.encode(text)), budget)
    return parts_text(kept)


def main(argv: list[str]) -> dict:
    config = parse_cli(argv, {"default": GapConfig()}, prog="seed_skill_gap.py", save=False)
    if not config.run_dir:
        raise SystemExit("error: give run_dir=DIR (a run with warm_start/ and config.yaml)")
    from sao_jax.metrics import summary_table

    result = measure(config)
    print(
        f"{result['episodes']} episodes of {result['split']} (success {result['success_rate']:.3f}), "
        f"rules {result['rules']}; gap = log pi(a | skill + context) - log pi(a | context)"
    )
    print(summary_table(result["rows"], floatfmt=".3f"))
    expert = result["expert_replies"]
    print(
        f"the oracle's replies in those states ({expert['replies']}), whole skill in context: "
        f"gap {expert['gap_per_reply']:+.3f} nats a reply (log-prob {expert['logp_without']:.3f}"
        f" -> {expert['logp_with']:.3f}); where the policy gives it < 1/e "
        f"({expert['unlikely_replies']}): gap {_signed(expert['unlikely_gap_per_reply'])}, "
        f"share above 1/2 with the skill {_signed(expert['unlikely_share_above_half'], '.2f')}"
    )
    for kind, part in expert["by_kind"].items():
        print(
            f"  only its {kind} sentences: gap {part['gap_per_reply']:+.3f} nats a reply; where "
            f"the policy gives it < 1/e: {_signed(part['unlikely_gap_per_reply'])}, share above "
            f"1/2 {_signed(part['unlikely_share_above_half'], '.2f')}"
        )
    return result


def _signed(value, spec: str = "+.3f") -> str:
    return "n/a" if value is None else format(value, spec)


if __name__ == "__main__":
    main(sys.argv[1:])
