"""Proposers: candidate actions per surface from a window's failure analysis.

- memory: one note per failed task, written by an analyzer about that task's latest failure, led
  by and keyed on the task sentence (retrieved when the same task comes again; a context may
  hold several notes).
- skill: one note per failing task type, written by an analyzer about one of its episodes (a
  success first: it yields a reusable strategy), keyed on the words that set that type's task
  sentences apart from the other types' in the window.
- harness: templates keyed by failure mode: replies the env cannot parse -> a reply-format
  instruction with an example in the env's own format; refused commands -> an instruction to
  pick only a listed admissible action; malformed tool calls -> a tool-call format instruction.
- tool_schema: a tool whose calls fail -> a clarified description (its arguments, types and
  which are required) and its schema closed to other arguments.
- policy: `train_fn(trajectories, current PolicyRef) -> new PolicyRef`, injected (the online
  learner trains on the window and names its weights).
- noop.

An analyzer is any object with the SEED analyzers' interface (`sao_jax.seed.analyzers`):
`name`, `version` and `analyze(records) -> [skill with .text]`, one per `EpisodeRecord`: the
rule-based ALFWorld analyzer, the policy itself or any OpenAI-compatible endpoint.

Every proposer learns only from `tenant`'s own trajectories: the analysis may span tenants (to
see a failure that recurs everywhere), but a note or an instruction learned from another
tenant's data would leak it.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from atdp_io import Trajectory
from sao_jax.envs.registry import env_class
from sao_jax.seed.records import EpisodeRecord
from serving.control.analysis import Analysis
from serving.control.candidates import Candidate, Patch, Provenance, noop
from serving.control.composite import CompositePolicy, PolicyRef, fingerprint
from serving.control.facts import TrajectoryFacts
from serving.control.store import ControlError

REPLY_FORMAT = "Answer with exactly one action in this format and nothing else: {example}"
ADMISSIBLE_ONLY = (
    "Choose exactly one of the admissible actions listed in the prompt and copy it word for "
    "word; any other action does nothing."
)
TOOL_CALL_FORMAT = (
    "When you call a tool, emit exactly one well-formed tool call whose arguments are a JSON "
    "object matching the tool's parameters."
)
_STOPWORDS = frozenset(
    ("a", "an", "the", "in", "on", "at", "to", "of", "some", "and", "it", "its", "with", "from")
)
_SLUG = re.compile(r"[^A-Za-z0-9_.:-]+")

TrainFn = Callable[[Sequence[Trajectory], PolicyRef], PolicyRef]


class Analyzer(Protocol):
    """The SEED analyzers' interface (`sao_jax.seed.analyzers.Analyzer`)."""

    name: str

    @property
    def version(self) -> str: ...

    def analyze(self, records: Sequence[EpisodeRecord]) -> list[Any]: ...


def _slug(text: str, limit: int = 96) -> str:
    return _SLUG.sub("-", text).strip("-")[:limit] or "x"


def episode_record(f: TrajectoryFacts) -> EpisodeRecord | None:
    """The analyzer's record of a trajectory (None: no task sentence or no actions)."""
    if not f.task_text or not f.actions:
        return None
    return EpisodeRecord(
        trajectory_id=f.trajectory_id,
        task=f.task_text,
        task_type=f.task_type,
        actions=f.actions,
        observations=f.observations,
        success=bool(f.success),
        game=f.task if f.resettable else None,
    )


def _own(analysis: Analysis, tenant: str) -> list[TrajectoryFacts]:
    return [f for f in analysis.facts if f.tenant == tenant and f.success is not None]


def _analyzer_name(analyzer: Analyzer) -> str:
    return f"{analyzer.name}:{analyzer.version}"


def propose_memory(
    analysis: Analysis, base: CompositePolicy, analyzer: Analyzer, *, max_notes: int = 8
) -> Candidate | None:
    """A note per failed task of `base.tenant` (most failures first), or None."""
    failed = [f for f in _own(analysis, base.tenant) if not f.success]
    by_task: dict[str, list[TrajectoryFacts]] = collections.defaultdict(list)
    for f in failed:
        if episode_record(f) is not None:
            by_task[f.task_id].append(f)
    ranked = sorted(by_task.values(), key=lambda fs: -len(fs))[:max_notes]
    latest = [fs[-1] for fs in ranked]
    if not latest:
        return None
    skills = analyzer.analyze([episode_record(f) for f in latest])
    existing = {n.id: n.text for n in base.spec.memory.notes}
    notes = []
    for f, skill in zip(latest, skills, strict=True):
        note_id, text = f"mem-{_slug(f.task_id)}", _about_task(f.task_text, skill.text)
        if existing.get(note_id) == text:
            continue
        notes.append(
            {"id": note_id, "text": text, "keys": [f.task_text],
             "created_from": [f.trajectory_id]}
        )  # fmt: skip
    if not notes:
        return None
    return Candidate(
        "memory",
        Patch(notes=tuple(notes)),
        Provenance(
            base.tenant,
            _analyzer_name(analyzer),
            analysis.window,
            tuple(f"task:{f.task_id}" for f in latest),
            tuple(n["created_from"][0] for n in notes),
        ),
        f"{len(notes)} note(s) for tasks that failed {sum(len(fs) for fs in ranked)} time(s)",
    )


