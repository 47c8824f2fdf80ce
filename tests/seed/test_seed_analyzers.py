"""The three analyzers: rule-based on real games, the policy itself, an OpenAI endpoint."""

import asyncio
import random
import threading

import numpy as np
import pytest
from aiohttp import web
from seed_factories import demo_store, demo_trajectories, tiny_policy, word_tokenizer

from sao_jax.envs.alfworld import AlfworldEnv, make_game
from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.expert import expert_plan
from sao_jax.envs.alfworld.goals import WorldState
from sao_jax.rollout import Sampler
from sao_jax.rollout.weights import WeightPublisher
from sao_jax.seed import (
    EpisodeRecord,
    RuleBasedAlfworldAnalyzer,
    SeedConfig,
    SelfPolicyAnalyzer,
    Skill,
    SkillPart,
    classify,
    from_trajectory,
    make_analyzer,
    skill_block_ids,
)
from sao_jax.seed.openai_analyzer import OpenAIAnalyzer
from sao_jax.seed.rules_alfworld import ALFWORLD_RULES


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    store = demo_store(tmp_path_factory.mktemp("analyzers"), num_episodes=3)
    return [from_trajectory(t) for t in demo_trajectories(store)]


def test_rule_based_skills_of_expert_episodes_state_facts_and_the_procedure(records):
    skills = RuleBasedAlfworldAnalyzer().analyze(records)
    assert len(skills) == len(records)
    for record, skill in zip(records, skills, strict=True):
        game = make_game(record.game["split"], record.game["index"], size=record.game["size"])
        wanted = [i for i in game.items if i.cls == game.task.object_cls]
        # the first sentence: where the object really was (the game's ground truth)
        assert skill.parts[0] == SkillPart(
            "fact", f"The {wanted[0].name} is in {game.receptacles[wanted[0].start].name}."
        )
        plan = expert_plan(game, WorldState.initial(game), phrasing=record.game["phrasing"])
        assert skill.parts[-1] == SkillPart("procedure", f"You should {', '.join(plan)}.")
        assert skill.text == " ".join(p.text for p in skill.parts)
        assert (skill.trajectory_id, skill.success) == (record.trajectory_id, record.success)
        assert (skill.analyzer, skill.analyzer_version) == ("rule_alfworld", "rules-v2")
        assert skill.kinds() == tuple(dict.fromkeys(p.kind for p in skill.parts))
        # what the search expert revealed on its way is true of the game
        for part in skill.parts:
            if part.kind == "fact" and " is not in " in part.text:
                where = part.text.removesuffix(".").split(" is not in ")[1]
                assert all(game.receptacles[i.start].name != where for i in wanted)


def _random_episode(index: int, seed: int, steps: int = 14):
    """A failing random policy on train game `index` (small): admissible commands chosen at
    random, and every third step a command that cannot work from where it stands."""
    rng = random.Random(seed)
    env = AlfworldEnv("train", size="small", max_steps=steps)
    _, info = env.reset(index)
    far = [f"take {i.name} from {env.game.receptacles[i.start].name}" for i in env.game.items]
    actions, done = [], False
    while not done:
        command = (
            rng.choice(far) if len(actions) % 3 == 2 else rng.choice(info["admissible_commands"])
        )
        actions.append(command)
        _, _, done, info = env.step(command)
    spec = {"split": "train", "index": index, "size": "small", "phrasing": "0.4.2"}
    return EpisodeRecord(f"rnd{index}", info["task"], "", tuple(actions), (), info["won"], spec)


