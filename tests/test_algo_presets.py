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


def test_ppo_learns_a_critic_and_takes_any_group_size():
    cfg = build_config({**_tree(preset="ppo"), "rollout": {"samples_per_prompt": 1}})
    assert cfg.algo.advantage_estimator == "gae" and cfg.algo.uses_critic and cfg.critic is not None
    assert (cfg.algo.gae_gamma, cfg.algo.gae_lambda, cfg.critic.value_clip) == (1.0, 1.0, 0.5)
    assert cfg.critic_model_path == "m" and cfg.critic_lr == cfg.train.lr  # the policy's folder and learning rate
    own = build_config({**_tree(preset="ppo"), "critic": {"path": "rm", "lr": 3e-6}})
    assert (own.critic_model_path, own.critic_lr) == ("rm", 3e-6)
    # asynchronous: token TIS by default (the group presets' default masks rows by one advantage's sign)
    async_ = build_config({**_tree(preset="ppo"), "rollout": {"max_staleness": 1}, "cluster": {"placement": "split"}})
    assert async_.resolved_algo.offpolicy == "tis"
    with pytest.raises(ConfigError, match="samples_per_prompt must be >= 2"):
        build_config({**_tree(preset="grpo"), "rollout": {"samples_per_prompt": 1}})


@pytest.mark.parametrize("tree,match", [
    ({"critic": {}}, "takes its baseline from each group"),
    ({"algo": {"preset": "ppo"}, "distill": {"teacher": "t"}}, "choose one"),
    ({"algo": {"preset": "ppo"}, "sft": {}, "data": {"train_path": "d.jsonl", "format": "chat"}}, "critic"),
])
def test_a_critic_is_refused_where_it_cannot_work(tree, match):
    with pytest.raises(ConfigError, match=match):
        build_config({**_tree(), **tree})


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
        preset_tree("trpo")


@pytest.mark.parametrize("algo,match", [
    ({"filter_range": [0.5, 0.5]}, "filter_range"),
    ({"preset": "dr_grpo", "advantage_scale": "group_std"}, "advantage_scale"),
    ({"kl_in_reward": True}, "kl_coeff"),
    ({"dual_clip": 1.0}, "dual_clip"),
    ({"preset": "trpo"}, "preset"),
    ({"advantage_estimator": "gae"}, "use algo.preset: ppo"),
    ({"advantage_estimator": "gae", "advantage_scale": None}, "set critic"),
    ({"preset": "ppo", "advantage_scale": "group_std"}, "whitens"),
    ({"preset": "ppo", "filter_groups": True}, "filter_groups"),
    ({"preset": "ppo", "offpolicy": "neg_adv_mask"}, "per token"),
    ({"preset": "ppo", "gae_lambda": 1.5}, "gae_lambda"),
])
def test_invalid_algo_config(algo, match):
    with pytest.raises(ConfigError, match=match):
        build_config(_tree(**algo))
