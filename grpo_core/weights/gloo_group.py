"""The gloo collective under the ``gloo`` weight-transfer engines: a standalone group and the packed-bucket broadcast.

Why a module of its own: this is the part that moves bytes between processes, and it is the same on both ends of a
sync; the vLLM plugins of ``grpo_core.weights.gloo`` only drive it from vLLM's weight-transfer lifecycle.

The group is NOT a default process group (vLLM owns the default group in the sampler process, DeepSpeed in the
learner): a ``TCPStore`` served by the trainer from a socket it binds itself, and a ``ProcessGroupGloo`` whose device
is bound to an explicit address. Nothing listens beyond the addresses given in the init info.

Wire format: the packed buckets of vLLM's packed NCCL producer/consumer (``pack_tensors`` / ``unpack_tensor`` of
``vllm.distributed.weight_transfer.packed_tensor`` are reused; their producer/consumer loops are CUDA-stream code).
A bucket closes once it holds MORE than ``bucket_bytes`` (so a tensor larger than the bucket travels alone, with
whatever preceded it); both sides cut the stream by that rule from the per-round metadata. ``num_buffers`` buckets
are in flight at once: the trainer packs the next while the previous travels, the worker receives the next while it
loads the previous.
"""
from __future__ import annotations

import datetime
import logging
import socket
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightTransferUpdateInfo
from vllm.distributed.weight_transfer.packed_tensor import pack_tensors, unpack_tensor

from grpo_core.infra.netaddr import listening_socket, local_address_towards

DEFAULT_TIMEOUT_S = 600.0
STORE_PREFIX = "grpo-weights-gloo/"

logger = logging.getLogger(__name__)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dtype


