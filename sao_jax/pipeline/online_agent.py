"""An agent that knows nothing of the learner: it only talks to an OpenAI endpoint.

    SAO_ADMIN_KEY=... python -m sao_jax.pipeline.online_agent --url http://127.0.0.1:8000 \
        --tenant online --concurrency 8 --log agent/episodes.jsonl --stats agent/stats.json

Each of `--concurrency` threads plays games of `--env` (ALFWorld by default; any registered
`TextEnv`, spoken to through its harness: `PromptedEnv`) one after another. A game is one gateway
session (`POST /rl/start_session`, stdlib `GatewayClient`); every turn is one
`chat.completions.create` call of the official `openai` client with the harness prompt as a
single user message (the windowed layout the policy was cloned on: the prompt carries the last
`--history-length` steps). Rewards go through `/rl/set_reward` on the completion that earned
them, before the session ends, so the learner's stream sees them -- the rewards the rollout
engine gives the same turn (`posted_rewards`): `--win-reward` (source "env") on the winning
reply, `--invalid-reply-penalty` (source "format") on a malformed one, `--inadmissible-penalty`
(source "format") on a well-formed command the env refuses, and `--repeat-penalty` (source
"novelty") on an admitted command whose answer the game had already shown.
`/rl/end_session` closes the trajectory with the outcome.

SIGTERM / SIGINT stop the agent after the calls in flight: games not finished are abandoned
(their sessions stay open, so they never reach training), the stats are written and it exits
0. It also stops when its parent process dies, so it never outlives an `online_sao` run.
Exit status 1: `--max-consecutive-errors` calls failed in a row (the stats name the last error).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import openai

from sao_jax.config_cli import parse_cli
from sao_jax.envs import EnvConfig, PromptOptions, RewardWeights, TaskSampler
from sao_jax.envs.base import reward_sources
from sao_jax.envs.prompted import PromptedEnv
from serving.gateway.client import GatewayClient

ADMIN_KEY_ENV = "SAO_ADMIN_KEY"


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What the agent plays and how it decodes.

    Attributes:
      url: the gateway (http://host:port).
      tenant: the tenant whose sessions the agent starts (the learner reads this partition).
      concurrency: games played at once (threads; one session each).
      episodes: stop after this many finished games (0: until stopped).
      env: the env it plays (a registered `TextEnv`: `sao_jax.envs.EnvConfig.name`).
      split, size, phrasing, max_steps, seed: its tasks (`EnvConfig`; size and phrasing are
        ALFWorld's); seed orders them.
      history_length, think, memory_line, prompt_style: its prompts (`PromptOptions`).
      win_reward, invalid_reply_penalty, inadmissible_penalty: its rewards (`RewardWeights`,
        as `RolloutConfig` gives them offline); repeat_penalty: the novelty penalty
        (`RolloutConfig.repeat_penalty`). A run passes its rollout's values, so online turns
        earn what offline turns earn.
      max_tokens, temperature, top_p: decoding of every call.
      request_timeout_s: one completion's HTTP timeout (first calls wait for XLA compiles).
      max_retries: the openai client's retries of 429 / 5xx / connection errors.
      max_consecutive_errors: give up (exit 1) after this many failed games in a row.
      stop_grace_s: once stopped, how long calls in flight may finish before their games are
        abandoned and the agent exits.
    """

    url: str
    tenant: str = "online"
    concurrency: int = 8
    episodes: int = 0
    env: str = "alfworld"
    split: str = "train"
    size: str = "small"
    phrasing: str = "0.4.2"
    max_steps: int = 20
    seed: int = 0
    history_length: int = 1
    think: bool = False
    memory_line: bool = False
    prompt_style: str = "paper"
    win_reward: float = 10.0
    invalid_reply_penalty: float = -0.1
    inadmissible_penalty: float = 0.0
    repeat_penalty: float = 0.0
    max_tokens: int = 12
    temperature: float = 1.0
    top_p: float = 1.0
    request_timeout_s: float = 600.0
    max_retries: int = 8
    max_consecutive_errors: int = 20
    stop_grace_s: float = 5.0

    def __post_init__(self):
        for name in ("concurrency", "max_steps", "max_tokens", "max_consecutive_errors"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.episodes < 0 or self.max_retries < 0 or self.history_length < 0:
            raise ValueError("AgentConfig.episodes, max_retries, history_length must be >= 0")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"AgentConfig.url must be http(s)://host:port, got {self.url!r}")
        self.env_config  # noqa: B018  (the env, its split and max_steps checked here)

    @property
    def env_config(self) -> EnvConfig:
        """The tasks the agent plays, as the rollout's `EnvConfig`."""
        return EnvConfig(
            name=self.env, split=self.split, size=self.size, phrasing=self.phrasing,
            max_steps=self.max_steps, seed=self.seed,
        )  # fmt: skip