def test_rule_based_skills_of_a_failing_random_policy_name_what_failed_and_why():
    analyzer, checked = RuleBasedAlfworldAnalyzer(), 0
    for index in range(6):
        record = _random_episode(index, seed=index)
        assert not record.success
        (skill,) = analyzer.analyze([record])
        game = make_game("train", index, size="small")
        failed = [p.text for p in skill.parts if p.kind == "failed_command"]
        assert len(failed) in (1, 2) and skill.kinds() == ("fact", "failed_command", "procedure")
        labels = ALFWORLD_RULES.action_labels(record.game, record.task, record.actions)
        assert len(labels) == len(record.actions) and not all(labels)
        # replay: each "Nothing happens" rule names a command that did nothing, for the reason
        # the state at that step gives
        engine = AlfworldEngine(game)
        engine.reset()
        reasons = {}
        for action in record.actions:
            if not engine.is_admissible(action):
                reasons.setdefault(action, (engine.state.location, engine.state.held))
            engine.step(action)
        for text in failed:
            if not text.startswith("Nothing happens for '"):
                continue
            command, fix = text.removeprefix("Nothing happens for '").removesuffix(".").split("': ")
            location, held = reasons[command]
            if fix.startswith("go to "):
                target = fix.removeprefix("go to ").removesuffix(" first")
                assert location < 0 or game.receptacles[location].name != target
                assert command.endswith(target)
                checked += 1
            elif fix.startswith("you are carrying "):
                assert game.items[held].name == fix.removeprefix("you are carrying ")
                checked += 1
    assert checked >= 3


def test_rule_based_failure_rules_name_the_step_and_the_fix(records):
    record = records[0]
    failed = EpisodeRecord(
        "ep-fail", record.task, record.task_type, ("look", "open banana 9"), (), False,
        record.game,
    )  # fmt: skip
    (skill,) = RuleBasedAlfworldAnalyzer().analyze([failed])
    assert "Nothing happens for 'open banana 9': banana 9 is not in the room." in skill.text
    repeated = EpisodeRecord("ep-rep", record.task, "", ("look", "look"), (), False, record.game)
    assert (
        "You should not choose 'look' at step 2, you took it at step 1."
        in RuleBasedAlfworldAnalyzer().analyze([repeated])[0].text
    )
    unparsed = EpisodeRecord("ep-un", record.task, "", ("look", ""), (), False, record.game)
    assert "Choose an admissible action at step 2." in (
        RuleBasedAlfworldAnalyzer().analyze([unparsed])[0].text
    )
    no_game = EpisodeRecord("ep-x", record.task, "", ("look",), (), False)
    with pytest.raises(ValueError, match=r"ep-x.*no game spec"):
        RuleBasedAlfworldAnalyzer().analyze([no_game])
    other_env = {**record.game, "env": "arithmetic"}
    sums = EpisodeRecord("ep-sum", "What is 2 + 2?", "", ("answer 4",), (), True, other_env)
    with pytest.raises(ValueError, match=r"ep-sum.*env 'arithmetic'.*alfworld episodes only"):
        RuleBasedAlfworldAnalyzer().analyze([sums])


def test_untagged_skills_are_classified_by_the_rule_sentence_forms():
    patterns = ALFWORLD_RULES.kind_patterns
    written = (
        "The mug 1 is in cabinet 3. Nothing happens for 'take mug 1 from cabinet 3': open "
        "cabinet 3 first."
    )
    assert classify(written, patterns) == ("fact", "failed_command")
    assert classify("You should go to cabinet 3, take mug 1 from cabinet 3.", patterns) == (
        "procedure",
    )
    assert classify("mug mug cabinet the the 3", patterns) == ("other",)
    skill = Skill(written, "t", False, "put a mug in cabinet", "", "self_policy", "policy-v1")
    assert skill.kinds(patterns) == ("fact", "failed_command") and skill.kinds() == ("other",)
    with pytest.raises(ValueError, match="unknown kind 'hint'"):
        SkillPart("hint", "go left")
    with pytest.raises(ValueError, match="unknown kinds"):
        classify("x", {"hint": "x"})


def test_self_policy_analyzer_samples_batched_and_follows_new_weights(records):
    tokenizer = word_tokenizer()
    config = dict(max_new_tokens=8, temperature=0.0)
    sampler = Sampler(tiny_policy(seed=0), pad_id=tokenizer.pad_id)
    analyzer = SelfPolicyAnalyzer(sampler, tokenizer, **config)
    first = analyzer.analyze(records[:2])
    assert [s.analyzer_version for s in first] == ["policy-v0"] * 2
    assert all(isinstance(s.text, str) and s.text for s in first)

    newer = tiny_policy(seed=5)
    publisher = WeightPublisher()
    publisher.publish(newer, 3)
    analyzer.follow(publisher)
    followed = analyzer.analyze(records[:2])
    assert [s.analyzer_version for s in followed] == ["policy-v3"] * 2
    # same text as an analyzer built on the new weights from scratch: the weights were swapped
    fresh = SelfPolicyAnalyzer(Sampler(newer, pad_id=tokenizer.pad_id), tokenizer, **config)
    assert [s.text for s in followed] == [s.text for s in fresh.analyze(records[:2])]
    analyzer.refresh(tiny_policy(seed=0), 7)
    assert [s.text for s in analyzer.analyze(records[:2])] == [s.text for s in first]