def _about_task(task_text: str, lesson: str) -> str:
    """A memory note names the task it is about (several notes may be retrieved into one
    context, and an analyzer's lesson need not say which task it learned from)."""
    if not task_text or lesson.lower().startswith(task_text.lower()):
        return lesson
    return f"{task_text}: {lesson}"


def distinctive_words(facts: Sequence[TrajectoryFacts], task_type: str) -> list[str]:
    """Words in every task sentence of `task_type` and in none of the other types' (the
    window's); stopwords and numbers left out."""

    def words(text: str) -> set[str]:
        return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in _STOPWORDS}

    mine = [words(f.task_text) for f in facts if f.task_type == task_type and f.task_text]
    others = set().union(
        *(words(f.task_text) for f in facts if f.task_type != task_type and f.task_text)
    )
    if not mine:
        return []
    return sorted(set.intersection(*mine) - others)


def propose_skills(
    analysis: Analysis, base: CompositePolicy, analyzer: Analyzer, *, max_types: int = 2
) -> list[Candidate]:
    """A skill note per failing task type of `base.tenant` (most failures first)."""
    own = _own(analysis, base.tenant)
    failing = collections.Counter(f.task_type for f in own if not f.success and f.task_type)
    out = []
    for task_type, count in failing.most_common(max_types):
        keys = distinctive_words(analysis.facts, task_type)
        examples = [f for f in own if f.task_type == task_type and episode_record(f)]
        examples.sort(key=lambda f: not f.success)  # a success first: a reusable strategy
        if not keys or not examples:
            continue
        (skill,) = analyzer.analyze([episode_record(examples[0])])
        note = {
            "id": f"skill-{_slug(task_type)}",
            "text": skill.text,
            "keys": keys,
            "created_from": [examples[0].trajectory_id],
        }
        out.append(
            Candidate(
                "skill",
                Patch(notes=(note,)),
                Provenance(
                    base.tenant,
                    _analyzer_name(analyzer),
                    analysis.window,
                    (f"task_type:{task_type}",),
                    (examples[0].trajectory_id,),
                ),
                f"a {task_type} lesson for {count} failure(s), retrieved by {keys}",
            )
        )
    return out


def _main_env(own: Sequence[TrajectoryFacts]) -> tuple[str, list[TrajectoryFacts], bool] | None:
    """(the env most of the agent's trajectories played, those trajectories, whether its
    prompts asked for reasoning), None when none names an env."""
    envs = collections.Counter(f.env for f in own if f.env)
    if not envs:
        return None
    env = envs.most_common(1)[0][0]
    played = [f for f in own if f.env == env]
    return env, played, any(f.task.get("think") for f in played)


def _reply_example(own: Sequence[TrajectoryFacts]) -> str | None:
    """A well-formed reply in the env's format, with an action the agent actually took."""
    main = _main_env(own)
    if main is None:
        return None
    env, played, think = main
    taken = collections.Counter(a for f in played for a in f.actions if a)
    action = taken.most_common(1)[0][0] if taken else "look"
    return env_class(env).harness.format_reply(action, think=think)


def _admissible_choices(own: Sequence[TrajectoryFacts]) -> dict[str, str] | None:
    """The env's `reply_choices` for the prompts the agent was sent (its most common env and
    prompt style), None when that env's prompts list no actions to keep replies to."""
    main = _main_env(own)
    if main is None:
        return None
    env, played, think = main
    styles = collections.Counter(str(f.task.get("prompt_style", "paper")) for f in played)
    return env_class(env).harness.reply_choices(style=styles.most_common(1)[0][0], think=think)


def propose_harness(analysis: Analysis, base: CompositePolicy) -> list[Candidate]:
    """Template instructions for the format and refused-action modes of `base.tenant`, and
    for refused actions also replies kept to the listed actions (`ReplyChoices`, when the
    env's prompts list them)."""
    own = _own(analysis, base.tenant)
    failed = [f for f in own if not f.success]
    out = []
    env_format = [f for f in failed if f.format_errors and f.env]
    tool_format = [f for f in failed if f.format_errors and not f.env]
    example = _reply_example(own)
    refused = [f for f in failed if f.refused]
    templates = [
        ("format", env_format, "reply_format",
         REPLY_FORMAT.format(example=example) if example else None),
        ("format", tool_format, "tool_call_format", TOOL_CALL_FORMAT),
        ("refused_action", refused, "admissible_only", ADMISSIBLE_ONLY),
    ]  # fmt: skip
    patches = [
        (kind, showing, template, Patch(instructions=(text,)))
        for kind, showing, template, text in templates
        if showing and text is not None and text not in base.spec.harness.instructions
    ]
    choices = _admissible_choices(own) if refused else None
    current = base.spec.harness.reply_choices
    if choices is not None and (current is None or current.to_json() != choices):
        patches.append(
            ("refused_action", refused, "admissible_choices", Patch(reply_choices=choices))
        )
    for kind, showing, template, patch in patches:
        modes = sorted({m.id for m in analysis.modes if m.kind == kind})
        out.append(
            Candidate(
                "harness",
                patch,
                Provenance(
                    base.tenant,
                    f"template:{template}",
                    analysis.window,
                    tuple(modes),
                    tuple(f.trajectory_id for f in showing[:20]),
                ),
                f"{len(showing)} failure(s) show {kind} errors",
            )
        )
    return out


