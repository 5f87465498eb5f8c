"""A gloo weight-transfer engine for vLLM 0.32's RL weight-transfer API: the ``broadcast`` transport on CPU.

vLLM's own engines (``nccl``, ``ipc``, ...) need a GPU. This module adds ``gloo`` on the same API, modelled on
``vllm.distributed.weight_transfer.nccl_engine``:

* ``GlooWeightTransferEngine`` runs inside the vLLM worker. ``init_transfer_engine`` joins a standalone gloo
  group (trainer = rank 0, worker = ``rank_offset`` + its global worker rank); ``start_weight_update`` /
  ``finish_weight_update`` run vLLM's layerwise reload lifecycle; ``receive_weights`` receives the packed buckets
  and feeds them to ``model.load_weights``.
* ``GlooTrainerWeightTransferEngine`` runs in the trainer: ``trainer_init`` opens rank 0 while the client drives the
  workers' init; ``send_weights`` = ``client.start_weight_update``, ``client.update_weights`` (in a thread,
  concurrently with the broadcast), ``client.finish_weight_update``.
* ``register()`` adds both under the backend name ``gloo`` to vLLM's worker-side and trainer-side factories.

The group itself and the wire format (packed buckets, ``num_buffers`` in flight) are in
``grpo_core.weights.gloo_group``; this module is what vLLM loads by name (``register()`` records this module's path),
so the engine classes stay here.

CPU rules (see STACK.md) hold inside the worker: the trainer sends the FULL state dict every time (a partial update of
a fused qkv/gate_up layer corrupts it), and with tied embeddings the packed CPU lm_head is rebuilt after the reload.
With tied embeddings the worker also drops ``lm_head.weight`` if a trainer sends it (it IS the embedding; the sampler
knows whether its model is tied, the trainer's source need not). ``ModuleSource(hf_model)`` never yields it anyway:
``named_parameters()`` lists a shared parameter once.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
)

from grpo_core.infra.netaddr import listening_socket
from grpo_core.weights.gloo_group import (
    DEFAULT_TIMEOUT_S,
    GlooGroup,
    GlooWeightTransferUpdateInfo,
    bucket_plan,
    packed_gloo_broadcast_consumer,
    packed_gloo_broadcast_producer,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

BACKEND = "gloo"
DEFAULT_BUCKET_BYTES = 64 * 2**20  # the project's weights.bucket_mb default
DEFAULT_NUM_BUFFERS = 2
TIED_LM_HEAD = "lm_head.weight"

logger = logging.getLogger(__name__)

__all__ = [
    "BACKEND",
    "DEFAULT_BUCKET_BYTES",
    "GlooTrainerInitInfo",
    "GlooTrainerWeightTransferEngine",
    "GlooWeightTransferEngine",
    "GlooWeightTransferInitInfo",
    "GlooWeightTransferUpdateInfo",
    "GlooGroup",
    "bucket_plan",
    "register",
]


# ------------------------------------------------------------------------------------------------- init/update info

@dataclass(kw_only=True)
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker-side init info (the dict a client passes to ``init_weight_transfer_engine``).

    ``master_address``/``master_port``: the trainer's TCPStore (rank 0 serves it). ``rank_offset``: the group rank of
    this engine's worker 0 (1 with a single trainer sender). ``world_size``: trainer + every worker of every engine.
    ``bind_address``: the local address the worker's gloo device binds; None = the local address that routes to
    ``master_address`` (127.0.0.1 when the master is on loopback). Bucket geometry is set by the trainer.
    """

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    num_buffers: int = DEFAULT_NUM_BUFFERS
    bind_address: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.bucket_bytes <= 0 or self.num_buffers <= 0:
            raise ValueError(f"bucket_bytes and num_buffers must be positive: {self.bucket_bytes}, {self.num_buffers}")
        if not 0 < self.rank_offset < self.world_size:
            raise ValueError(f"rank_offset {self.rank_offset} outside 1..world_size-1 ({self.world_size})")


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info. ``master_port=0`` picks a free port (read it back as ``engine.master_port``); the
    trainer serves the store and binds its gloo device on ``master_address``, so use a concrete address (127.0.0.1
    on one machine, the trainer's own interface address across machines), never 0.0.0.0. ``world_size`` = 1 +
    the number of vLLM workers (TP x DP x engines). ``rank`` (keyword) is this trainer's rank; 0 sends."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    num_buffers: int = DEFAULT_NUM_BUFFERS
    timeout_s: float = DEFAULT_TIMEOUT_S


# ----------------------------------------------------------------------------------------------- worker side (vLLM)

def _is_tied(model_config: Any) -> bool:
    hf_config = getattr(model_config, "hf_config", None)
    return bool(getattr(hf_config, "tie_word_embeddings", False))


class LayerwiseReloadMixin:
    """vLLM's layerwise reload lifecycle with the CPU rules, for engines that receive checkpoint-format weights.

    ``start_weight_update`` -> ``initialize_layerwise_reload``; loads go through ``_load`` (drops a tied
    ``lm_head.weight``); ``finish_weight_update`` -> ``finalize_layerwise_reload``, then the packed CPU lm_head of a
    tied model is rebuilt (``grpo_core.engine.rollout.worker_ext.refresh_tied_lm_head``)."""

    model: torch.nn.Module
    model_config: Any

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self._loaded_tensors = 0
        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        self._finalize()

    def _finalize(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        from grpo_core.engine.rollout.worker_ext import refresh_tied_lm_head

        # Layers that received nothing warn "Failed to load weights" on every sync: the rotary embedding (no
        # weights) and, tied, the lm_head (its weight IS the embedding, rebuilt below). Expected, so quieted.
        reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        level = reload_log.level
        reload_log.setLevel(logging.ERROR)
        try:
            finalize_layerwise_reload(self.model, self.model_config)
        finally:
            reload_log.setLevel(level)
        refresh_tied_lm_head(self.model)

    def _load(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if _is_tied(self.model_config):
            weights = [(n, t) for n, t in weights if n != TIED_LM_HEAD]
        if weights:
            self.model.load_weights(weights)
            self._loaded_tensors = getattr(self, "_loaded_tensors", 0) + len(weights)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """One update. On failure the reload is finalized before the error propagates, so the model never stays on
        vLLM's meta-device placeholders: with nothing loaded yet it keeps serving the previous weights."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            loaded = getattr(self, "_loaded_tensors", 0)
            try:
                self._finalize()
            except Exception:  # noqa: BLE001 - the original error matters more
                logger.exception("could not finalize the weight reload after a failed update")
            if loaded:
                logger.error("weight update failed after %d tensors were loaded: the model mixes two versions "
                             "until the next full update", loaded)
            raise
        # The base class ends with torch.accelerator.synchronize(), which raises on a machine without an
        # accelerator; our receives have completed when they return.
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()


class GlooWeightTransferEngine(LayerwiseReloadMixin,
                               WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """vLLM worker side of the gloo transport (created by vLLM's factory when ``weight_transfer_config.backend`` is
    ``gloo``; ``register()`` must have run in the worker's process)."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config: "WeightTransferConfig", vllm_config: "VllmConfig", device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: GlooGroup | None = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES
        self.num_buffers = DEFAULT_NUM_BUFFERS
        self.last_receive: dict[str, float] = {}

    def group_rank(self, init_info: GlooWeightTransferInitInfo) -> int:
        """``rank_offset`` + this worker's rank across every data-parallel replica (as vLLM's NCCL engine)."""
        pc = self.parallel_config
        return pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        if self.group is not None:
            self.shutdown()
        self.bucket_bytes = init_info.bucket_bytes
        self.num_buffers = init_info.num_buffers
        self.group = GlooGroup(address=init_info.master_address, port=init_info.master_port,
                               rank=self.group_rank(init_info), world_size=init_info.world_size,
                               bind_address=init_info.bind_address, timeout_s=init_info.timeout_s)

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialized: call init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        started = time.perf_counter()
        with disable_mtp_completeness_check():
            stats = packed_gloo_broadcast_consumer(update_info, self.group, self._load,
                                                   bucket_bytes=self.bucket_bytes, num_buffers=self.num_buffers)
        self.last_receive = {"seconds": time.perf_counter() - started, **stats}

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


# -------------------------------------------------------------------------------------------------- trainer side

def checked_iter(source: WeightSource, meta: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's pairs, each checked against the metadata the workers were told (they cut buckets from it)."""
    sent = 0
    for name, tensor in source:
        if sent >= len(meta):
            raise ValueError(f"WeightSource yielded more than the {len(meta)} parameters of metadata(): {name!r}")
        m = meta[sent]
        if name != m.name or tensor.dtype != m.dtype or tuple(tensor.shape) != tuple(m.shape):
            raise ValueError(f"WeightSource iteration disagrees with metadata() at {sent}: declared {m.name!r} "
                             f"{m.dtype} {tuple(m.shape)}, got {name!r} {tensor.dtype} {tuple(tensor.shape)}")
        sent += 1
        yield name, tensor.detach().cpu()
    if sent != len(meta):
        raise ValueError(f"WeightSource yielded {sent} parameters, metadata() declared {len(meta)}")


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side. Construct with ``WeightTransferTrainerFactory.trainer_init(GlooTrainerInitInfo(...,
    rank=0), client=client, source=ModuleSource(model))`` (after ``register()``), or this class's ``trainer_init``.
    Then ``send_weights()`` per sync (``weight_version`` optional), ``shutdown()`` at the end.

    ``client`` is any ``VLLMWeightSyncClient`` (four methods: ``init_weight_transfer_engine(init_info: dict)``,
    ``start_weight_update()``, ``update_weights(update_info: dict)``, ``finish_weight_update(weight_version=None)``);
    ``init_weight_transfer_engine`` and ``update_weights`` must BLOCK until the workers are done (they are called on
    a side thread while this process runs its half of the rendezvous / broadcast).
    """

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, is_sender: bool = True,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, num_buffers: int = DEFAULT_NUM_BUFFERS) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = bucket_bytes
        self.num_buffers = num_buffers
        self.group: GlooGroup | None = None
        self.master_address: str | None = None
        self.master_port: int | None = None
        self.last_send: dict[str, float] = {}

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient,
                     source: WeightSource | None = None) -> "GlooTrainerWeightTransferEngine":
        if source is None:
            raise ValueError("the gloo trainer engine needs a WeightSource (e.g. ModuleSource(model))")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     bucket_bytes=init_info.bucket_bytes, num_buffers=init_info.num_buffers)
        if not engine.is_sender:
            return engine  # only joins the trainer-side iteration in send_weights
        sock = listening_socket(init_info.master_address, init_info.master_port)  # port known before the workers hear
        engine.master_address = init_info.master_address
        engine.master_port = sock.getsockname()[1]
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address, master_port=engine.master_port, rank_offset=1,
            world_size=init_info.world_size, bucket_bytes=init_info.bucket_bytes,
            num_buffers=init_info.num_buffers, timeout_s=init_info.timeout_s)
        # The workers block in init_weight_transfer_engine until the group is complete: drive them from a thread
        # while this thread opens rank 0.
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            future = exe.submit(engine.client.init_weight_transfer_engine, asdict(worker_info))
            try:
                engine.group = GlooGroup(address=init_info.master_address, port=engine.master_port, rank=0,
                                         world_size=init_info.world_size, timeout_s=init_info.timeout_s,
                                         listen_socket=sock)
            except BaseException:
                sock.close()
                if future.done():
                    future.result()  # the workers' error explains ours
                raise
            future.result()
        finally:
            exe.shutdown(wait=False)  # after a failure the workers may wait out their timeout: do not join
        return engine

    def send_weights(self, weight_version: str | None = None) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:  # a collective gather on sharded trainers: every rank iterates
                pass
            return
        if self.group is None:
            raise RuntimeError("trainer_init() first (or the engine was shut down)")
        started = time.perf_counter()
        update_info = asdict(GlooWeightTransferUpdateInfo.from_meta(meta))
        self.client.start_weight_update()
        exe = ThreadPoolExecutor(max_workers=1)
        try:
            future = exe.submit(self.client.update_weights, update_info)
            if future.done():
                future.result()
            stats = packed_gloo_broadcast_producer(checked_iter(self.source, meta), self.group,
                                                   bucket_bytes=self.bucket_bytes, num_buffers=self.num_buffers)
            broadcast_done = time.perf_counter()
            future.result()  # the workers' errors; returns once they loaded the last bucket
            sent = time.perf_counter()
        finally:
            # If the broadcast failed the workers are stuck in the matching receive until the gloo timeout:
            # do not join that thread here.
            exe.shutdown(wait=False)
        self.client.finish_weight_update(weight_version)
        done = time.perf_counter()
        self.last_send = {"seconds": done - started, "broadcast_seconds": broadcast_done - started,
                          "update_seconds": sent - started, "finish_seconds": done - sent,
                          "tensors": float(len(meta)), **stats}

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


# ---------------------------------------------------------------------------------------------------- registration

def register() -> None:
    """Register ``gloo`` with vLLM's worker-side and trainer-side factories; idempotent, any process, any time
    before the engine is created (``LLM(..., weight_transfer_config={"backend": "gloo"})`` creates the worker engine
    in the worker's ``load_model``). Registration is lazy (module path + class name), as vLLM registers its own
    engines: the path is this module's, so the engine classes must stay defined here. vLLM's factories raise on a
    second registration of a name, so this checks first. With vLLM's multiprocess executor the worker processes
    must run it too (a ``vllm.general_plugins`` entry point, or an import in the worker extension's module)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "GlooWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, __name__, "GlooTrainerWeightTransferEngine")
