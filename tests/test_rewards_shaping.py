"""Shaping rewards against hand-computed values, and their combination through the Scorer."""
from __future__ import annotations

import math

import pytest

from grpo_core.rewards.scorer import Scorer
from grpo_core.rewards.shaping import CosineParams, RepetitionParams, cosine_reward, format_reward, repetition_penalty


def test_format_reward():
    assert format_reward("<think>a</think>\n<answer>1</answer>") == 1.0
    assert format_reward("  <think>\nx\n</think><answer>y</answer>\n") == 1.0
    assert format_reward("<answer>1</answer><think>a</think>") == 0.0      # wrong order
    assert format_reward("<think>a</think>") == 0.0                        # no answer
    assert format_reward("<think>a</think><answer>1</answer><answer>2</answer>") == 0.0
    assert format_reward("hello <think>a</think><answer>1</answer>") == 0.0  # text outside the tags


def test_cosine_hand_values():
    params = CosineParams(min_value_wrong=-1.0, max_value_wrong=-0.5, min_value_correct=0.5,
                          max_value_correct=1.0, max_len=100)
    assert cosine_reward(True, 0, params) == pytest.approx(1.0)
    assert cosine_reward(True, 50, params) == pytest.approx(0.75)            # cos(pi/2) = 0: the midpoint
    assert cosine_reward(True, 100, params) == pytest.approx(0.5)
    assert cosine_reward(True, 25, params) == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi / 4)))
    assert cosine_reward(False, 0, params) == pytest.approx(-1.0)            # short and wrong: worst
    assert cosine_reward(False, 100, params) == pytest.approx(-0.5)          # long and wrong: penalised less
    assert cosine_reward(False, 500, params) == pytest.approx(-0.5)          # clipped beyond max_len
    assert cosine_reward(True, 10, params) > cosine_reward(True, 90, params)


def test_repetition_hand_values():
    params = RepetitionParams(ngram_size=2, max_penalty=-1.0)
    assert repetition_penalty("a b c d", params) == 0.0                      # 3 bigrams, all distinct
    assert repetition_penalty("a b a b a b", params) == pytest.approx(-(1 - 2 / 5))
    assert repetition_penalty("A b a B", params) == pytest.approx(-(1 - 2 / 3))  # case-insensitive
    assert repetition_penalty("word", params) == 0.0                          # shorter than n
    assert repetition_penalty("x x x x", RepetitionParams(3, -0.5)) == pytest.approx(-0.5 * (1 - 1 / 2))
    with pytest.raises(ValueError, match="max_penalty"):
        RepetitionParams(max_penalty=0.5)


@pytest.mark.timeout(120)
def test_weighted_sum_through_the_scorer():
    options = {"cosine": {"max_len": 100}, "repetition": {"ngram_size": 2}}
    with Scorer(reward_type="think_answer_tags", rewards=["accuracy", "format", "cosine", "repetition"],
                weights=[1.0, 0.5, 2.0, 1.0], num_workers=1, options=options) as scorer:
        completions = ["<think>a b</think><answer>7</answer>", "a b a b <answer>8</answer>"]
        results = scorer.score(completions, [{"gt_answer": "7"}] * 2, completion_lengths=[50, 90])
    first, second = results
    assert first.components == pytest.approx({"accuracy": 1.0, "format": 1.0, "cosine": 0.75,
                                              "repetition": 0.0})
    assert first.reward == pytest.approx(1.0 + 0.5 + 2 * 0.75)
    expected_cosine = cosine_reward(False, 90, CosineParams(max_len=100))
    expected_repetition = repetition_penalty(completions[1], RepetitionParams(ngram_size=2))
    assert second.components["cosine"] == pytest.approx(expected_cosine)
    assert second.reward == pytest.approx(2 * expected_cosine + expected_repetition)


def test_configuration_errors_name_the_setting():
    with pytest.raises(ValueError, match="unknown reward 'acuracy'"):
        Scorer(rewards=["acuracy"])
    with pytest.raises(ValueError, match="2 reward weights for 1 rewards"):
        Scorer(rewards=["accuracy"], weights=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"options\['cosine'\] has unknown keys \['maxlen'\]"):
        Scorer(rewards=["cosine"], options={"cosine": {"maxlen": 5}})
    with pytest.raises(ValueError, match="unknown reward type"):
        Scorer(reward_type="latex")
    with Scorer(rewards=["format"]) as scorer:   # no worker-side reward: no pool needed
        with pytest.raises(ValueError, match="soft_overlong.*removed: use algo.soft_overlong"):
            Scorer(rewards=["accuracy", "soft_overlong"])
        with pytest.raises(ValueError, match="soft_overlong.*removed"):
            Scorer(rewards=["accuracy"], options={"soft_overlong": {"cache_length": 4}})
        assert scorer.score(["<think>a</think><answer>1</answer>"], [{}])[0].reward == 1.0
