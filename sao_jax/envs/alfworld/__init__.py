"""ALFWorld: a faithful, fast pure-Python re-implementation of alfworld 0.4.2's text engine.

Procedural games (`make_game`), two experts (`search_expert_action`, which acts only on the
episode's texts, and the `expert_plan` planner, an oracle that reads the true state), a single
and a batched env (`AlfworldEnv` is the "alfworld" `TextEnv`), the LLM-agent
harness (prompt renderer and reply parser, `AlfworldPrompts`), and a bridge to the real engine
(`export_tw_pddl`, `RealAlfworldEnv`, optional extra `alfworld`). See docs/alfworld.md.
"""

from sao_jax.envs.alfworld.batched import BatchedAlfworldEnv
from sao_jax.envs.alfworld.engine import AlfworldEngine
from sao_jax.envs.alfworld.env import EXPERTS, AlfworldEnv, GameSampler, check_expert
from sao_jax.envs.alfworld.expert import expert_action, expert_plan
from sao_jax.envs.alfworld.game import TASK_TYPES, Game, Item, Receptacle, Task
from sao_jax.envs.alfworld.generator import SIZES, SPLITS, make_game, scene_layouts
from sao_jax.envs.alfworld.harness import (
    AlfworldHarness,
    HarnessConfig,
    ParsedReply,
    parse_reply,
    render_prompt,
)
from sao_jax.envs.alfworld.pddl_export import export_tw_pddl
from sao_jax.envs.alfworld.prompts import ALFWORLD_PROMPTS, AlfworldPrompts
from sao_jax.envs.alfworld.real_env import RealAlfworldEnv, real_game_files
from sao_jax.envs.alfworld.search_expert import search_expert_action
from sao_jax.envs.alfworld.vocabulary import WORD_PATTERN, split_words, vocabulary

__all__ = [
    "ALFWORLD_PROMPTS",
    "EXPERTS",
    "SIZES",
    "SPLITS",
    "TASK_TYPES",
    "WORD_PATTERN",
    "AlfworldEngine",
    "AlfworldEnv",
    "AlfworldHarness",
    "AlfworldPrompts",
    "BatchedAlfworldEnv",
    "Game",
    "GameSampler",
    "HarnessConfig",
    "Item",
    "ParsedReply",
    "RealAlfworldEnv",
    "Receptacle",
    "Task",
    "check_expert",
    "expert_action",
    "expert_plan",
    "export_tw_pddl",
    "make_game",
    "parse_reply",
    "real_game_files",
    "render_prompt",
    "scene_layouts",
    "search_expert_action",
    "split_words",
    "vocabulary",
]
