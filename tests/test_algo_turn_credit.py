"""Turn-level credit (GiGPO's step-level groups): turn returns, step groups over identical states, and the per-token
advantages the score stage writes for multi-turn episodes."""
import math

import pyarrow as pa
import pytest
import torch

from grpo_core.algo.turn_credit import step_group_advantages, turn_returns
from grpo_core.config import ConfigError, build_config
from grpo_core.data.schemas import RESPONSE_MASK, TOKEN_ADVANTAGE
from grpo_core.pipeline.turn_credit import turn_spans, with_turn_credit


def test_a_turns_return_is_the_reward_discounted_by_the_turns_after_it():
    r = turn_returns(torch.tensor([1.0, 2.0, 0.5]), torch.tensor([3, 1, 0]), gamma=0.5)
    assert r.tolist() == [[0.25, 0.5, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="gamma"):
        turn_returns(torch.ones(1), torch.ones(1, dtype=torch.long), gamma=1.5)


def test_turns_from_the_same_state_are_compared_and_a_turn_alone_in_its_state_gets_nothing():
    # one group of 4 episodes: all start from the prompt (state 0); 0 and 1 made the same call (state 1), 2 and 3
    # another (state 2); only episode 2 took a third turn (state 3)
    ids = torch.tensor([[0, 1, -1], [0, 1, -1], [0, 2, 3], [0, 2, -1]])
    returns = torch.tensor([[0.9, 1.0, 0.0], [0.0, 0.0, 0.0], [0.81, 0.9, 1.0], [0.9, 1.0, 0.0]])
    adv, m = step_group_advantages(ids, returns, group_size=4, scale=False)
    first = returns[:, 0] - returns[:, 0].mean()
    assert torch.allclose(adv[:, 0], first)
    assert adv[:2, 1].tolist() == pytest.approx([0.5, -0.5]) and adv[2:, 1].tolist() == pytest.approx([-0.05, 0.05])
    assert adv[2, 2] == 0.0 and adv[0, 2] == 0.0  # alone in its state; past the episode's end
    assert m["step_group_size_mean"] == pytest.approx((4 * 4 + 2 * 2 + 2 * 2 + 1) / 9)
    assert m["step_grouped_frac"] == pytest.approx(8 / 9)
    scaled, _ = step_group_advantages(ids, returns, group_size=4)
    assert scaled[:2, 1].tolist() == pytest.approx([1 / math.sqrt(0.5) * 0.5, -1 / math.sqrt(0.5) * 0.5], rel=1e-4)


def test_the_same_state_in_two_groups_is_never_compared():
    ids = torch.tensor([[0], [5], [0], [6]])  # state 0 in both groups of 2: each alone in its group
    adv, m = step_group_advantages(ids, torch.tensor([[1.0], [0.0], [0.0], [1.0]]), group_size=2)
    assert adv.abs().max() == 0.0 and m["step_grouped_frac"] == 0.0
    with pytest.raises(ValueError, match="groups of 3"):
        step_group_advantages(ids, torch.zeros(4, 1), group_size=3)


def test_the_score_stage_gives_each_policy_token_its_episodes_and_its_turns_advantage():
    # two episodes of one prompt: the same first call and tool output, then different answers
    call, tool = [11, 12], [90, 91]
    table = pa.table({
        "prompt_token_ids": [[1, 2], [1, 2]],
        "response_token_ids": [call + tool + [21, 22], call + tool + [31]],
        RESPONSE_MASK: [[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1]],
        "shaped_reward": [1.0, 0.0], "advantage": [0.7, -0.7]})
    assert turn_spans([1, 1, 0, 0, 1, 1]) == [(0, 2), (4, 6)] and turn_spans([0, 1]) == [(1, 2)]
    out, m = with_turn_credit(table, group_size=2, weight=1.0, gamma=0.5)
    tokens = out.column(TOKEN_ADVANTAGE).to_pylist()
    first = 0.5 / (math.sqrt(0.125) + 1e-6) * 0.5  # returns 0.5 and 0 from the shared prompt, centred and scaled
    second = 0.5 / (math.sqrt(0.5) + 1e-6)  # returns 1 and 0 from the shared state after the call
    assert tokens[0] == pytest.approx([0.7 + first] * 2 + [0.0] * 2 + [0.7 + second] * 2, rel=1e-5)
    assert tokens[1] == pytest.approx([-0.7 - first] * 2 + [0.0] * 2 + [-0.7 - second], rel=1e-5)
    assert m["step_grouped_frac"] == 1.0


def test_turn_credit_needs_multi_turn_episodes_and_no_other_per_token_source():
    base = {"model": {"path": "m"}, "data": {"train_path": "t"}}
    with pytest.raises(ConfigError, match="set env"):
        build_config({**base, "algo": {"turn_credit": "step_groups"}})
    with pytest.raises(ConfigError, match="choose one"):
        build_config({**base, "algo": {"preset": "ppo", "turn_credit": "step_groups"}})
    tools = {**base, "env": {"kind": "tools", "tools": ["calculator"]}, "rollout": {"max_staleness": 1},
             "cluster": {"placement": "split"}, "algo": {"turn_credit": "step_groups"}}
    assert build_config(tools).resolved_algo.offpolicy == "tis"  # not the row-sign mask of the async default
