"""The output layer's logprobs (and entropy) at chosen positions, a few hundred tokens at a time.

Why: on a real vocabulary the output layer's logits are the largest tensor of a train step. SmolLM2's 49,152
entries make 8 x 200 tokens of float32 logits 315 MB, and the log-softmax, its backward and a bf16 -> float32 copy
each add as much again; a 151k vocabulary triples all of it. The policy loss needs one number per response token
(its logprob, and the entropy as a metric or bonus), so the logits never need to exist for the whole micro-batch:
here they are computed for ``chunk_tokens`` positions at a time, reduced to (logprob, logsumexp, entropy), and
dropped; backward recomputes each chunk's logits (one more output-layer GEMM) and turns them straight into the
gradients of the hidden states and of the output weight. Peak extra memory: a few chunk x vocabulary float32 buffers,
whatever the micro-batch (``benchmarks/learner_memory.py`` prints both).
"""
from __future__ import annotations

import torch
from torch import Tensor


def chunk_tokens_for(vocab_size: int, budget_mb: float) -> int:
    """Positions per chunk so that one float32 [chunk, vocab] buffer stays within ``budget_mb`` MiB (at least 16)."""
    return max(16, int(budget_mb * 2**20) // (4 * vocab_size))


def output_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0,
                    entropy: str = "none", chunk_tokens: int = 512) -> tuple[Tensor, Tensor | None]:
    """hidden [N, H] (the final hidden states at the positions that predict ``targets``), weight [V, H] (the output
    layer, no bias), targets [N] or [N, K] -> (logprobs [N] or [N, K] float32, entropy [N] float32 or None).

    ``logprobs[i] = log softmax(hidden[i] @ weight.T / temperature)[targets[i]]``, the same value as a log-softmax of
    the full logits, with gradients for ``hidden`` and ``weight`` (tied embeddings: the embedding's gradient).
    K targets per position (the sampled token and a distillation teacher's top-k, say) share one logits chunk.
    ``entropy``: "none", "metric" (no gradient) or "loss" (differentiable, for an entropy bonus)."""
    if entropy not in ("none", "metric", "loss"):
        raise ValueError(f"entropy must be 'none', 'metric' or 'loss', got {entropy!r}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden [N, H] and weight [V, H] expected, got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if targets.dim() not in (1, 2) or targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets must be [N] or [N, K] with N = {hidden.shape[0]}, got {tuple(targets.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    logp, ent = _ChunkedOutputLogprobs.apply(hidden, weight, targets.reshape(targets.shape[0], -1),
                                             float(temperature), entropy != "none", entropy == "loss",
                                             int(chunk_tokens))
    return logp.reshape(targets.shape), (ent if entropy != "none" else None)


class _ChunkedOutputLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, with_entropy, entropy_grad, chunk):
        n = hidden.shape[0]  # targets [N, K]
        f32 = torch.float32
        logp = torch.empty(targets.shape, dtype=f32, device=hidden.device)
        lse = torch.empty(n, dtype=f32, device=hidden.device)
        ent = torch.empty(n if with_entropy else 0, dtype=f32, device=hidden.device)
        for i in range(0, n, chunk):
            j = min(n, i + chunk)
            z = _logits(hidden[i:j], weight, temperature)
            lse[i:j] = torch.logsumexp(z, dim=-1)
            logp[i:j] = z.gather(-1, targets[i:j]) - lse[i:j, None]
            if with_entropy:  # H = lse - sum_v p_v z_v
                ent[i:j] = lse[i:j] - (z.sub(lse[i:j, None]).exp_() * z).sum(-1)
            del z
        ctx.save_for_backward(hidden, weight, targets, lse, ent if entropy_grad else lse.new_empty(0))
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        T = ctx.temperature
        use_ent = ctx.entropy_grad and g_ent is not None
        g_logp = g_logp.float() if g_logp is not None else torch.zeros(targets.shape, device=lse.device)
        for i in range(0, hidden.shape[0], ctx.chunk):
            j = min(hidden.shape[0], i + ctx.chunk)
            z = _logits(hidden[i:j], weight, T)
            log_p = z.sub_(lse[i:j, None])       # log softmax, in place of z
            p = log_p.exp()
            g = g_logp[i:j]                      # [n, K]
            dz = p * -g.sum(-1, keepdim=True)   # d logp_t / dz = onehot(t) - p, summed over the K targets
            dz.scatter_add_(-1, targets[i:j], g)
            if use_ent:                          # d H / dz = -p (log p + H)
                dz.sub_(p.mul_(log_p.add_(ent[i:j, None])).mul_(g_ent[i:j, None].float()))
            del p, log_p, z
            if T != 1.0:
                dz.div_(T)
            dz = dz.to(hidden.dtype)
            if need_h:
                grad_h[i:j] = dz @ weight
            if need_w:
                grad_w.add_((dz.t() @ hidden[i:j]).float())
            del dz
        return grad_h, (grad_w.to(weight.dtype) if need_w else None), None, None, None, None, None


def _logits(hidden: Tensor, weight: Tensor, temperature: float) -> Tensor:
    """[n, V] float32 logits / temperature of one chunk (the GEMM in the weights' dtype, then float32)."""
    z = (hidden @ weight.t()).float()
    return z.div_(temperature) if temperature != 1.0 else z
