"""The one place that turns the config's ``env`` section into episodes: which environment class, its tools, and
the limits of an episode. The built-in tools environment gets tool instances built once per sampler (a tool holds
configuration only, e.g. the sandbox's limits) and shared by its episodes; a user class gets ``env.args``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grpo_core.envs.base import Environment
from grpo_core.envs.episode import ChatContinuation, Episode
from grpo_core.envs.runner import EpisodeLimits, run_episodes
from grpo_core.envs.tool_env import ToolEnv
from grpo_core.envs.tools import make_tool


def environment_factory(env_cfg) -> tuple[Callable[[], Environment], int]:
    """(a function making one episode's environment, the class's max_turns). Raises naming the config field."""
    if env_cfg.kind == "tools":
        tools = [make_tool(spec, env_cfg.tool_args.get(spec)) for spec in env_cfg.tools]

        def new_tool_env() -> Environment:
            return ToolEnv(tools, tool_timeout_s=env_cfg.tool_timeout_s,
                           max_observation_chars=env_cfg.max_observation_chars,
                           max_calls_per_turn=env_cfg.max_calls_per_turn)
        return new_tool_env, ToolEnv.max_turns
    from grpo_core.rewards.plugins import load_plugin

    cls = load_plugin(env_cfg.kind)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise TypeError(f"env.kind={env_cfg.kind!r} is not a subclass of grpo_core.envs.Environment")
    args = dict(env_cfg.args)
    return (lambda: cls(**args)), int(getattr(cls, "max_turns", Environment.max_turns))


@dataclass
class EpisodeSource:
    """What a sampler needs to run episodes: the environment factory, the chat continuation of its tokenizer, and
    the limits from the config."""

    new_env: Callable[[], Environment]
    chat: ChatContinuation
    limits: EpisodeLimits

    @classmethod
    def from_config(cls, cfg, tokenizer) -> "EpisodeSource":
        env = cfg.env
        new_env, class_turns = environment_factory(env)
        budget = cfg.rollout.max_new_tokens
        limits = EpisodeLimits(budget=budget, turn_tokens=env.turn_tokens or budget,
                               max_turns=env.max_turns or class_turns, step_timeout_s=env.step_timeout_s,
                               workers=env.workers)
        return cls(new_env, ChatContinuation(tokenizer), limits)

    def run(self, sampler: Any, prompts: list[dict[str, Any]], *, n: int, greedy: bool = False,
            temperature: float = 1.0, top_p: float = 1.0, seeds: list[int] | None = None) -> list[list[Episode]]:
        return run_episodes(sampler, self.chat, self.new_env, prompts, n=n, limits=self.limits, greedy=greedy,
                            temperature=temperature, top_p=top_p, seeds=seeds)
