"""Packing rollouts into the learner's shifted token space."""
from __future__ import annotations

import pytest
import torch

from grpo_core.algo import entropy_from_logits
from grpo_core.engine.train.batch import (equal_counts, pack_batch, plan_micro_batches, token_logprobs,
                                   token_logprobs_and_entropy)


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


def test_pack_batch_names_the_row_whose_sampler_logprobs_do_not_fit():
    args = dict(prompts=[[5], [6], [7]], responses=[[1], [2, 3], [4]], advantages=[0.0] * 3, row_mask=[True] * 3,
                pad_id=0)
    with pytest.raises(ValueError, match="row 1: 1 sampler logprobs for 2 response tokens"):
        pack_batch(sampler_logprobs=[[-0.1], [-0.2], [-0.3]], **args)
    with pytest.raises(ValueError, match="2 rows of sampler logprobs for 3 rows"):
        pack_batch(sampler_logprobs=[[-0.1], [-0.2, -0.3]], **args)


def test_token_logprobs_equal_log_softmax_gather():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11, dtype=torch.float64)
    ids = torch.randint(0, 11, (3, 6))
    for temperature in (1.0, 0.7):
        expected = torch.log_softmax(logits[:, :-1] / temperature, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        assert torch.allclose(token_logprobs(logits, ids, temperature).double(), expected, atol=1e-6)


def test_fused_logprobs_and_entropy_match_the_unfused_path_values_and_gradients():
    torch.manual_seed(0)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        for temperature in (1.0, 0.7):
            base = (torch.randn(3, 9, 50) * 3).to(dtype)
            ids = torch.randint(0, 50, (3, 9))
            g = torch.randn(3, 8)
            ref_in = base.clone().requires_grad_(True)
            ref = token_logprobs(ref_in, ids, temperature)
            ref_ent = entropy_from_logits(base[:, :-1].float() / temperature)
            (ref * g).sum().backward()
            new_in = base.clone().requires_grad_(True)
            logp, ent = token_logprobs_and_entropy(new_in, ids, temperature, chunk_rows=3)  # several chunks
            (logp * g).sum().backward()
            assert logp.dtype == torch.float32 and not ent.requires_grad
            assert torch.allclose(logp, ref.float(), atol=1e-5, rtol=0)
            assert torch.allclose(ent, ref_ent.float(), atol=1e-5, rtol=0)
            assert new_in.grad.dtype == dtype
            # float32 arithmetic in both; bf16 gradients may differ by one rounding step
            assert torch.allclose(new_in.grad.double(), ref_in.grad.double(), atol=1e-5, rtol=2 ** -7)
            assert torch.equal(new_in, base)  # the logits are not modified in place
    logp, ent = token_logprobs_and_entropy(torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5)), with_entropy=False)
    assert ent is None and logp.shape == (2, 4)


def test_micro_batches_by_tokens_group_rows_of_similar_length_within_the_budget():
    lengths = [8, 30, 9, 12, 31, 10, 29, 11]
    plan = plan_micro_batches(lengths, 64)
    # longest first: 31 and 30 (2 x 31 = 62 tokens); 29 and 12 (58; a third row would make 87); then the short rows
    assert plan == [[1, 4], [3, 6], [0, 2, 5, 7]]
    for rows in plan:
        assert len(rows) * max(lengths[i] for i in rows) <= 64
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))  # every row once
    assert plan_micro_batches(lengths, 1000) == [list(range(8))]
    assert plan_micro_batches([5, 70, 5], 64) == [[1], [0, 2]]  # a row over the budget is alone, never dropped
    with pytest.raises(ValueError, match="max_tokens"):
        plan_micro_batches(lengths, 0)


def test_every_rank_gets_as_many_micro_batches_by_splitting_its_largest():
    plans = equal_counts([[[0, 1, 2, 3]], [[0], [1, 2], [3]]])
    assert plans == [[[0], [1], [2, 3]], [[0], [1, 2], [3]]]
    with pytest.raises(ValueError, match="too few rows"):
        equal_counts([[[0]], [[0], [1]]])


def test_a_trimmed_micro_batch_drops_only_the_columns_no_row_uses():
    batch = pack_batch([[5, 6], [5, 6, 7, 8, 9]], [[10, 2], [11, 12, 13, 2]], [[-0.1, -0.2], [-1, -2, -3, -4]],
                       [1.0, -1.0], [True, True], pad_id=0)
    short = batch.select(torch.tensor([0])).trimmed()
    assert short.input_ids.tolist() == [[5, 6, 10, 2]] and short.response_mask.tolist() == [[0, 1, 1]]
    assert short.sampler_logprobs[0].tolist() == pytest.approx([0.0, -0.1, -0.2])
    assert batch.trimmed() is batch  # the longest row uses every column


def test_packed_micro_batches_keep_a_group_whole_and_count_its_prompt_once():
    from grpo_core.engine.train.batch import plan_packed_micro_batches

    # two groups of 3 rows (prompts of 20 and 10 tokens), responses of 5-12 tokens, and row 6 with no response
    runs = [(20, [0, 1, 2]), (10, [3, 4, 5])]
    lengths = [25, 30, 32, 15, 22, 18, 9]
    packed = {0: 20 + 5 + 10 + 12, 1: 10 + 5 + 12 + 8}  # 47 and 35 tokens packed
    assert plan_packed_micro_batches(runs, lengths, 100) == [[0, 1, 2, 3, 4, 5, 6]]  # 82 <= 100, row 6 rides along
    assert plan_packed_micro_batches(runs, lengths, packed[0]) == [[0, 1, 2, 6], [3, 4, 5]]
    # a group over the budget is cut, each piece with the prompt again: 20 + 5 + 10 = 35, then 20 + 12 = 32;
    # first-fit decreasing puts the other group (35) and the pieces into three micro-batches of at most 40
    plan = plan_packed_micro_batches(runs, lengths, 40)
    assert plan == [[0, 1, 6], [3, 4, 5], [2]]
    assert sorted(i for rows in plan for i in rows) == list(range(7))  # every row once, none dropped
    assert plan_packed_micro_batches([(20, [0])], [70], 64) == [[0]]  # a row over the budget is alone
    with pytest.raises(ValueError, match="max_tokens"):
        plan_packed_micro_batches(runs, lengths, 0)


def test_prompt_runs_and_packed_tokens_follow_the_rows():
    prompts = [[5, 6, 7], [5, 6, 7], [8, 9], [5, 6, 7]]
    responses = [[10, 11], [12], [13, 14, 15], [16]]
    batch = pack_batch(prompts, responses, None, [0.0] * 4, [True] * 4, pad_id=0)
    # runs are consecutive rows: the fourth row's prompt equals the first's but comes after another prompt
    assert batch.prompt_runs() == [(3, [0, 1]), (2, [2]), (3, [3])]
    assert batch.packed_tokens() == (3 + 2 + 1) + (2 + 3) + (3 + 1)
