"""The GRPO algorithm family as pure tensor functions (torch only): each returns (value, metrics)."""
from grpo_core.algo.advantages import compute_advantages
from grpo_core.algo.entropy import entropy_from_logits
from grpo_core.algo.filters import (DynamicBatch, default_cache_length, group_filter, overlong_mask,
                                    soft_overlong_penalty)
from grpo_core.algo.kl import apply_kl_to_reward, kl_penalty
from grpo_core.algo.losses import AGG_MODES, aggregate_loss, loss_denominator, policy_loss
from grpo_core.algo.masked import masked_mean, masked_sum
from grpo_core.algo.objective import policy_objective
from grpo_core.algo.offpolicy import offpolicy_weights, sampler_mismatch, truncated_is_weights
from grpo_core.algo.pass_at_k import pass_at_k
from grpo_core.algo.presets import PRESETS, preset_tree

__all__ = [
    "AGG_MODES", "DynamicBatch", "PRESETS", "aggregate_loss", "apply_kl_to_reward", "compute_advantages",
    "default_cache_length", "entropy_from_logits", "group_filter", "kl_penalty", "loss_denominator", "masked_mean",
    "masked_sum", "offpolicy_weights", "overlong_mask", "pass_at_k", "policy_loss", "policy_objective", "preset_tree",
    "sampler_mismatch",
    "soft_overlong_penalty", "truncated_is_weights",
]
