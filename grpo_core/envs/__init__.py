"""Multi-turn rollouts: environments, tools and the episode runner (see ``base`` for the interface)."""
from grpo_core.envs.base import Environment, Step, ToolCall
from grpo_core.envs.episode import ChatContinuation, Episode
from grpo_core.envs.factory import EpisodeSource, environment_factory
from grpo_core.envs.runner import EpisodeLimits, run_episodes
from grpo_core.envs.tool_env import ToolEnv
from grpo_core.envs.tools import Calculator, PythonTool, Tool, ToolError, make_tool

__all__ = ["Calculator", "ChatContinuation", "Environment", "Episode", "EpisodeLimits", "EpisodeSource", "PythonTool",
           "Step", "Tool", "ToolCall", "ToolEnv", "ToolError", "environment_factory", "make_tool", "run_episodes"]
