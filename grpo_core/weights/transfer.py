"""Weight transports built on vLLM's RL weight-transfer API: ``broadcast`` (NCCL on GPUs, gloo on CPUs) and
``cuda_ipc``.

vLLM 0.32 splits a transfer into a worker-side engine (inside each vLLM worker: init, start / update / finish a
weight update) and a trainer-side engine (``trainer_init`` + ``send_weights``, driving the workers through a
client). The two kinds here differ only in the backend; the learner side builds the trainer-side engine over the
learner's weights (``LearnerSource``) and sends through it, the sampler side is driven by that engine (its
sampler was built with the backend, ``sampler_backend``). The client that reaches the sampler actors lives in
``grpo_core.cluster.weight_client``; our gloo engine for CPUs in ``grpo_core.weights.gloo``.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Iterator

from grpo_core.weights.transport import Ends, Published, Transport

if TYPE_CHECKING:
    import torch


class VLLMTransferTransport(Transport):
    """A transfer group of learner rank 0 and every sampler's vLLM workers; the trainer-side engine pushes."""

    def __init__(self) -> None:
        self._engine = None  # vLLM's trainer-side engine (learner ranks)
        self._client = None  # the client through which rank 0's engine drives the samplers

    def join_group(self, ends: Ends, client: Any, host: str, port: int) -> None:
        self._client = client
        info = trainer_init_info(self.sampler_backend(), rank=ends.rank, host=host, port=port,
                                 world_size=1 + client.workers, bucket_bytes=ends.cfg.weights.bucket_mb * 2**20,
                                 largest_bytes=largest_tensor_bytes(ends.learner.engine.module))
        self._engine = trainer_engine(info, client, learner_source(ends.learner))

    def publish(self, ends: Ends, keep_versions: list[int]) -> Published:
        """One weight update through the transfer engine (every learner rank calls it together)."""
        started = time.perf_counter()
        self._client.version = ends.learner.version
        self._engine.send_weights()
        return Published(version=ends.learner.version, seconds=time.perf_counter() - started)

    def leave_group(self, ends: Ends) -> None:
        if ends.sampler is not None:
            ends.sampler.shutdown_transfer()
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


class BroadcastTransport(VLLMTransferTransport):
    kind = "broadcast"

    def sampler_backend(self) -> str:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"


class CudaIpcTransport(VLLMTransferTransport):
    kind = "cuda_ipc"

    def sampler_backend(self) -> str:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("weights.transport=cuda_ipc needs a CUDA device")
        return "ipc"


def register_backends() -> None:
    """Make our backends known to vLLM's factories (idempotent; before an LLM or a trainer engine is made): gloo
    (broadcast on CPU) and grpo (`grpo serve`: files or gloo). The ``vllm.general_plugins`` entry point runs this in
    every vLLM process, including a server's engine-core workers."""
    from grpo_core.weights import gloo, server_engine

    gloo.register()
    server_engine.register()


def largest_tensor_bytes(module: "torch.nn.Module") -> int:
    """Bytes of the module's largest parameter (its full shape under ZeRO-3, where ``ds_shape`` holds it)."""
    return max(math.prod(getattr(p, "ds_shape", p.shape)) * p.element_size() for p in module.parameters())


def trainer_init_info(backend: str, *, rank: int, host: str, port: int, world_size: int, bucket_bytes: int,
                      largest_bytes: int = 0):
    """The trainer-side init info of ``backend``: rank 0 sends; ``world_size`` counts it and every vLLM worker.
    vLLM's IPC producer refuses a tensor larger than its buffer (NCCL's only warns), so the IPC buffer is at least
    ``largest_bytes`` (an embedding of 151936 x 896 bf16 is 260 MiB)."""
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(master_address=host, master_port=port, world_size=world_size, rank=rank,
                                   packed=True, packed_buffer_size_bytes=bucket_bytes)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True,
                                  packed_buffer_size_bytes=max(bucket_bytes, largest_bytes))
    if backend == "gloo":
        from grpo_core.weights.gloo import GlooTrainerInitInfo

        return GlooTrainerInitInfo(master_address=host, master_port=port, world_size=world_size, rank=rank,
                                   bucket_bytes=bucket_bytes)
    raise ValueError(f"unknown weight-transfer backend {backend!r}")


def trainer_engine(init_info, client, source):
    """vLLM's trainer-side engine for ``init_info``'s backend, rendezvoused with the workers."""
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    register_backends()
    engine_cls = WeightTransferTrainerFactory._registry[init_info.backend]()
    return engine_cls.trainer_init(init_info, client=client, source=source)


def learner_source(learner) -> Any:
    """The learner's weights as a vLLM ``WeightSource`` (HF names, full tensors; ZeRO-3 gathered on every rank).
    With tied embeddings the output layer IS the embedding: lm_head.weight is not sent."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    tied = learner.tied_output

    class LearnerSource(WeightSource):
        """One round = ``metadata()`` (some backends) then one iteration; the gathered list serves both."""

        def __init__(self) -> None:
            self._round: list[tuple[str, torch.Tensor]] | None = None

        def _named(self) -> list[tuple[str, torch.Tensor]]:
            if self._round is None:
                self._round = [(n, t) for n, t in learner.named_weights() if not (tied and n == "lm_head.weight")]
            return self._round

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name=n, dtype=t.dtype, shape=tuple(t.shape)) for n, t in self._named()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            named, self._round = self._named(), None
            return iter(named)

    return LearnerSource()
