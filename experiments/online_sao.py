"""Online SAO from live traffic: an agent uses the policy through an OpenAI endpoint, SAO learns.

    python -m experiments.online_sao --out runs/online warm_start.from_run=runs/alfworld_sao/X
    python -m experiments.online_sao --config micro --out /tmp/online      # seconds: smoke test
    python -m experiments.online_sao --out runs/online --resume online.policy_steps=60

Phases: warm start (behaviour cloning on expert demos, or `warm_start.from_run` of an
`alfworld_sao` run) -> greedy evaluation -> online RL -> greedy evaluation. Online RL: the
policy is served by `serving` (gateway, router, data proxy, worker in this process, on a
loopback port); an agent of `env.name` (ALFWorld) in a separate process (`sao_jax.pipeline.online_agent`) plays
through the official `openai` client and posts rewards on `/rl`; the data proxy records every
call into `DIR/atdp` (tenant `agent.tenant`); the SAO learner reads that live buffer with the
ATDP loader's stream (staleness filtered by policy version) and publishes each update, which
the worker swaps in (`worker.follow(publisher)`). The first `learner.critic.warmup_steps`
iterations train only the critic, on served data too. Outputs as `alfworld_sao`, plus
`DIR/agent/` (episodes.jsonl, stats.json, stderr.log) and serving figures in summary.json.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading

from experiments import alfworld_sao
from sao_jax.pipeline import cli
from sao_jax.pipeline.config import EvalSpec
from sao_jax.pipeline.online_config import AgentSpec, OnlineConfig, OnlineSpec, ServingSpec


def tiny() -> OnlineConfig:
    """The 2-core CPU demo: alfworld_sao's tiny policy (clone it, or reuse a run's clone)."""
    base = alfworld_sao.tiny()
    return OnlineConfig(
        **alfworld_sao.policy_parts(base),
        serving=ServingSpec(num_slots=16),
        agent=AgentSpec(concurrency=12),
        online=OnlineSpec(policy_steps=40, rows=64, seq_len=256, max_staleness=2),
        eval=base.eval,
    )


def micro() -> OnlineConfig:
    """Smoke test: a barely cloned micro model, short games, two policy steps."""
    base = alfworld_sao.micro()
    return OnlineConfig(
        model=base.model,
        rollout=base.rollout,
        env=base.env,
        learner=dataclasses.replace(
            base.learner, critic=dataclasses.replace(base.learner.critic, warmup_steps=0)
        ),
        warm_start=dataclasses.replace(base.warm_start, demo_episodes=4, steps=2, dagger_rounds=0),
        serving=ServingSpec(num_slots=4, decode_steps=4, max_prefill_batch=1),  # few compiles
        agent=AgentSpec(concurrency=4, stop_timeout_s=20.0),
        # staleness 0: the second batch can only hold calls served with the first update
        online=OnlineSpec(policy_steps=2, rows=8, seq_len=320, max_staleness=0, idle_timeout_s=1.0),
        eval=EvalSpec(num_games=2, num_envs=2),
        checkpoint_every=1,
    )


TITLE = __doc__.split("\n")[0]
PRESETS = {"tiny": tiny(), "micro": micro()}


def parse(argv: list[str] | None = None):
    """The run's config from the command line (`sao_jax.pipeline.cli.parse`)."""
    return cli.parse(
        argv,
        PRESETS,
        prog="python -m experiments.online_sao",
        runs_dir="runs/online_sao",
        description=TITLE,
    )


def main(argv: list[str] | None = None) -> dict:
    """Parse the command line, run, print the summary table; returns the summary."""
    config = parse(argv)
    from sao_jax.pipeline.online import run  # heavy imports once the command line is valid

    interrupted = threading.Event()
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main_thread else None
    if previous is signal.default_int_handler:  # a foreground job (a background one ignores it)

        def on_sigint(signum, frame):
            # Python raises a handler's exception in whatever frame runs, and one raised inside
            # a gc callback (JAX registers one) is printed and dropped: remember it as well.
            interrupted.set()
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
    try:
        summary = run(config)
        if interrupted.is_set():  # the KeyboardInterrupt was swallowed; the run ended anyway
            raise KeyboardInterrupt
        return summary
    except KeyboardInterrupt:  # the agent and the server are already stopped
        print(f"interrupted; resume with --out {config.out_dir} --resume", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if previous is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    main()
