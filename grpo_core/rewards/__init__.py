"""Reward functions and the process-pool Scorer (see scorer.py for what a RewardResult means)."""
from grpo_core.rewards.registry import BUILTIN_REWARDS, RewardPlan, build_plan
from grpo_core.rewards.scorer import RewardResult, Scorer

__all__ = ["BUILTIN_REWARDS", "RewardPlan", "RewardResult", "Scorer", "build_plan"]
