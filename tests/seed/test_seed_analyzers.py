"""The three analyzers: rule-based on real games, the policy itself, an OpenAI endpoint."""

import asyncio
import threading

import numpy as np
import pytest
from aiohttp import web
from seed_factories import demo_store, demo_trajectories, tiny_policy, word_tokenizer

from sao_jax.envs.alfworld import make_game
from sao_jax.envs.alfworld.classes import display_class
from sao_jax.rollout import Sampler
from sao_jax.rollout.weights import WeightPublisher
from sao_jax.seed import (
    EpisodeRecord,
    RuleBasedAlfworldAnalyzer,
    SeedConfig,
    SelfPolicyAnalyzer,
    from_trajectory,
    make_analyzer,
)
from sao_jax.seed.openai_analyzer import OpenAIAnalyzer


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    store = demo_store(tmp_path_factory.mktemp("analyzers"), num_episodes=3)
    return [from_trajectory(t) for t in demo_trajectories(store)]


def _where(game) -> str:
    item = next(i for i in game.items if i.cls == game.task.object_cls)
    return game.receptacles[item.start].name


def test_rule_based_skills_name_where_the_object_really_was(records):
    skills = RuleBasedAlfworldAnalyzer().analyze(records)
    assert len(skills) == len(records)
    for record, skill in zip(records, skills, strict=True):
        game = make_game(record.game["split"], record.game["index"], size=record.game["size"])
        assert skill.text.startswith(game.task.sentence)
        assert f"the {display_class(game.task.object_cls)} is in {_where(game)}" in skill.text
        assert (skill.trajectory_id, skill.success) == (record.trajectory_id, record.success)
        assert (skill.analyzer, skill.analyzer_version) == ("rule_alfworld", "rules-v1")


def test_rule_based_failure_names_the_first_wrong_step(records):
    record = records[0]
    failed = EpisodeRecord(
        "ep-fail", record.task, record.task_type, ("look", "open banana 9"), (), False,
        record.game,
    )  # fmt: skip
    (skill,) = RuleBasedAlfworldAnalyzer().analyze([failed])
    assert "Nothing happens for 'open banana 9' at step 2" in skill.text
    repeated = EpisodeRecord("ep-rep", record.task, "", ("look", "look"), (), False, record.game)
    assert (
        "not choose 'look' at step 2, you took it at step 1"
        in RuleBasedAlfworldAnalyzer().analyze([repeated])[0].text
    )
    no_game = EpisodeRecord("ep-x", record.task, "", ("look",), (), False)
    with pytest.raises(ValueError, match=r"ep-x.*no game spec"):
        RuleBasedAlfworldAnalyzer().analyze([no_game])
    other_env = {**record.game, "env": "arithmetic"}
    sums = EpisodeRecord("ep-sum", "What is 2 + 2?", "", ("answer 4",), (), True, other_env)
    with pytest.raises(ValueError, match=r"ep-sum.*env 'arithmetic'.*ALFWorld games only"):
        RuleBasedAlfworldAnalyzer().analyze([sums])


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
            (False, ("close cabinet 97",)),
        ):
            records.append(
                EpisodeRecord(f"g{index}", game.task.sentence, "", actions, (), success, spec)
            )
    assert len({make_game("train", i, size="small").task.task_type for i in range(24)}) == 6
    for skill in RuleBasedAlfworldAnalyzer().analyze(records):
        assert tokenizer.decode(tokenizer.encode(skill.text)) == skill.text


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