class AgentStats:
    """Counters shared by the agent's threads (and the episode log they append to)."""

    def __init__(self, log_path: Path | None):
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(
            ("requests", "episodes", "won", "env_steps", "invalid_replies", "refused_commands",
             "repeated_observations", "rewards_posted", "errors", "abandoned",
             "truncated_context", "completion_tokens", "rate_limited"), 0,
        )  # fmt: skip
        self.max_policy_version = -1
        self.last_error = ""
        self.consecutive_errors = 0
        self.started = time.time()
        self._log = open(log_path, "a", encoding="utf-8") if log_path else None  # noqa: SIM115

    def add(self, **counts: int) -> None:
        with self._lock:
            for key, n in counts.items():
                self.counts[key] += n

    def saw_version(self, version: int) -> None:
        with self._lock:
            self.max_policy_version = max(self.max_policy_version, version)

    def error(self, error: BaseException) -> int:
        """Count a failed game; returns how many failed in a row."""
        with self._lock:
            self.counts["errors"] += 1
            self.consecutive_errors += 1
            self.last_error = f"{type(error).__name__}: {error}"
            return self.consecutive_errors

    def episode(self, record: dict[str, Any]) -> int:
        """Log one finished game; returns how many games are finished now."""
        with self._lock:
            self.consecutive_errors = 0
            self.counts["episodes"] += 1
            self.counts["won"] += int(record["won"])
            if self._log is not None:
                self._log.write(json.dumps(record) + "\n")
                self._log.flush()
            return self.counts["episodes"]

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            seconds = time.time() - self.started
            return {
                **self.counts,
                "success_rate": self.counts["won"] / max(self.counts["episodes"], 1),
                "requests_per_second": self.counts["requests"] / max(seconds, 1e-9),
                "max_policy_version": self.max_policy_version,
                "last_error": self.last_error,
                "seconds": seconds,
            }

    def close(self) -> None:
        with self._lock:  # a game still finishing after this is not logged
            if self._log is not None:
                self._log.close()
                self._log = None


class Agent:
    """Plays games through the gateway on `config.concurrency` threads until stopped."""

    def __init__(self, config: AgentConfig, admin_key: str, *, log_path: Path | None = None):
        self.config = config
        self.gateway = GatewayClient(config.url, admin_key, timeout_s=config.request_timeout_s)
        self.prompt_options = PromptOptions(
            history_length=config.history_length,
            think=config.think,
            memory_line=config.memory_line,
            style=config.prompt_style,
        )
        self.reward_weights = RewardWeights(
            win_reward=config.win_reward,
            invalid_reply_penalty=config.invalid_reply_penalty,
            inadmissible_penalty=config.inadmissible_penalty,
        )
        self.env = config.env_config
        splits = self.env.env_class.splits
        self.games = TaskSampler(config.split, splits[config.split], seed=config.seed)
        self._games_lock = threading.Lock()
        self.stop = threading.Event()
        self.stats = AgentStats(log_path)
        self.failed = False

    def next_game(self) -> int | None:
        """The game a thread plays next; None: none left, the thread stops."""
        with self._games_lock:
            return self.games.next_index()

    def episode_seed(self, game: int, thread_index: int, played: int) -> int:
        """The sampling seed of the `played`-th game (`game`) a thread finishes playing."""
        return self.config.seed * 1_000_003 + thread_index * 7_919 + played * 1_000

    def run(self) -> dict[str, Any]:
        """Play until stopped, the episode budget is spent or errors pile up; the stats."""
        threads = [
            threading.Thread(target=self._play_forever, args=(i,), name=f"agent-{i}", daemon=True)
            for i in range(self.config.concurrency)
        ]
        for thread in threads:
            thread.start()
        while not self.stop.wait(0.5) and any(t.is_alive() for t in threads):
            pass
        # calls in flight get a grace period, then are abandoned with their games (the
        # threads are daemons): a reply stuck behind an XLA compile must not delay the exit
        deadline = time.monotonic() + self.config.stop_grace_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.stats.add(abandoned=sum(t.is_alive() for t in threads))
        self.stats.close()
        return self.stats.snapshot()

    def _play_forever(self, thread_index: int) -> None:
        played = 0
        while not self.stop.is_set():
            game = self.next_game()
            if game is None:
                return
            try:
                record = self.play_episode(game, self.episode_seed(game, thread_index, played))
            except Exception as error:  # any failure of a game: count it, go on
                if self.stats.error(error) >= self.config.max_consecutive_errors:
                    self.failed = True
                    self.stop.set()
                else:
                    self.stop.wait(1.0)
                continue
            played += 1
            if record is None:
                continue
            finished = self.stats.episode(record)
            if self.config.episodes and finished >= self.config.episodes:
                self.stop.set()

    def play_episode(self, game: int, seed: int) -> dict[str, Any] | None:
        """One game as one session; the episode record, or None when stopped mid-game (the
        session is then left open: an unfinished game must not train as a lost one)."""
        config = self.config
        env = self.env.make_envs(1)[0]
        harness = PromptedEnv(env, self.prompt_options, self.reward_weights)
        prompt, info = harness.reset(game)
        # what `env_from_task_spec` replays the game from (ALFWorld: size, phrasing, game_id)
        task = {
            "env": config.env, "split": config.split, "index": game, **env.task_spec(),
            "max_steps": config.max_steps, "layout": "windowed",
            "history_length": config.history_length, "think": config.think,
            "memory_line": config.memory_line, "prompt_style": config.prompt_style,
            "task_type": info["task_type"], "game_id": info["task_id"], "source": "online_agent",
        }  # fmt: skip
        session = self.gateway.start_session(
            config.tenant, task_id=f"{config.env}-{config.split}-g{game}", task=task
        )
        client = session.openai(max_retries=config.max_retries, timeout=config.request_timeout_s)
        calls, truncated, won, done = [], None, False, False
        while not done:
            if self.stop.is_set():
                self.stats.add(abandoned=1)
                return None
            try:
                reply = client.chat.completions.create(
                    model=session.model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=config.max_tokens,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    seed=seed + len(calls),
                )
            except openai.RateLimitError as error:
                # the worker's staleness capacity is spent until the learner publishes: a
                # user would wait too, so the game goes on with the same turn
                self.stats.add(rate_limited=1)
                self.stop.wait(_retry_after(error))
                continue
            except openai.BadRequestError as error:
                if error.code != "context_length_exceeded":
                    raise
                truncated = "context"  # as the rollout engine ends such an episode
                self.stats.add(truncated_context=1)
                break
            version = int((reply.model_extra or {}).get("policy_version", -1))
            self.stats.saw_version(version)
            self.stats.add(requests=1, completion_tokens=reply.usage.completion_tokens)
            text = reply.choices[0].message.content or ""
            prompt, _, done, info = harness.step(text)
            won = won or bool(info["won"])
            rewards = posted_rewards(info, config.repeat_penalty)
            for value, source in rewards:
                session.set_reward(value, interaction_id=reply.id, source=source)
            valid = info["reply"].valid
            self.stats.add(
                env_steps=1,
                invalid_replies=int(not valid),
                refused_commands=int(valid and not info["admissible"]),
                repeated_observations=int(info["repeated_observation"]),
                rewards_posted=len(rewards),
            )
            calls.append(
                {
                    "id": reply.id,
                    "policy_version": version,
                    "reply": text,
                    "reward": sum(v for v, _ in rewards),
                    "rewards": {source: v for v, source in rewards},
                }
            )
        session.end(
            success=won,
            info={"steps": len(calls), "invalid_replies": harness.invalid_replies,
                  "truncated_by": truncated},
        )  # fmt: skip
        return {
            "trajectory_id": session.session_id,
            "game": game,
            "task_type": info["task_type"],
            "won": won,
            "steps": len(calls),
            "truncated_by": truncated,
            "calls": calls,
        }


