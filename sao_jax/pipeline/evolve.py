"""The evolution experiment: a live ALFWorld deployment improved by the control plane, a round
at a time (presets and command line: `experiments.evolve_alfworld`).

A cloned policy (`warm_start.from_run`, or cloned here as `alfworld_sao` does) is served by the
one-process server (`OnlineServer`: gateway, router, data proxy, worker on loopback). Each
round, for every tenant: the worker is given the tenant's policy (its composite's `PolicyRef`,
`PolicyBook.serve`) and the tenant's agent plays its games through the gateway (the official
`openai` client; `evolve_live`). Then, per tenant: `ControlPlane.watch` rolls back a live
regression of its last promotion; otherwise `ControlPlane.run_round` analyses the round's
windows of every tenant, proposes candidates (memory and skill notes by the rule-based SEED
analyzer, harness templates, a policy update: SAO on the tenant's window), gates them by replay
of the window's games and re-scoring of its known-good actions, chooses and promotes. The next
round's window measures what shipped. One more window after the last round measures the last
decision.

On purpose: in `evolve.plant_round` the first tenant's gate also sees two planted harmful
candidates (`evolve_planted`); at the start of `evolve.regression_round` a harmful composite is
promoted to the first tenant past the gate, for the watch to roll back. At the end, a candidate
learned from the first tenant is offered to the second: governance refuses it.

Outputs in DIR: metrics.jsonl (+ tensorboard/), live/ (the gateway's ATDP store, composites and
decision log), agents/ (episodes per tenant and round), evolution.png, summary.json and the
round table on the terminal (`evolve_report`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from atdp_io import AtdpStore
from sao_jax.metrics import MetricsWriter, ProgressBar
from sao_jax.pipeline.evolve_config import EvolveConfig
from sao_jax.pipeline.evolve_live import Window, play_window, tenant_games
from sao_jax.pipeline.evolve_planted import corrupted_policy, format_breaking_edit, is_planted
from sao_jax.pipeline.evolve_policies import PolicyBook, copied, window_trainer
from sao_jax.pipeline.evolve_report import (
    audit_checks,
    cross_tenant_check,
    round_entry,
    summarize,
    write_report,
)
from sao_jax.pipeline.online_agent import AgentConfig
from sao_jax.pipeline.online_serving import OnlineServer
from sao_jax.pipeline.setup import Run, env_splits
from sao_jax.pipeline.warm_start import warm_start
from sao_jax.seed.analyzers import RuleBasedAlfworldAnalyzer
from serving.control.candidates import Candidate
from serving.control.deploy import promote
from serving.control.gate import GateConfig
from serving.control.plane import ControlPlane
from serving.control.rescoring import model_scorer
from serving.control.window import WindowSpec
from serving.gateway.app import GATEWAY
from serving.worker.config import WorkerConfig


class Evolution:
    """One run: the server, the policies, the control plane and the rounds' records."""

    def __init__(self, config: EvolveConfig):
        self.config, self.spec = config, config.evolve
        self.began = time.perf_counter()
        self.seconds = dict.fromkeys(("warm_start", "windows", "watch", "control_plane"), 0.0)
        self.run = Run(config.experiment())
        self.out = self.run.out
        self.log = MetricsWriter(self.out, tensorboard=config.tensorboard)
        # from_run: the saved clone (its saved evaluation as is); otherwise clone here
        warm_start(self.run, self.log, reevaluate=False)
        self.seconds["warm_start"] = time.perf_counter() - self.began
        exp, tokenizer = self.run.config, self.run.tokenizer
        self.book = PolicyBook(
            copied(self.run.policy), tokenizer, max_new_tokens=exp.rollout.max_new_tokens
        )
        self.buffer = self.out / "live"
        self.server = OnlineServer(
            copied(self.run.policy),
            tokenizer,
            buffer=str(self.buffer),
            worker=WorkerConfig(
                preset=None,
                num_slots=config.serving.num_slots,
                context_length=exp.rollout.max_context_tokens,
                decode_steps=config.serving.decode_steps,
                max_prefill_batch=config.serving.max_prefill_batch,
                request_timeout_s=config.serving.request_timeout_s,
            ),
            model_id=config.serving.model_id,
            policy_version=0,
        )
        trainer = {"book": self.book, "learner": exp.learner, "rows": exp.rl.rows,
                   "seq_len": exp.rl.seq_len, "steps": self.spec.policy_steps,
                   "learning_rate": self.spec.policy_learning_rate,
                   "fit_baseline": self.spec.policy_fit_baseline,
                   "critic_warmup_steps": self.spec.policy_critic_warmup}  # fmt: skip
        self.train_fn = window_trainer(**trainer, name="sao_window")
        self.corrupt_fn = window_trainer(**trainer, name="sao_flipped", reward_sign=-1.0)
        self.scorer = model_scorer(tokenizer, self.book.model_for) if self.spec.rescore else None
        pools = tenant_games(
            len(self.spec.tenants),
            self.spec.games_per_round,
            env_splits(exp)[exp.env.split],
            exp.env.seed,
        )
        self.games = dict(zip(self.spec.tenants, pools, strict=True))
        self.plane: ControlPlane | None = None
        self.entries: list[dict[str, Any]] = []
        self.planted: dict[str, Candidate] = {}
        self.learned: dict[str, Candidate] = {}  # tenant -> its latest shipped (else proposed)

    # -- one tenant's window ---------------------------------------------------------------------

    def agent_config(self, tenant: str) -> AgentConfig:
        exp = self.run.config
        rollout, env = exp.rollout, exp.env
        return AgentConfig(
            url=self.server.url, tenant=tenant, concurrency=self.spec.concurrency,
            env=env.name, split=env.split, size=env.size, phrasing=env.phrasing,
            max_steps=env.max_steps, seed=env.seed, history_length=rollout.history_length,
            think=rollout.think, memory_line=rollout.memory_line,
            prompt_style=rollout.prompt_style,
            win_reward=rollout.win_reward, invalid_reply_penalty=rollout.invalid_reply_penalty,
            inadmissible_penalty=rollout.inadmissible_penalty,
            repeat_penalty=rollout.repeat_penalty,
            max_tokens=rollout.max_new_tokens, temperature=self.spec.temperature,
            request_timeout_s=self.config.serving.request_timeout_s,
        )  # fmt: skip

    def play(self, round_index: int, tenant: str) -> Window:
        """The tenant's games under its current composite (its policy on the worker first)."""
        current = self.plane.store.current(tenant)
        self.book.serve(self.server.worker, current.spec.policy)
        log = self.out / "agents" / f"{tenant}-round{round_index}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        return play_window(
            self.agent_config(tenant), self.server.admin_key, self.games[tenant], log
        )

    # -- on purpose ------------------------------------------------------------------------------

    def plant(self, tenant: str, windows: list[WindowSpec]) -> list[Candidate]:
        """The planted harmful candidates for `tenant`'s gate this round."""
        described = {"windows": [w.to_json() for w in windows]}
        trajectories = self.plane.read(windows)
        current = self.plane.store.current(tenant).spec.policy
        planted = [
            format_breaking_edit(tenant, described),
            corrupted_policy(tenant, described, trajectories, current, self.corrupt_fn),
        ]
        self.planted.update({c.surface: c for c in planted})
        return planted

    def inject_regression(self, tenant: str) -> dict[str, Any]:
        """Promote a harmful composite past the gate (the planted corrupted policy when there
        is one, else the format-breaking edit)."""
        candidate = self.planted.get("policy") or self.planted.get("harness")
        if candidate is None:
            candidate = format_breaking_edit(tenant, {})
        made = promote(
            self.plane.store, tenant, candidate, audit=self.plane.audit,
            canaries=self.plane.canaries, reason="injected regression: promoted past the gate",
        )  # fmt: skip
        return {"candidate": candidate.id, "surface": candidate.surface, "version": made.version}

    # -- the rounds ------------------------------------------------------------------------------

    def round(self, index: int) -> list[dict[str, Any]]:
        spec, tenants = self.spec, self.spec.tenants
        measuring_only = index > spec.rounds
        injected = None
        if index == spec.regression_round:
            injected = self.inject_regression(tenants[0])
        clock = time.perf_counter()
        windows = {t: self.play(index, t) for t in tenants}
        self.seconds["windows"] += time.perf_counter() - clock
        clock = time.perf_counter()
        watched = {
            t: self.plane.watch(
                t, min_sessions=spec.watch_min_sessions, confidence=spec.gate_confidence
            )
            for t in tenants
        }
        self.seconds["watch"] += time.perf_counter() - clock
        # a window served by a version just rolled back is nobody's evidence
        healthy = [t for t in tenants if watched[t].rolled_back_to is None]
        specs = [WindowSpec(t, since=windows[t].began) for t in healthy]
        entries = []
        for tenant in tenants:
            clock, result = time.perf_counter(), None
            if tenant in healthy and not measuring_only:
                planting = index == spec.plant_round and tenant == tenants[0]
                result = self.plane.run_round(
                    tenant, specs, analyzer=RuleBasedAlfworldAnalyzer(), train_fn=self.train_fn,
                    scorer=self.scorer, agent=self.book.reply,
                    extra=self.plant(tenant, specs) if planting else [],
                )  # fmt: skip
                self.remember(tenant, result)
            self.seconds["control_plane"] += time.perf_counter() - clock
            entry = round_entry(
                index, windows[tenant], watched[tenant], result, is_planted,
                injected if tenant == tenants[0] else None,
            )  # fmt: skip
            entries.append(entry)
        return entries

    def remember(self, tenant: str, result) -> None:
        """The candidate to offer another tenant at the end: the tenant's latest shipped one,
        else its latest proposed one that is not planted."""
        if result.decision.chosen is not None:
            self.learned[tenant] = result.decision.chosen.candidate
            return
        proposed = [c for c in result.candidates if c.surface != "noop" and not is_planted(c)]
        if proposed and tenant not in self.learned:
            self.learned[tenant] = proposed[-1]

    def execute(self) -> dict:
        spec = self.spec
        bar = ProgressBar(
            spec.rounds + 1,
            desc="evolution rounds",
            keys=("live/mean_success", "gate/refused", "rollbacks"),
            disable=not self.config.progress,
            unit="round",
        )
        try:
            self.server.start()
            gateway = self.server.parts.app[GATEWAY]
            self.plane = ControlPlane(
                gateway.composites,
                AtdpStore.open(str(self.buffer)),
                canaries=gateway.canaries,
                gate_config=GateConfig(
                    confidence=spec.gate_confidence, replay_episodes=spec.replay_episodes
                ),
            )
            for index in range(1, spec.rounds + 2):
                entries = self.round(index)
                self.entries += entries
                metrics = _round_metrics(entries, self.entries)
                self.log.write(index, metrics)
                bar.update(1, metrics=metrics)
            source, target = spec.tenants[0], spec.tenants[1]
            cross = cross_tenant_check(self.plane, self.learned.get(source), target)
            checks = audit_checks(self.plane, self.book, spec.tenants)
        finally:
            bar.close()
            self.server.stop()
            self.log.close()
        self.seconds["total"] = time.perf_counter() - self.began
        summary = summarize(self.config, self.entries, cross, checks, seconds=self.seconds)
        write_report(self.out, summary)
        return summary


def _round_metrics(entries: list[dict], everything: list[dict]) -> dict[str, float]:
    metrics = {f"live/{e['tenant']}/success": e["live_success"] for e in entries}
    metrics["live/mean_success"] = sum(e["live_success"] for e in entries) / len(entries)
    metrics["gate/refused"] = float(sum(len(e["refused"]) for e in entries))
    metrics["gate/passed"] = float(sum(len(e["passed"]) for e in entries))
    metrics["rollbacks"] = float(sum(e["rolled_back_to"] is not None for e in everything))
    metrics["promotions"] = float(sum(e["shipped"] is not None for e in entries))
    return metrics


def run(config: EvolveConfig) -> dict:
    """Run the evolution experiment; returns the summary also written to DIR/summary.json."""
    config = dataclasses.replace(config, out_dir=str(Path(config.out_dir)))
    return Evolution(config).execute()
