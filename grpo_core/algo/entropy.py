"""Token entropy of the policy from its logits, for the entropy bonus and as a collapse diagnostic.

H = logsumexp(z) - sum_v softmax(z)_v z_v, computed in float32 or wider (stable for any logit scale). A [B, T, V]
logits tensor is large; `chunk_size` processes rows of the flattened [B*T, V] view in pieces so the softmax
temporaries never exceed chunk_size x V.
"""
from __future__ import annotations

import torch
from torch import Tensor


def entropy_from_logits(logits: Tensor, chunk_size: int | None = None) -> Tensor:
    """Entropy over the last dim. logits: [..., V] -> [...] (float32, or float64 if given float64).

    Gradients flow through it (use it in a loss). chunk_size: rows per piece (None: all at once).
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a vocabulary dim, got shape {tuple(logits.shape)}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32

    def _one(z: Tensor) -> Tensor:
        z = z.to(dtype)
        logp = torch.log_softmax(z, dim=-1)
        # -inf logits (masked vocabulary) have p = 0 and contribute 0, not 0 * -inf = NaN
        safe = torch.where(torch.isfinite(logp), logp, torch.zeros((), dtype=dtype, device=logp.device))
        return -(logp.exp() * safe).sum(dim=-1)

    if chunk_size is None or flat.shape[0] <= chunk_size:
        out = _one(flat)
    else:
        out = torch.cat([_one(part) for part in flat.split(chunk_size, dim=0)])
    return out.reshape(lead)
