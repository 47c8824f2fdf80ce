"""Analyzers: a finished episode in, one short hindsight skill out (batched).

A success yields a reusable strategy, a failure a corrective / avoidance rule. Three kinds:
`RuleBasedAlfworldAnalyzer` (here: deterministic, reads the game's ground truth, labels
stage-1 data on a CPU), `SelfPolicyAnalyzer` (the current policy, `sao_jax.seed.self_analyzer`)
and `OpenAIAnalyzer` (any OpenAI-compatible endpoint, `sao_jax.seed.openai_analyzer`).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence

from sao_jax.envs.alfworld import AlfworldEnv, make_game
from sao_jax.envs.alfworld.classes import display_class
from sao_jax.envs.alfworld.game import APPLIANCE, CLEAN, COOL, HEAT, LOOK, TWO
from sao_jax.envs.alfworld.texts import NOTHING_HAPPENS
from sao_jax.seed.records import EpisodeRecord

_VERB = {CLEAN: "clean", HEAT: "heat", COOL: "cool"}


@dataclasses.dataclass(frozen=True)
class Skill:
    """One hindsight skill and where it came from.

    Attributes:
      text: the skill, one or two sentences.
      trajectory_id: the episode it was written about ("" when decoded from a batch).
      success: that episode's outcome.
      task: the episode's task sentence.
      task_type: ALFWorld task type ("" when unknown).
      analyzer: analyzer name ("rule_alfworld", "self_policy", "openai:<model>").
      analyzer_version: its version (rule set, policy version, endpoint model).
    """

    text: str
    trajectory_id: str
    success: bool
    task: str
    task_type: str
    analyzer: str
    analyzer_version: str


class Analyzer(abc.ABC):
    """Turns finished episodes into hindsight skills, one per episode, in order."""

    name: str = "analyzer"

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """What produced the current skills (provenance stored with each skill)."""

    @abc.abstractmethod
    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        """One skill text per record (the batched work of the analyzer)."""

    def analyze(self, records: Sequence[EpisodeRecord]) -> list[Skill]:
        """`Skill`s of `records`, in order (an empty list for no records)."""
        records = list(records)
        for record in records:
            if not isinstance(record, EpisodeRecord):
                raise TypeError(f"{self.name}: expected EpisodeRecord, got {type(record).__name__}")
        if not records:
            return []
        texts = self.analyze_texts(records)
        if len(texts) != len(records):
            raise RuntimeError(f"{self.name}: {len(texts)} skills for {len(records)} episodes")
        version = self.version
        return [
            Skill(t, r.trajectory_id, r.success, r.task, r.task_type, self.name, version)
            for t, r in zip(texts, records, strict=True)
        ]


class RuleBasedAlfworldAnalyzer(Analyzer):
    """Skills from the game's ground truth: where the target object actually was, which
    appliance and receptacle the task needed, and (failures) the first command that did nothing
    or was repeated, found by replaying the episode's commands in the game.

    Needs `record.game` (the `header.task` of a rollout or demo trajectory).
    """

    name = "rule_alfworld"

    @property
    def version(self) -> str:
        return "rules-v1"

    def analyze_texts(self, records: Sequence[EpisodeRecord]) -> list[str]:
        return [self._skill(record) for record in records]

    def _skill(self, record: EpisodeRecord) -> str:
        spec = record.game
        if not spec or "split" not in spec or "index" not in spec:
            raise ValueError(
                f"{self.name}: episode {record.trajectory_id!r} has no game spec (split, index); "
                "the rule-based analyzer reads the game's ground truth"
            )
        if spec.get("env", "alfworld") != "alfworld":
            raise ValueError(
                f"{self.name}: episode {record.trajectory_id!r} is of env {spec['env']!r}; the "
                "rule-based analyzer reads ALFWorld games only (use self_policy or openai)"
            )
        game = make_game(spec["split"], int(spec["index"]), size=spec.get("size", "full"))
        plan = _plan(game)
        if record.success:
            return f"{game.task.sentence}: {plan}."
        mistake = _first_mistake(spec, record.actions)
        return f"{game.task.sentence}: {mistake}{plan}."


def _plan(game) -> str:
    """The task's solution in the game's own words."""
    task = game.task
    obj, target = display_class(task.object_cls), display_class(task.receptacle_cls)
    places = [
        game.receptacles[item.start].name for item in game.items if item.cls == task.object_cls
    ]
    where = places[0]
    if task.task_type == LOOK:
        lamps = [
            game.receptacles[item.start].name
            for item in game.items
            if item.cls == task.receptacle_cls
        ]
        return (
            f"the {obj} is in {where}. go to {where} and take the {obj}, go to {lamps[0]} "
            f"and use the {target}"
        )
    if task.task_type == TWO:
        second = places[1] if len(places) > 1 else where
        return (
            f"the {obj} is in {where} and {second}. take a {obj} from {where}, put it "
            f"in {target}, and take a {obj} from {second} and put it in {target}"
        )
    steps = f"the {obj} is in {where}. go to {where} and take the {obj}"
    if task.task_type in APPLIANCE:
        appliance = next(r.name for r in game.receptacles if r.cls == APPLIANCE[task.task_type])
        steps += f", go to {appliance} and {_VERB[task.task_type]} the {obj}"
    return steps + f", and put it in {target}"


def _first_mistake(spec, actions: Sequence[str]) -> str:
    """The first command that did nothing (or repeated the last one), replayed in the game.

    Wording stays within the ALFWorld vocabulary, so word-level tokenizers keep every word.
    """
    env = AlfworldEnv(
        spec["split"],
        size=spec.get("size", "full"),
        phrasing=spec.get("phrasing", "0.4.2"),
        max_steps=max(len(actions), 1),
    )
    env.reset(int(spec["index"]))
    previous = None
    for step, action in enumerate(actions, start=1):
        if not action:
            return f"you should choose an admissible action at step {step}. "
        if action == previous:
            return (
                f"you should not choose '{action}' at step {step}, you took it at step {step - 1}. "
            )
        observation, _, done, _ = env.step(action)
        if observation.strip() == NOTHING_HAPPENS:
            return f"Nothing happens for '{action}' at step {step}, you should not choose it. "
        previous = action
        if done:
            break
    return "you should find the object first: "
