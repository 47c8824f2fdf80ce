"""`PromptedEnv.step` on a real ALFWorld game: the turn's reward in its two parts, and whether
an admitted command's answer repeats what the game already showed (what a served agent posts
as rewards, `sao_jax.pipeline.online_agent.posted_rewards`)."""

from sao_jax.envs.alfworld.env import AlfworldEnv
from sao_jax.envs.base import PromptOptions, RewardWeights
from sao_jax.envs.prompted import PromptedEnv

WEIGHTS = RewardWeights(win_reward=10.0, invalid_reply_penalty=-0.1, inadmissible_penalty=-1.0)


def step(prompted, reply):
    _, reward, done, info = prompted.step(reply)
    parts = (info["env_reward"], info["format_reward"], info["repeated_observation"])
    return reward, done, parts, info


def test_a_step_reports_its_reward_parts_and_answers_already_seen():
    env = AlfworldEnv("valid_seen", size="small", expert_in_info=True)
    prompted = PromptedEnv(env, PromptOptions(history_length=1, style="compact"), WEIGHTS)
    _, info = prompted.reset(0)
    places = [c for c in info["admissible_commands"] if c.startswith("go to ")][:2]
    assert len(places) == 2

    reward, _, parts, _ = step(prompted, "I will look around")  # malformed: empty command
    assert (reward, parts) == (-0.1, (0.0, -0.1, False))
    reward, _, parts, info = step(prompted, "<action>fly to the moon</action>")  # refused
    assert not info["admissible"] and (reward, parts) == (-1.0, (0.0, -1.0, False))
    # "Nothing happens." again, but a refused command is never a repeat (its penalty is set)
    assert info["history"][-1][0] == "Nothing happens."

    answers = []
    for command in (places[0], places[1], places[0]):
        reward, _, parts, info = step(prompted, f"<action>{command}</action>")
        assert info["admissible"] and reward == 0.0 and parts[:2] == (0.0, 0.0)
        answers.append((prompted.history[-1], parts[2]))
    # the third answer is the first's again (nothing moved); the first two are new
    assert [repeated for _, repeated in answers] == [False, False, True]

    done = False
    while not done:
        reward, done, parts, info = step(prompted, f"<action>{info['expert_action']}</action>")
    assert info["won"] and parts[0] == 10.0 and parts[1] == 0.0 and reward == 10.0