def posted_rewards(info: dict[str, Any], repeat_penalty: float) -> list[tuple[float, str]]:
    """The (value, source) rewards a turn earns, from `PromptedEnv.step`'s info: its env reward
    ("env"), its malformed-reply or refused-command penalty ("format") and, with
    `repeat_penalty`, the novelty penalty on an answer already seen ("novelty") -- the
    rollout engine's `Turn.env_reward`, `format_reward` and `novelty_reward`. Zeros are left
    out (nothing to post)."""
    novelty = repeat_penalty if info["repeated_observation"] else 0.0
    return reward_sources(info["env_reward"], info["format_reward"], novelty)


def _retry_after(error: openai.APIStatusError, default_s: float = 1.0) -> float:
    """Seconds the server asked to wait (its Retry-After header), within [0.1, 30]."""
    try:
        value = float(error.response.headers.get("retry-after", default_s))
    except ValueError:
        value = default_s
    return min(max(value, 0.1), 30.0)


def _watch_parent(agent: Agent, parent: int) -> None:
    """Stop once the process that started the agent is gone (never outlive the run)."""
    while not agent.stop.wait(1.0):
        if os.getppid() != parent:
            agent.stop.set()


@dataclasses.dataclass
class AgentCommand:
    """The agent process's command line: `AgentConfig`'s fields by their own names, and where
    it reports.

    Attributes:
      agent: what the agent plays and how it decodes.
      log: append one JSON line per finished game.
      stats: write the final counters here (JSON).
    """

    agent: AgentConfig = dataclasses.field(metadata={"flatten": True})
    log: Path | None = None
    stats: Path | None = None


def parse_args(argv: list[str] | None = None) -> tuple[AgentConfig, AgentCommand]:
    """The agent's config and command line (`sao_jax.config_cli`); bad values exit 2 naming
    them."""
    command = parse_cli(
        argv,
        AgentCommand,
        prog="python -m sao_jax.pipeline.online_agent",
        description=(__doc__ or "").split("\n")[0],
    )
    return command.agent, command


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    admin_key = os.environ.get(ADMIN_KEY_ENV)
    if not admin_key:
        print(f"error: set {ADMIN_KEY_ENV} to the gateway's admin key", file=sys.stderr)
        return 2
    agent = Agent(config, admin_key, log_path=args.log)

    def on_signal(signum, frame) -> None:
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_watch_parent, args=(agent, os.getppid()), daemon=True).start()
    stats = agent.run()
    if args.stats is not None:
        args.stats.write_text(json.dumps(stats, indent=1))
    if agent.failed:
        print(
            f"error: {stats['errors']} calls failed; last: {stats['last_error']}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
