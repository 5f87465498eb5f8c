"""What the learner's DeepSpeed engines share (the policy's, and PPO's critic beside it): their DeepSpeed config, the
learning-rate schedule, the gradient norm where DeepSpeed records none, and the checkpoint captured in memory.

Why one module: the critic is a second engine in the same rank, trained by the same rules (the optimizer steps of
an iteration, the run's schedule, ZeRO stage, bf16 handling) and checkpointed in the same checkpoint beside the
policy; two copies of these would drift apart.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
from typing import Any

import torch

from grpo_core.config import TrainConfig


def lr_lambda(train: TrainConfig, total_steps: int):
    """The multiplier of the peak learning rate at each optimizer step: linear warm-up, then constant, cosine or
    linear decay to 0 over the run's ``total_steps``."""
    def factor(step: int) -> float:
        if train.warmup_steps and step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        if train.lr_schedule == "constant":
            return 1.0
        span = max(1, total_steps - train.warmup_steps)
        progress = min(1.0, (step - train.warmup_steps) / span)
        if train.lr_schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def deepspeed_config(train: TrainConfig, micro_batch_size: int, grad_accum_steps: int, zero_stage: int,
                     bf16: bool) -> dict[str, Any]:
    """The engine's DeepSpeed config: DeepSpeed's own 1/GAS loss scaling is not used (the losses carry the
    mini-batch's denominator). In bf16: bf16 weights, float32 master copy and optimizer state; at ZeRO-1 the
    gradients accumulate in float32 too (DeepSpeed's BF16 optimizer). Elsewhere DeepSpeed's default for the stage."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum_steps,
        "gradient_clipping": train.grad_clip or 0.0,
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": bf16},
        **({"data_types": {"grad_accum_dtype": "fp32"}} if bf16 and zero_stage == 1 else {}),
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def grad_norm(module: torch.nn.Module) -> float:
    """The L2 norm of all gradients of `module` (at a step boundary: accumulated, and all-reduced over ranks)."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0


def step(engine, zero_stage: int) -> float | None:
    """``engine.step()``; at a step boundary, the pre-clip gradient norm where DeepSpeed records none (without ZeRO it
    clips unrecorded; under ZeRO 1-3 ``engine.get_global_grad_norm()`` has it). None: not a boundary, or recorded."""
    unrecorded = zero_stage == 0 and engine.is_gradient_accumulation_boundary()
    pre_clip = grad_norm(engine.module) if unrecorded else None
    engine.step()
    return pre_clip


def capture_checkpoint(engine, tag: str, exclude_frozen: bool = False) -> list[tuple[str, Any]]:
    """The engine's whole DeepSpeed checkpoint (module, optimizer partitions, lr scheduler, step counters) copied to
    CPU memory now, as (path under the checkpoint folder, state) pairs under ``<tag>/``.

    DeepSpeed's ``save_checkpoint`` runs as usual (it is a collective across ranks) but with a checkpoint engine
    that clones each state instead of writing it; the copies are written later while training goes on."""
    capture = _CloningCheckpointEngine()
    default = engine.checkpoint_engine
    staging = tempfile.mkdtemp(prefix="grpo-ds-save-")  # DeepSpeed copies its recovery scripts in here
    engine.checkpoint_engine = capture
    try:
        engine.save_checkpoint(staging, tag=tag, save_latest=False, exclude_frozen_parameters=exclude_frozen)
    finally:
        engine.checkpoint_engine = default
        shutil.rmtree(staging, ignore_errors=True)
    return [(os.path.relpath(path, staging), state) for path, state in capture.saved]


class _CloningCheckpointEngine:
    """A DeepSpeed checkpoint engine that keeps a CPU copy of every state it is asked to save."""

    def __init__(self):
        self.saved: list[tuple[str, Any]] = []

    def create(self, info) -> None:
        pass

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str) -> None:
        from deepspeed.checkpoint.utils import clone_tensors_for_torch_save

        self.saved.append((path, clone_tensors_for_torch_save(state_dict)))

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info) -> bool:
        return True

    def is_decoupled(self) -> bool:
        return False

    def preserves_storage_sharing(self) -> bool:
        return False  # every tensor is cloned on its own already

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def cleanup(self) -> None:
        pass
