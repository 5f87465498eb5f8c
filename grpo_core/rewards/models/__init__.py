"""Rewards given by models: a sequence-classification reward model, a generative judge on its own vLLM engine, a
judge behind an OpenAI-compatible server. One interface (``ModelReward``), one class per kind, ``make_model_reward``
chooses. Ray actors hold them in a training run (``grpo_core.cluster.reward_models``); ``grpo score`` holds them in
its own process."""
from grpo_core.rewards.models.base import ModelReward, ModelVerdict, RewardInput
from grpo_core.rewards.models.factory import make_model_reward

__all__ = ["ModelReward", "ModelVerdict", "RewardInput", "make_model_reward"]
