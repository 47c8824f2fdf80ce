"""The arithmetic env's rule-based hindsight, through SEED's analyzer interface."""

import re

import pytest

from sao_jax.envs.arithmetic import ArithmeticEnv, make_task
from sao_jax.envs.arithmetic.hindsight import ARITHMETIC_RULES, task_of
from sao_jax.seed import EpisodeRecord, SeedConfig, classify, make_analyzer

# by its own name, without a tokenizer: no token budget, every sentence kept
ARITHMETIC_RULES_ANALYZER = make_analyzer("rule_arithmetic", config=SeedConfig())


def _record(index: int, actions, *, spec: bool = True, split: str = "train") -> EpisodeRecord:
    env = ArithmeticEnv(split, max_steps=4)
    _, info = env.reset(index)
    won = False
    for action in actions:
        if env.done:
            break
        _, _, _, info = env.step(action)
        won = info["won"]
    game = {"env": "arithmetic", "split": split, "index": index, "max_steps": 4} if spec else None
    return EpisodeRecord(f"a{index}", info["task"], "", tuple(actions), (), won, game)


@pytest.fixture(scope="module")
def analyzer():
    return make_analyzer("rule", config=SeedConfig(), env="arithmetic")


def test_the_expert_episode_gets_its_result_and_procedure(analyzer):
    for index in range(10):  # every task type twice, half of them read from the text alone
        task = make_task("train", index)
        record = _record(index, [f"calc {task.expression}", f"answer {task.answer}"],
                         spec=index % 2 == 0)  # fmt: skip
        assert record.success
        (skill,) = analyzer.analyze([record])
        assert skill.analyzer == "rule_arithmetic" and skill.kinds() == ("fact", "procedure")
        assert skill.text == (
            f"The result of {task.expression} is {task.answer}. "
            f"calc {task.expression}, then answer {task.answer}."
        )
        labels = ARITHMETIC_RULES.action_labels(record.game, record.task, record.actions)
        assert labels == [True, True]


def test_a_failing_episode_gets_the_refusals_and_the_wrong_answer(analyzer):
    task = make_task("train", 3)
    actions = ["bogus", "calc 2 x 3", "", "answer 7"]
    record = _record(3, actions)
    assert not record.success
    (skill,) = ARITHMETIC_RULES_ANALYZER.analyze([record])
    failed = [p.text for p in skill.parts if p.kind == "failed_command"]
    assert failed == [
        "'bogus' is wrong: use calc <expression> or answer <number>.",
        "'calc 2 x 3' is wrong: the calculator cannot read it.",
    ]  # the first two; the empty reply and the wrong answer come later
    assert f"The result of {task.expression} is {task.answer}." in skill.text
    assert ARITHMETIC_RULES.action_labels(record.game, record.task, actions) == [False] * 4
    wrong = _record(3, ["answer 7"])
    (skill,) = analyzer.analyze([wrong])
    assert f"'answer 7' is wrong: calc {task.expression} first." in skill.text
    assert "7 is not the answer." in skill.text
    after = _record(3, [f"calc {task.expression}", "answer 7"])
    (skill,) = analyzer.analyze([after])
    assert "'answer 7' is wrong: answer the value the calculator shows." in skill.text
    assert skill.kinds() == ("fact", "failed_command", "procedure")


def test_words_stay_in_the_env_vocabulary_and_kinds_read_back(analyzer):
    vocabulary = set(ArithmeticEnv.vocabulary())
    for index in range(10):
        task = make_task("valid_unseen", index)
        for actions in ([f"calc {task.expression}", f"answer {task.answer}"],
                        ["x", "calc (", "answer 1", ""], [""]):  # fmt: skip
            record = _record(index, actions, split="valid_unseen", spec=index % 2 == 1)
            (skill,) = analyzer.analyze([record])
            words = re.findall(r"\w+|[^\w\s]", skill.text)
            assert not [w for w in words if w not in vocabulary and not w.isdigit()]
            # an untagged copy of the text is read as the same kinds
            assert classify(skill.text, ARITHMETIC_RULES.kind_patterns) == skill.kinds()


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="not an arithmetic task: 'Why'"):
        task_of(None, "Why")
    record = EpisodeRecord("w", "put a mug in cabinet", "", ("look",), (), False)
    with pytest.raises(ValueError, match=r"rule_arithmetic: episode 'w': not an arithmetic task"):
        ARITHMETIC_RULES_ANALYZER.analyze([record])
    alfworld = EpisodeRecord("g", "What is 1 + 1?", "", ("answer 2",), (), True,
                             {"split": "train", "index": 0})  # fmt: skip
    with pytest.raises(ValueError, match="env 'alfworld'; this analyzer reads arithmetic"):
        ARITHMETIC_RULES_ANALYZER.analyze([alfworld])
    with pytest.raises(ValueError, match="env 'nowhere' has no rule-based hindsight"):
        make_analyzer("rule", config=SeedConfig(), env="nowhere")