def clarified_tool(function: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(a description that spells out the arguments, the parameters closed to other
    arguments, or None when the tool has no argument schema)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    described = [
        f"{name} ({spec.get('type', 'any') if isinstance(spec, Mapping) else 'any'}"
        f"{', required' if name in required else ''})"
        for name, spec in properties.items()
    ]
    base = str(function.get("description") or f"The {function.get('name')} tool.").rstrip(".")
    text = f"{base}. Call it with a JSON object of exactly these arguments: " + (
        ", ".join(described) + "; always send every required argument." if described else "none."
    )
    if not properties:
        return text, None
    return text, {**dict(parameters), "additionalProperties": False}


def propose_tool_schemas(analysis: Analysis, base: CompositePolicy) -> list[Candidate]:
    """A clarified description and closed schema per failing tool of `base.tenant`."""
    failed = [f for f in _own(analysis, base.tenant) if not f.success and f.tool_errors]
    by_tool: dict[str, list[TrajectoryFacts]] = collections.defaultdict(list)
    for f in failed:
        for tool in dict.fromkeys(t for t, _ in f.tool_errors):
            by_tool[tool].append(f)
    out = []
    for tool, showing in sorted(by_tool.items(), key=lambda kv: -len(kv[1])):
        function = next((f.tools[tool] for f in reversed(showing) if tool in f.tools), None)
        if function is None:
            continue  # never shown to the model: nothing to clarify
        description, parameters = clarified_tool(function)
        schemas = {}
        if parameters is not None:
            version = f"clarified-{fingerprint(parameters)[:6]}"
            schemas[tool] = {"version": version, "parameters": parameters}
        out.append(
            Candidate(
                "tool_schema",
                Patch(tool_descriptions={tool: description}, tool_schemas=schemas),
                Provenance(
                    base.tenant,
                    "template:clarified_tool",
                    analysis.window,
                    (f"tool:{tool}",),
                    tuple(f.trajectory_id for f in showing[:20]),
                ),
                f"{len(showing)} failure(s) with failed {tool} calls",
            )
        )
    return out


def propose_policy(
    analysis: Analysis,
    base: CompositePolicy,
    trajectories: Sequence[Trajectory],
    train_fn: TrainFn,
) -> Candidate:
    """New weights trained on `base.tenant`'s trajectories of the window by `train_fn`."""
    own = [t for t in trajectories if t.header.governance.tenant == base.tenant]
    if not own:
        raise ControlError(f"no trajectories of tenant {base.tenant!r} to train a policy on")
    policy = train_fn(own, base.spec.policy)
    if not isinstance(policy, PolicyRef) or not policy.version:
        raise ControlError(f"train_fn must return a PolicyRef with a version, got {policy!r}")
    if policy == base.spec.policy:
        raise ControlError(f"train_fn returned the current policy {policy.version!r} unchanged")
    name = getattr(train_fn, "__name__", type(train_fn).__name__)
    return Candidate(
        "policy",
        Patch(policy=policy.to_json()),
        Provenance(
            base.tenant,
            f"train:{name}",
            analysis.window,
            tuple(m.id for m in analysis.dominant()),
            tuple(t.trajectory_id for t in own),
        ),
        f"policy {policy.version} trained on {len(own)} trajectories",
    )


def propose(
    analysis: Analysis,
    base: CompositePolicy,
    *,
    trajectories: Sequence[Trajectory] = (),
    analyzer: Analyzer | None = None,
    train_fn: TrainFn | None = None,
) -> list[Candidate]:
    """Every candidate the window suggests for `base.tenant`, the no-op first: memory and
    skills (with an analyzer), harness and tool-schema templates, a policy update (with a
    train_fn and the window's trajectories). Duplicates (equal ids) are dropped."""
    out = [noop(base.tenant, analysis.window)]
    if analyzer is not None:
        memory = propose_memory(analysis, base, analyzer)
        out += [memory] if memory is not None else []
        out += propose_skills(analysis, base, analyzer)
    out += propose_harness(analysis, base)
    out += propose_tool_schemas(analysis, base)
    if train_fn is not None and trajectories:
        out.append(propose_policy(analysis, base, trajectories, train_fn))
    unique = {c.id: c for c in out}
    return list(unique.values())


def describe(candidates: Sequence[Candidate]) -> str:
    """One line per candidate (id, cost rank, rationale), for logs."""
    return "\n".join(
        f"{c.id} (cost {c.cost_rank}): {c.rationale} {json.dumps(c.patch.to_json())[:120]}"
        for c in candidates
    )
