"""Packing rollouts into the learner's shifted token space."""
from __future__ import annotations

import torch

from grpo_core.train.batch import pack_batch, token_logprobs


def test_pack_batch_aligns_response_columns_and_sampler_logprobs():
    batch = pack_batch(prompts=[[5, 6, 7], [8]], responses=[[1, 2], [3, 4, 9]],
                       sampler_logprobs=[[-0.1, -0.2], [-0.3, -0.4, -0.5]], advantages=[1.0, -1.0],
                       row_mask=[True, False], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 2], [8, 3, 4, 9, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # column j predicts token j+1: row 0 response tokens sit at positions 3, 4 -> columns 2, 3
    assert batch.response_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert torch.allclose(batch.sampler_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [-0.3, -0.4, -0.5, 0]]))
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0]]  # row 1 is not kept
    sub = batch.select(slice(1, 2))
    assert len(sub) == 1 and sub.advantages.tolist() == [-1.0]


def test_token_logprobs_equal_log_softmax_gather():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11, dtype=torch.float64)
    ids = torch.randint(0, 11, (3, 6))
    for temperature in (1.0, 0.7):
        expected = torch.log_softmax(logits[:, :-1] / temperature, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        assert torch.allclose(token_logprobs(logits, ids, temperature).double(), expected, atol=1e-6)