class _FakeEndpoint:
    """An OpenAI-compatible chat endpoint on loopback (aiohttp) that answers from the prompt."""

    def __init__(self, fail: bool = False):
        self.requests, self.fail = [], fail
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _serve(self):
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _chat(self, request):
        body = await request.json()
        self.requests.append(body)
        if self.fail:
            return web.json_response({"error": {"message": "overloaded"}}, status=500)
        task = body["messages"][-1]["content"].split("\n")[0]
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"skill for {task}"},
                    }
                ],
            }
        )

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_openai_analyzer_uses_the_real_client_in_order(records):
    endpoint = _FakeEndpoint()
    try:
        analyzer = OpenAIAnalyzer(f"http://127.0.0.1:{endpoint.port}/v1", "judge", concurrency=3)
        skills = analyzer.analyze(records)
        assert [s.text for s in skills] == [
            f"skill for Your task is to: {r.task}." for r in records
        ]
        assert {s.analyzer for s in skills} == {"openai:judge"}
        assert len(endpoint.requests) == len(records)
        assert all(r["model"] == "judge" for r in endpoint.requests)
        last = records[0].actions[-1]
        assert any(f"'{last}'" in r["messages"][-1]["content"] for r in endpoint.requests)
    finally:
        endpoint.close()
    failing = _FakeEndpoint(fail=True)
    try:
        analyzer = OpenAIAnalyzer(f"http://127.0.0.1:{failing.port}/v1", "judge")
        with pytest.raises(RuntimeError, match=records[0].trajectory_id):
            analyzer.analyze(records[:1])
    finally:
        failing.close()


def test_rule_based_wording_stays_in_the_word_vocabulary():
    tokenizer = word_tokenizer()
    records = []
    for index in range(24):  # every task type of the small train games
        game = make_game("train", index, size="small")
        spec = {"split": "train", "index": index, "size": "small"}
        for success, actions in (
            (True, ("look",)),
            (False, ("look", "look")),
            (False, ("close cabinet 97", "")),
        ):
            records.append(
                EpisodeRecord(f"g{index}", game.task.sentence, "", actions, (), success, spec)
            )
        records.append(_random_episode(index, seed=100 + index, steps=10))
    assert len({make_game("train", i, size="small").task.task_type for i in range(24)}) == 6
    config = SeedConfig()
    budgeted = make_analyzer("rule", config=config, tokenizer=tokenizer)
    unlimited = RuleBasedAlfworldAnalyzer().analyze(records)
    dropped = 0
    for skill, full in zip(budgeted.analyze(records), unlimited, strict=True):
        assert tokenizer.decode(tokenizer.encode(full.text)) == full.text
        # within budget, a skill block is never truncated mid-sentence: the least important
        # sentences (what the agent revealed, a second failure) go first, the facts never
        assert len(skill_block_ids(tokenizer, skill.text)) <= config.max_skill_tokens
        assert set(skill.parts) <= set(full.parts)
        assert [p for p in full.parts if " is in " in p.text] == [
            p for p in skill.parts if " is in " in p.text
        ]
        dropped += len(full.parts) - len(skill.parts)
    assert dropped > 0  # some random episodes needed it


def test_unknown_analyzer_and_bad_url_are_named():
    with pytest.raises(ValueError, match="unknown analyzer 'oracle'"):
        make_analyzer("oracle", config=SeedConfig())
    with pytest.raises(ValueError, match="opd_analyzer"):
        SeedConfig(opd_analyzer="oracle")
    with pytest.raises(ValueError, match="needs the policy's sampler"):
        make_analyzer("self_policy", config=SeedConfig())
    with pytest.raises(ValueError, match="base_url"):
        OpenAIAnalyzer("127.0.0.1:8000", "judge")
    assert RuleBasedAlfworldAnalyzer().analyze([]) == []
    assert np.all(
        [isinstance(make_analyzer("rule_alfworld", config=SeedConfig()), RuleBasedAlfworldAnalyzer)]
    )
