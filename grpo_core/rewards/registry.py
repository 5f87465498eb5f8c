"""Which rewards exist, and turning (reward type, names, weights, options) into a checked plan.

Why a plan: every mistake in the reward configuration (an unknown name, a weight count that does not match, an
option for a reward that is not used, a plugin that cannot be imported) should fail when the scorer is built, with
a message saying which setting is wrong, not in the middle of a training run.

Options (all optional), keyed by reward name:
    {"cosine": {"min_value_wrong", "max_value_wrong", "min_value_correct", "max_value_correct", "max_len"},
     "repetition": {"ngram_size", "max_penalty"},
     "plugins": {"name": "module:function" | "path/file.py:function"},   # then use "name" in `rewards`
     "sandbox": {...SandboxLimits fields...},                           # code rewards
     "answer_key": "gt_answer"}                                         # column holding the gold answer
A reward name containing ":" is a plugin spec used inline; its component is named after the function.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Iterable

from grpo_core.rewards.accuracy import REWARD_TYPES
from grpo_core.rewards.plugins import is_plugin_spec, load_plugin, plugin_name
from grpo_core.rewards.shaping import CosineParams, RepetitionParams

WORKER_REWARDS = ("accuracy",)                                       # computed in worker processes
# cheap, computed in the scorer's process ("env": the reward a multi-turn environment gave its episode)
LOCAL_REWARDS = ("format", "cosine", "repetition", "env")
BUILTIN_REWARDS = WORKER_REWARDS + LOCAL_REWARDS
OPTION_KEYS = ("cosine", "repetition", "plugins", "sandbox", "answer_key")
# DAPO's soft overlong punishment lives in one place, the algorithm (it once was a reward too, and both could
# be on at once, punishing twice).
MOVED = {"soft_overlong": "use algo.soft_overlong (and algo.soft_overlong_cache_length) instead"}


@dataclass(frozen=True)
class RewardPlan:
    reward_type: str
    names: tuple[str, ...]
    weights: tuple[float, ...]
    plugins: dict[str, str] = field(default_factory=dict)   # component name -> spec, only those in `names`
    cosine: CosineParams = CosineParams()
    repetition: RepetitionParams = RepetitionParams()
    sandbox_limits: dict[str, Any] | None = None
    answer_key: str = "gt_answer"

    @property
    def needs_accuracy(self) -> bool:
        """Accuracy is computed when asked for, and also when cosine needs to know correctness."""
        return "accuracy" in self.names or "cosine" in self.names


def _params(cls: type, name: str, values: Any) -> Any:
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise ValueError(f"options[{name!r}] must be a mapping, got {type(values).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"options[{name!r}] has unknown keys {unknown}; known: {sorted(known)}")
    return cls(**values)


def build_plan(reward_type: str, rewards: list[str], weights: list[float] | None,
               options: dict[str, Any] | None, model_names: Iterable[str] = ()) -> RewardPlan:
    """Check the configuration and resolve plugin specs (importing each once here, to fail early). `model_names`:
    the model rewards the scorer was given (``reward.models``), valid reward names too."""
    model_names = set(model_names)
    clash = sorted(model_names & set(BUILTIN_REWARDS))
    if clash:
        raise ValueError(f"reward.models {clash}: a built-in reward has that name; name the model reward otherwise")
    if reward_type not in REWARD_TYPES:
        raise ValueError(f"unknown reward type {reward_type!r}; choose one of {list(REWARD_TYPES)}")
    options = dict(options or {})
    for name in MOVED:
        if name in rewards or name in options:
            raise ValueError(f"the {name!r} reward was removed: {MOVED[name]}")
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"unknown scorer options {unknown}; known: {list(OPTION_KEYS)}")
    if not rewards:
        raise ValueError("at least one reward name is needed (e.g. ['accuracy'])")
    named_plugins = options.get("plugins") or {}
    if not isinstance(named_plugins, dict):
        raise ValueError("options['plugins'] must map a reward name to 'module:function'")

    names: list[str] = []
    plugins: dict[str, str] = {}
    for reward in rewards:
        if reward in BUILTIN_REWARDS or reward in model_names:
            name = reward
        elif reward in named_plugins:
            name = reward
            plugins[name] = named_plugins[reward]
        elif is_plugin_spec(reward):
            name = plugin_name(reward)
            plugins[name] = reward
        else:
            raise ValueError(f"unknown reward {reward!r}: not one of {list(BUILTIN_REWARDS)}, not in "
                             f"options['plugins'] ({sorted(named_plugins)}), not a model reward (reward.models: "
                             f"{sorted(model_names)}), and not a 'module:function' spec")
        if name in names:
            raise ValueError(f"reward {name!r} is listed twice")
        names.append(name)
    for spec in plugins.values():
        load_plugin(spec)

    if weights is None:
        weights = [1.0] * len(names)
    if len(weights) != len(names):
        raise ValueError(f"{len(weights)} reward weights for {len(names)} rewards {names}")
    answer_key = options.get("answer_key", "gt_answer")
    if not isinstance(answer_key, str) or not answer_key:
        raise ValueError(f"options['answer_key'] must be a column name, got {answer_key!r}")
    sandbox = options.get("sandbox")
    if sandbox is not None and not isinstance(sandbox, dict):
        raise ValueError(f"options['sandbox'] must be a mapping of SandboxLimits fields, got {type(sandbox).__name__}")
    if sandbox is not None:
        from grpo_core.infra.sandbox import SandboxLimits

        try:
            SandboxLimits(**sandbox)
        except TypeError as error:
            raise ValueError(f"options['sandbox']: {error}") from error
    return RewardPlan(
        reward_type=reward_type,
        names=tuple(names),
        weights=tuple(float(w) for w in weights),
        plugins=plugins,
        cosine=_params(CosineParams, "cosine", options.get("cosine")),
        repetition=_params(RepetitionParams, "repetition", options.get("repetition")),
        sandbox_limits=sandbox,
        answer_key=answer_key,
    )
