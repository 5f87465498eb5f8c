"""The process's set-up for DeepSpeed: its torch.distributed group and the communication ops it may build."""
from __future__ import annotations

import os
import tempfile
import uuid

import torch


def ensure_process_group() -> None:
    """DeepSpeed needs torch.distributed. In-process vLLM may already have created a world-of-one group (reuse it);
    otherwise make one through a file rendezvous, which opens no network socket. torch.distributed creates the file
    and removes it when the group is destroyed or the process exits; a folder of our own around it would stay
    behind in the temporary folder, one per learner process."""
    import torch.distributed as dist

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    if dist.is_initialized():
        return
    rendezvous = os.path.join(tempfile.gettempdir(), f"grpo-dist-{os.getpid()}-{uuid.uuid4().hex}")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=0, world_size=1)


def skip_inference_all_reduce_kernel() -> None:
    """Keeps DeepSpeed from compiling its shared-memory all-reduce kernel, which training never calls.

    On a CPU machine DeepSpeed's communication backend builds that kernel with g++ the first time it starts (35 s on
    2 Xeon cores, 66 s on 2 EPYC cores, into ``TORCH_EXTENSIONS_DIR``): a newcomer's first ``make run`` and every fresh
    clone's test suite paid it. Only ``inference_all_reduce`` (DeepSpeed-Inference's tensor parallelism) uses it; the
    learner's collectives are torch.distributed's. Marking the op incompatible in DeepSpeed's table of compatible ops
    is how DeepSpeed itself skips an op a platform cannot build (the table is one dict, kept for the process, so the
    mark holds), and the backend then runs on torch.distributed alone."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False
