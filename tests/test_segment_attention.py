"""Segment attention's blocks: what a group's answers attend to, and when a group is one SDPA call. That a packed row
gives the padded batch's logprobs and gradients, through the learner: tests/test_learner.py (it builds DeepSpeed
engines, which must come before tests that tear down this process's torch.distributed group)."""
from __future__ import annotations

import torch

from grpo_core.engine.train.segment_attention import group_blocks, shared_prompt_mask


def test_the_shared_prompt_mask_lets_responses_see_the_prompt_and_themselves_only():
    mask = shared_prompt_mask(2, [2, 1]).int().tolist()
    assert mask == [[1, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0],
                    [1, 1, 1, 0, 0],   # response 1: the prompt, then causally itself
                    [1, 1, 1, 1, 0],
                    [1, 1, 0, 0, 1]]   # response 2: the prompt and itself, not response 1


def test_a_group_is_one_call_or_a_call_per_segment_by_cost():
    blocks = group_blocks(10, 4, [3, 2], width=64, call_cost=0.0)  # calls free: only the pairs that count
    assert [(b.start, b.end, b.prefix) for b in blocks] == [(10, 14, (0, 0)), (14, 17, (10, 14)), (17, 19, (10, 14))]
    assert blocks[0].mask is None and blocks[2].mask.int().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    (block,) = group_blocks(10, 4, [3, 2], width=64, call_cost=1e18)  # calls dear: the group in one
    assert (block.start, block.end) == (10, 19) and torch.equal(block.mask, shared_prompt_mask(4, [3, 2]))
    (lone,) = group_blocks(0, 4, [3], width=64, call_cost=0.0)  # one response: plain causal attention over prompt + response
    assert (lone.start, lone.end, lone.mask) == (0, 7, None)
