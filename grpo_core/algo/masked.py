"""Masked reductions shared by the algorithm functions.

Every per-token quantity in this package lives on a padded `[B, T]` grid; these helpers reduce it over the real
tokens only, so padding never leaks into a loss or a metric.
"""
from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(**tensors: Tensor) -> None:
    """Raise a ValueError naming the argument whose shape differs from the first one given."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t is not None and t.shape != first.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but {first_name} has shape {tuple(first.shape)}")


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is true (mask: bool or 0/1 of the same shape). Masked-out NaN/inf are ignored."""
    m = mask.to(torch.bool)
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(m, values, zeros)
    return v.sum() if dim is None else v.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `values` over `mask`; 0 where the mask is empty (never NaN)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """Max of `values` over `mask` (a 0-dim tensor); 0 where the mask is empty."""
    m = mask.to(torch.bool)
    if not bool(m.any()):
        return torch.zeros((), dtype=values.dtype, device=values.device)
    return values[m].max()
