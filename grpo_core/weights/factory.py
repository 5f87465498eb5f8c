"""The one place a weight transport is chosen: every kind's class by its ``weights.transport`` name.

Apart from ``transport.py`` so that the kinds import the interface and nothing imports back (no import circle).
"""
from __future__ import annotations

from grpo_core.config.transport_kinds import transport_kind
from grpo_core.weights.files import FilesTransport
from grpo_core.weights.inprocess import InProcessTransport
from grpo_core.weights.transfer import BroadcastTransport, CudaIpcTransport
from grpo_core.weights.transport import Transport


def transport_classes() -> dict[str, type[Transport]]:
    """Every kind by its ``weights.transport`` name."""
    return {cls.kind: cls for cls in (InProcessTransport, FilesTransport, BroadcastTransport, CudaIpcTransport)}


def make_transport(kind: str) -> Transport:
    """The transport of a resolved ``weights.transport`` (``GRPOConfig.transport``)."""
    return transport_classes()[transport_kind(kind).kind]()
