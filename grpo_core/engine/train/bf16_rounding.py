"""Stochastic rounding of the bfloat16 weights the engines compute with, from the float32 master weights.

Why: in bfloat16 DeepSpeed keeps float32 masters and, after each step, rounds them to the nearest bf16 value for the
module (and from there the samplers). A bf16 step is 1/256 to 1/128 of a weight, and RL's learning rates move a
weight far less per update: round-to-nearest then leaves almost every copy where it was (SmolLM2 at lr 3e-6: 1.75%
of the weights had moved after 12 updates, and the policy did not learn). Rounded stochastically, each copy is the
master in expectation, so small updates reach the policy (the same run learned as float32 did:
docs/benchmarks.md). The noise is drawn from (run seed, policy version, group), so a resumed run rounds the same.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor


def stochastic_round_to_bf16(master: Tensor, generator: torch.Generator) -> Tensor:
    """``master`` (float32) rounded to a bfloat16 value stochastically: up with probability equal to its distance
    from the value below, in units of the bf16 step (so the expectation is ``master``). Returns float32 holding
    exactly representable bf16 values (the copy into a bf16 tensor is then exact)."""
    bits = master.detach().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, generator=generator, device="cpu")
    # Adding below the kept 16 bits carries into them with that probability; the sign bit is untouched (magnitudes
    # round, positive or negative alike).
    return ((bits + noise.to(bits.device)) & -65536).view(torch.float32)


def is_bf16_optimizer(optimizer) -> bool:
    """Whether ``optimizer`` is DeepSpeed's BF16 optimizer (bfloat16 at ZeRO 0-1), whose copy-back this replaces."""
    return hasattr(optimizer, "fp32_groups_flat_partition") and hasattr(optimizer, "bf16_partitioned_groups")


def round_stochastically(optimizer, seed: int, version: Callable[[], int]) -> None:
    """Make DeepSpeed's BF16 optimizer (ZeRO 0-1 in bfloat16) write its masters into the bf16 weights with
    stochastic rounding instead of to nearest; ``version()`` is the policy version the step produces from."""
    if not is_bf16_optimizer(optimizer):
        raise ValueError(f"train.bf16_rounding=stochastic needs DeepSpeed's BF16 optimizer (model.dtype bfloat16 "
                         f"at train.zero_stage 0-1), not {type(optimizer).__name__}")
    from deepspeed import comm as dist
    from deepspeed.runtime.utils import all_gather_dp_groups

    def update_lp_params() -> None:
        for i, (parts, master) in enumerate(zip(optimizer.bf16_partitioned_groups,
                                                optimizer.fp32_groups_flat_partition)):
            rank = dist.get_rank(group=optimizer.real_dp_process_group[i])
            gen = torch.Generator().manual_seed((seed * 1_000_003 + version() * 10_007 + i * 101 + rank) % 2**63)
            parts[rank].data.copy_(stochastic_round_to_bf16(master.data, gen))
        all_gather_dp_groups(groups_flat=optimizer.bf16_groups_flat,
                             partitioned_param_groups=optimizer.bf16_partitioned_groups,
                             dp_process_group=optimizer.real_dp_process_group,
                             start_alignment_factor=optimizer.nccl_start_alignment_factor,
                             allgather_bucket_size=optimizer.allgather_bucket_size)

    optimizer.update_lp_params = update_lp_params
