"""The chunked output-layer logprobs against a full log-softmax: values and gradients, any chunk size."""
from __future__ import annotations

import pytest
import torch

from grpo_core.engine.train.output_head import chunk_tokens_for, output_logprobs


def _reference(hidden, weight, targets, temperature, entropy):
    z = (hidden.double() @ weight.double().t()) / temperature
    log_p = torch.log_softmax(z, -1)
    logp = log_p.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(log_p.exp() * log_p).sum(-1)
    return logp, ent


def _inputs(n=37, h=16, v=101, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_a_full_log_softmax(chunk, temperature):
    hidden, weight, targets = _inputs()
    g = torch.Generator().manual_seed(1)
    w_logp, w_ent = torch.randn(37, generator=g), torch.randn(37, generator=g)

    logp, ent = output_logprobs(hidden, weight, targets, temperature=temperature, entropy="loss", chunk_tokens=chunk)
    ((logp * w_logp).sum() + (ent * w_ent).sum()).backward()
    got = (logp.detach(), ent.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None

    ref_logp, ref_ent = _reference(hidden, weight, targets, temperature, "loss")
    ((ref_logp * w_logp).sum() + (ref_ent * w_ent).sum()).backward()
    for a, b in zip(got, (ref_logp.detach(), ref_ent.detach(), hidden.grad, weight.grad)):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-4)  # float32 logits


@pytest.mark.parametrize("chunk", [1, 6, 1000])
def test_several_targets_per_position_match_a_full_log_softmax(chunk):
    """[N, K] targets (the sampled token and a teacher's top-k, with repeats): each column as a log-softmax gathers
    it, the gradients those of the weighted sum over every column."""
    hidden, weight, first = _inputs()
    g = torch.Generator().manual_seed(2)
    targets = torch.cat([first[:, None], torch.randint(0, 101, (37, 3), generator=g), first[:, None]], dim=1)
    w = torch.randn(37, 5, generator=g)
    logp, _ = output_logprobs(hidden, weight, targets, temperature=0.7, chunk_tokens=chunk)
    assert logp.shape == (37, 5)
    (logp * w).sum().backward()
    got = (logp.detach(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    ref = torch.log_softmax((hidden.double() @ weight.double().t()) / 0.7, -1).gather(-1, targets)
    (ref * w).sum().backward()
    for a, b in zip(got, (ref.detach(), hidden.grad, weight.grad)):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-4)
    one, _ = output_logprobs(hidden, weight, first, temperature=0.7, chunk_tokens=chunk)
    assert torch.equal(one.detach(), got[0][:, 0])  # the first column is the one-target call's value, to the bit


def test_entropy_metric_carries_no_gradient_and_none_returns_none():
    hidden, weight, targets = _inputs()
    logp, ent = output_logprobs(hidden, weight, targets, entropy="metric", chunk_tokens=8)
    assert not ent.requires_grad and logp.requires_grad
    torch.testing.assert_close(ent.double(), _reference(hidden, weight, targets, 1.0, "metric")[1].detach(),
                               rtol=1e-4, atol=1e-4)
    _, none = output_logprobs(hidden, weight, targets, entropy="none")
    assert none is None


def test_frozen_weight_gets_no_gradient_and_tied_weight_accumulates():
    hidden, weight, targets = _inputs()
    frozen = weight.detach()
    logp, _ = output_logprobs(hidden, frozen, targets, chunk_tokens=8)
    logp.sum().backward()
    assert hidden.grad is not None and frozen.grad is None
    # A tied embedding: the same tensor used as input embedding and output layer gets both gradients.
    emb = torch.randn(101, 16, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 101, (37,))
    h = emb[ids] * 2.0
    logp, _ = output_logprobs(h, emb, targets, chunk_tokens=7)
    logp.sum().backward()
    got = emb.grad.clone()
    emb.grad = None
    ref, _ = _reference(emb[ids] * 2.0, emb, targets, 1.0, "none")
    ref.sum().backward()
    torch.testing.assert_close(got, emb.grad, rtol=1e-4, atol=1e-4)


def test_bfloat16_weights_give_float32_logprobs_close_to_float64():
    hidden, weight, targets = _inputs(dtype=torch.float32)
    logp, _ = output_logprobs(hidden.bfloat16(), weight.bfloat16(), targets, chunk_tokens=8)
    assert logp.dtype == torch.float32
    ref, _ = _reference(hidden.double(), weight.double(), targets, 1.0, "none")
    assert (logp.double() - ref).abs().max() < 0.5  # bf16 inputs: 8 mantissa bits in the GEMM
    assert (logp.double() - ref).abs().max() > 0  # and it is not the float64 path


def test_bad_shapes_and_options_are_refused():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="entropy must be"):
        output_logprobs(hidden, weight, targets, entropy="yes")
    with pytest.raises(ValueError, match=r"weight \[V, H\]"):
        output_logprobs(hidden, weight[:, :3], targets)
    with pytest.raises(ValueError, match="targets must be"):
        output_logprobs(hidden, weight, targets[:3])


def test_chunk_size_follows_the_memory_budget():
    assert chunk_tokens_for(49152, 128) == 682  # 128 MiB of float32 logits over SmolLM2's vocabulary
    assert chunk_tokens_for(151_936, 128) == 220
    assert chunk_tokens_for(10**9, 1) == 16