def _nbytes(shape: list[int], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n * dtype.itemsize


def bucket_plan(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices per bucket, cut exactly as vLLM's ``pack_tensors`` cuts: a bucket closes after the tensor that takes
    it over ``bucket_bytes``."""
    plan: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        current.append(i)
        total += size
        if total > bucket_bytes:
            plan.append(current)
            current, total = [], 0
    if current:
        plan.append(current)
    return plan


# ------------------------------------------------------------------------------------------------------ the group

class GlooGroup:
    """A standalone gloo group: TCPStore + PrefixStore + ``ProcessGroupGloo`` (never the default group).

    Rank 0 serves the store from a socket bound to ``(address, port)`` (``port=0``: a free one, see ``self.port``);
    its gloo device binds ``address`` too. Other ranks connect to the store and bind their device on
    ``bind_address``.
    """

    def __init__(self, *, address: str, port: int, rank: int, world_size: int, bind_address: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, listen_socket: socket.socket | None = None) -> None:
        from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        if rank == 0:
            sock = listen_socket or listening_socket(address, port)
            self.port = sock.getsockname()[1]
            # The store serves from OUR socket: TCPStore alone would listen on every interface.
            self.store = TCPStore(address, self.port, world_size=world_size, is_master=True, timeout=timeout,
                                  wait_for_workers=False, master_listen_fd=sock.detach())
            self.bind_address = address
        else:
            self.port = port
            self.store = TCPStore(address, port, world_size=world_size, is_master=False, timeout=timeout,
                                  wait_for_workers=False)
            self.bind_address = bind_address or local_address_towards(address)
        options = ProcessGroupGloo._Options()
        # Without an explicit device gloo resolves the machine's hostname and binds whatever that gives.
        options._devices = [ProcessGroupGloo.create_device(hostname=self.bind_address)]
        options._timeout = timeout
        self.pg = ProcessGroupGloo(PrefixStore(STORE_PREFIX, self.store), rank, world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int = 0):
        """Start a broadcast of ``tensor`` from ``src``; returns the gloo ``Work`` (call ``.wait()``)."""
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        return self.pg.broadcast([tensor], opts)

    def close(self) -> None:
        pg, self.pg = getattr(self, "pg", None), None
        if pg is not None:
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - a peer that is already gone must not stop the teardown
                logger.debug("gloo group shutdown failed", exc_info=True)
        self.store = None


# ------------------------------------------------------------------------------------- packed-bucket broadcast

def packed_gloo_broadcast_producer(pairs: Iterator[tuple[str, torch.Tensor]], group: GlooGroup, *,
                                   bucket_bytes: int, num_buffers: int) -> dict[str, float]:
    """Rank 0: pack ``pairs`` into buckets (vLLM's ``pack_tensors``) and broadcast them, ``num_buffers`` in flight.
    Returns counts and timings: buckets, bytes, pack_seconds (reading the source + packing), wait_seconds."""
    in_flight: deque = deque()
    stats = {"buckets": 0.0, "bytes": 0.0, "pack_seconds": 0.0, "wait_seconds": 0.0}
    clock = time.perf_counter
    while True:
        t0 = clock()
        chunk = pack_tensors(pairs, lambda item: item[1], bucket_bytes)
        stats["pack_seconds"] += clock() - t0
        if chunk is None:
            break
        in_flight.append((group.broadcast(chunk.packed_tensor), chunk))
        stats["buckets"] += 1
        stats["bytes"] += chunk.packed_tensor.numel()
        while len(in_flight) >= num_buffers:
            t0 = clock()
            in_flight.popleft()[0].wait()
            stats["wait_seconds"] += clock() - t0
    t0 = clock()
    while in_flight:
        in_flight.popleft()[0].wait()
    stats["wait_seconds"] += clock() - t0
    return stats


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """Per-round metadata (same shape as vLLM's NCCL update info): every parameter that follows, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"names/dtype_names/shapes differ in length: {len(self.names)}, "
                             f"{len(self.dtype_names)}, {len(self.shapes)}")

    @classmethod
    def from_meta(cls, meta: list[ParamMeta]) -> "GlooWeightTransferUpdateInfo":
        return cls(names=[m.name for m in meta], dtype_names=[_dtype_name(m.dtype) for m in meta],
                   shapes=[list(m.shape) for m in meta])


def packed_gloo_broadcast_consumer(info: GlooWeightTransferUpdateInfo, group: GlooGroup, load, *,
                                   bucket_bytes: int, num_buffers: int) -> dict[str, float]:
    """A worker: receive the buckets ``info`` announces and call ``load(list of (name, tensor))`` per bucket, with the
    next ``num_buffers - 1`` buckets already on their way. Every bucket gets a fresh buffer: vLLM's layerwise reload
    keeps views of loaded tensors until their whole layer has arrived. Returns counts and timings: buckets, bytes,
    wait_seconds (receiving), load_seconds (``load``)."""
    dtypes = [_dtype(n) for n in info.dtype_names]
    sizes = [_nbytes(s, d) for s, d in zip(info.shapes, dtypes)]
    plan = bucket_plan(sizes, bucket_bytes)
    pending: deque = deque()
    stats = {"buckets": float(len(plan)), "bytes": 0.0, "wait_seconds": 0.0, "load_seconds": 0.0}
    clock = time.perf_counter

    def post(indices: list[int]) -> None:
        buf = torch.empty(sum(sizes[i] for i in indices), dtype=torch.uint8)
        pending.append((group.broadcast(buf), buf, indices))

    nxt = 0
    while nxt < len(plan) and len(pending) < num_buffers:
        post(plan[nxt])
        nxt += 1
    while pending:
        work, buf, indices = pending.popleft()
        t0 = clock()
        work.wait()
        t1 = clock()
        if nxt < len(plan):
            post(plan[nxt])
            nxt += 1
        stats["bytes"] += buf.numel()
        load(unpack_tensor(buf, [info.names[i] for i in indices], [info.shapes[i] for i in indices],
                           [dtypes[i] for i in indices], [sizes[i] for i in indices]))
        stats["wait_seconds"] += t1 - t0
        stats["load_seconds"] += clock() - t1
    return stats
