"""Presets resolve to valid configs, set what their method needs, and lose to explicit user values."""
import pytest

from grpo_core.algo import PRESETS, preset_tree
from grpo_core.config import AlgoConfig, ConfigError, build_config


def _tree(**algo):
    return {"model": {"path": "m"}, "data": {"train_path": "d.jsonl"}, "algo": algo}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_resolves(name):
    cfg = build_config(_tree(preset=name))
    assert cfg.algo.preset == name
    for key, value in PRESETS[name]["algo"].items():
        assert getattr(cfg.algo, key) == (tuple(value) if isinstance(value, list) else value), key


def test_preset_values():
    dapo = build_config(_tree(preset="dapo")).algo
    assert (dapo.clip_eps_high, dapo.loss_agg_mode, dapo.filter_groups, dapo.soft_overlong) == \
        (0.28, "token_mean", True, True)
    gspo = build_config(_tree(preset="gspo")).algo
    assert (gspo.ratio_level, gspo.clip_eps_low, gspo.clip_eps_high) == ("sequence", 3e-4, 4e-4)
    dr = build_config(_tree(preset="dr_grpo")).algo
    assert (dr.advantage_estimator, dr.advantage_scale, dr.loss_agg_mode) == \
        ("dr_grpo", "none", "seq_mean_token_sum_norm")
    assert build_config(_tree(preset="rloo")).algo.advantage_estimator == "rloo"


def test_user_value_beats_preset():
    cfg = build_config(_tree(preset="dapo", clip_eps_high=0.3, filter_groups=False))
    assert cfg.algo.clip_eps_high == 0.3 and cfg.algo.filter_groups is False
    assert cfg.algo.loss_agg_mode == "token_mean"  # the rest still comes from the preset
    cfg = build_config(_tree(preset="gspo", clip_eps_low=0.001))
    assert cfg.algo.clip_eps_low == 0.001 and cfg.algo.clip_eps_high == 4e-4


def test_grpo_defaults_equal_grpo_preset():
    defaults = AlgoConfig()
    for key, value in PRESETS["grpo"]["algo"].items():
        if key != "advantage_scale":  # None (estimator default) resolves to group_std for grpo
            assert getattr(defaults, key) == value, key


def test_preset_tree_is_a_copy():
    t = preset_tree("dapo")
    t["algo"]["clip_eps_high"] = 9.0
    assert PRESETS["dapo"]["algo"]["clip_eps_high"] == 0.28
    with pytest.raises(ValueError, match="preset"):
        preset_tree("ppo")


@pytest.mark.parametrize("algo,match", [
    ({"filter_range": [0.5, 0.5]}, "filter_range"),
    ({"preset": "dr_grpo", "advantage_scale": "group_std"}, "advantage_scale"),
    ({"kl_in_reward": True}, "kl_coeff"),
    ({"dual_clip": 1.0}, "dual_clip"),
    ({"preset": "ppo"}, "preset"),
])
def test_invalid_algo_config(algo, match):
    with pytest.raises(ConfigError, match=match):
        build_config(_tree(**algo))
