"""Algorithm presets: partial config trees merged UNDER the user's config (explicit user values win).

Each preset names every algorithm option that defines the method, so switching presets never inherits a choice
from another one; options it leaves out keep the AlgoConfig defaults (which equal the "grpo" preset). Sources:
- grpo:    DeepSeekMath GRPO: group-std advantages, symmetric clip 0.2, per-sequence mean of token means. The paper
           also used a k3 KL to the reference (beta 0.04); this preset leaves kl_coeff at 0 (no reference model,
           as TRL and verl now default), set algo.kl_coeff to restore it.
- dapo:    DAPO: clip-higher (0.2 / 0.28), token-mean loss, dynamic sampling dropping all-right/all-wrong groups
           (up to 10 extra rounds, verl's max_num_gen_batches), soft overlong punishment with the cache sized to the
           run (a fifth of max_new_tokens, as 4096 of 20480 in the paper; soft_overlong_cache_length=0 means that),
           no KL.
- dr_grpo: Dr.GRPO: no std division, sum of token losses over a constant (max_new_tokens) per sequence.
- gspo:    GSPO: sequence-level ratio (length-normalised), clip ranges 3e-4 / 4e-4 from the paper, per-sequence
           mean of token means (which makes GSPO-token's gradient equal GSPO's).
- rloo:    RLOO: leave-one-out baseline without std division, token-mean loss.
- ppo:     PPO with a critic (verl's defaults): GAE advantages (gamma = lambda = 1) whitened over the batch, a value
           model trained beside the policy (the critic section, clipped value loss 0.5), symmetric clip 0.2,
           token-mean loss. Any group size, G = 1 included.
"""
from __future__ import annotations

import copy
from typing import Any

_COMMON_OFF: dict[str, Any] = {"ratio_level": "token", "dual_clip": None, "filter_groups": False,
                               "overlong_filter": False, "soft_overlong": False, "kl_coeff": 0.0}

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"algo": {**_COMMON_OFF, "advantage_estimator": "grpo", "advantage_scale": "group_std",
                      "clip_eps_low": 0.2, "clip_eps_high": 0.2, "loss_agg_mode": "seq_mean_token_mean"}},
    "dapo": {"algo": {**_COMMON_OFF, "advantage_estimator": "grpo", "advantage_scale": "group_std",
                      "clip_eps_low": 0.2, "clip_eps_high": 0.28, "loss_agg_mode": "token_mean",
                      "filter_groups": True, "filter_range": (0.0, 1.0), "max_resample_times": 10,
                      "soft_overlong": True, "soft_overlong_cache_length": 0, "soft_overlong_penalty": 1.0}},
    "dr_grpo": {"algo": {**_COMMON_OFF, "advantage_estimator": "dr_grpo", "advantage_scale": "none",
                         "clip_eps_low": 0.2, "clip_eps_high": 0.2, "loss_agg_mode": "seq_mean_token_sum_norm",
                         "loss_norm_length": None}},
    "gspo": {"algo": {**_COMMON_OFF, "advantage_estimator": "grpo", "advantage_scale": "group_std",
                      "ratio_level": "sequence", "clip_eps_low": 3e-4, "clip_eps_high": 4e-4,
                      "loss_agg_mode": "seq_mean_token_mean"}},
    "rloo": {"algo": {**_COMMON_OFF, "advantage_estimator": "rloo", "advantage_scale": "none",
                      "clip_eps_low": 0.2, "clip_eps_high": 0.2, "loss_agg_mode": "token_mean"}},
    "ppo": {"algo": {**_COMMON_OFF, "advantage_estimator": "gae", "advantage_scale": None, "gae_gamma": 1.0,
                     "gae_lambda": 1.0, "clip_eps_low": 0.2, "clip_eps_high": 0.2, "loss_agg_mode": "token_mean"},
            "critic": {}},
}


def preset_tree(name: str) -> dict[str, Any]:
    """A deep copy of one preset (callers may mutate it)."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is unknown; choose one of {sorted(PRESETS)}")
    return copy.deepcopy(PRESETS[name])
