"""pass@k: the chance that at least one of k samples solves a problem, estimated without bias from n >= k samples.

Why not sample exactly k and count: that estimate has a high variance, and 1 - (1 - c/n)^k is biased. Chen et al.
(2021, "Evaluating Large Language Models Trained on Code") give the unbiased estimator 1 - C(n-c, k) / C(n, k) for
n samples of which c are correct. The binomials overflow for realistic n, so it is computed as the product
1 - prod_{i=n-c+1}^{n} (1 - k / i), which is the same number (the paper's numpy form) and stable.
"""
from __future__ import annotations

import torch


def pass_at_k(num_samples: torch.Tensor, num_correct: torch.Tensor, k: int) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-problem unbiased pass@k ([P] float64) and ``{"pass@k": mean}``.

    ``num_samples[p]`` is n (>= k) and ``num_correct[p]`` is c (0 <= c <= n) of problem p. When n - c < k every
    draw of k samples holds a correct one: pass@k is exactly 1.
    """
    n = torch.as_tensor(num_samples, dtype=torch.int64).reshape(-1)
    c = torch.as_tensor(num_correct, dtype=torch.int64).reshape(-1)
    if n.shape != c.shape:
        raise ValueError(f"num_samples has {n.numel()} entries but num_correct has {c.numel()}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n.numel() and int(n.min()) < k:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem; the smallest count is {int(n.min())}")
    if n.numel() and (int(c.min()) < 0 or bool((c > n).any())):
        raise ValueError("num_correct must lie in [0, num_samples] for every problem")
    values = torch.empty(n.numel(), dtype=torch.float64)
    for p, (n_p, c_p) in enumerate(zip(n.tolist(), c.tolist())):
        if n_p - c_p < k:
            values[p] = 1.0
        else:
            i = torch.arange(n_p - c_p + 1, n_p + 1, dtype=torch.float64)
            values[p] = 1.0 - torch.prod(1.0 - k / i)
    mean = float(values.mean()) if values.numel() else float("nan")
    return values, {f"pass@{k}": mean}
