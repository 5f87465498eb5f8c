"""How a new policy version reaches the samplers: one interface, one class per kind, chosen in one place.

A transport has a learner side, run in every learner rank's actor after an update (``publish``: make version N
available, by pushing it into the colocated sampler, writing it to the run store, or streaming it to a transfer
group), and a sampler side, run in every sampler actor afterwards (``receive``: take version N from where
``publish`` left it; a kind that pushes has nothing to do there). The driver (``grpo_core.cluster.engines``) calls
``publish`` on every learner rank and then ``receive`` on every sampler, whatever the kind; the version a sampler
serves is its engine's own ``version``.

What a kind can do is stated on its class (the placements it works in, whether it carries a LoRA adapter, whether
the samplers form a transfer group with learner rank 0, whether it needs CUDA), and the config's cross-field checks
ask the class (``Transport.check``) instead of naming kinds. ``grpo_core.config`` imports this module, so the kind
modules keep torch and vLLM imports inside their methods.

LoRA is a payload, not a route: ``inprocess`` and ``files`` carry the adapter alone when ``model.lora`` is set
(the learner's snapshot is the adapter); ``broadcast`` and ``cuda_ipc`` stream full state dicts into vLLM's
weights and refuse it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from grpo_core.config import GRPOConfig


@dataclass
class Published:
    """What one learner rank's ``publish`` did: the version it made available, how long it took, and (where the
    kind knows them) the bytes moved and whether anything was written."""
    version: int
    seconds: float
    bytes: float | None = None
    wrote: bool = True


@dataclass
class Ends:
    """One actor's ends of a transport: its learner rank and its sampler (either may be ``None``), the run store
    and the run's config."""
    cfg: Any  # GRPOConfig
    store: Any  # grpo_core.storage.RunStore
    learner: Any = None  # grpo_core.train.learner.Learner
    sampler: Any = None  # grpo_core.rollout.sampler.VLLMSampler or grpo_core.rollout.server.ServerSampler
    rank: int | None = None

    def joins_gather_only(self) -> bool:
        """On a learner rank other than 0: take part in gathering the full weights (ZeRO-3's collective) and do
        nothing else. Rank 0 (and a sampler-only actor) goes on."""
        if self.rank is None or self.rank == 0:
            return False
        if self.cfg.train.zero_stage == 3:
            self.learner.named_weights()
        return True


class Transport(ABC):
    """A weight transport (``weights.transport``). Subclasses set the class attributes and implement ``publish``
    (and ``receive`` where the samplers pull)."""

    kind: ClassVar[str]
    # cluster.placement values it works in
    placements: ClassVar[tuple[str, ...]]
    # carries a LoRA adapter alone (model.lora)
    carries_adapter: ClassVar[bool] = True
    # the samplers' vLLM workers and learner rank 0 form a transfer group, formed again when the samplers change
    forms_group: ClassVar[bool] = False
    # moves weights through CUDA memory: both roles need GPUs
    needs_cuda: ClassVar[bool] = False
    # publish keeps the versions the samplers still serve (``keep_versions``) and drops the others
    keeps_serving_versions: ClassVar[bool] = False

    # ------------------------------------------------------------------------------------------ config rules
    def check(self, cfg: "GRPOConfig") -> None:
        """Raise ValueError when the config asks this kind for something it cannot do."""
        c = cfg.cluster
        if c.placement not in self.placements:
            raise ValueError(self.placement_error(c.placement))
        if cfg.model.lora is not None and not self.carries_adapter:
            raise ValueError(f"model.lora is set: each sync ships only the adapter, which weights.transport="
                             f"{self.kind} cannot carry (it streams full weights into vLLM); use files "
                             "(placement=split; auto picks it) or inprocess (placement=colocate)")
        if self.needs_cuda and (c.sampler_resources.num_gpus <= 0 or c.learner_resources.num_gpus <= 0):
            raise ValueError(f"weights.transport={self.kind} shares GPU memory between a learner and a sampler on "
                             "the same GPU: set cluster.sampler_resources.num_gpus and "
                             "cluster.learner_resources.num_gpus (fractions, e.g. 0.5 each)")

    def placement_error(self, placement: str) -> str:
        if placement == "external":
            return (f"weights.transport={self.kind} cannot reach a server process: use files (the server reads "
                    "weights/v-N/ from the run store) or broadcast (gloo)")
        return f"weights.transport={self.kind} does not work with cluster.placement={placement}"

    # ----------------------------------------------------------------------------------------- engine sides
    def sampler_backend(self) -> str | None:
        """The vLLM weight-transfer backend a sampler's engine is built with (``None``: it needs none)."""
        return None

    @abstractmethod
    def publish(self, ends: Ends, keep_versions: list[int]) -> Published | None:
        """Learner side, on every learner rank together: make the learner's current version available to the
        samplers. ``keep_versions``: the versions the samplers serve now (what a store of versions must keep).
        Returns ``None`` on a rank that only joined a collective."""

    def receive(self, ends: Ends, version: int) -> None:
        """Sampler side, after ``publish``: serve ``version``. Kinds that push leave this empty."""

    def join_group(self, ends: Ends, client: Any, host: str, port: int) -> None:
        """Learner side of a transfer group (``forms_group`` kinds): every rank builds its trainer-side engine,
        rank 0 rendezvouses with the samplers' workers through ``client``."""
        raise NotImplementedError(f"weights.transport={self.kind} forms no transfer group")

    def leave_group(self, ends: Ends) -> None:
        """Leave the transfer group (before it is formed again with other samplers)."""


def auto_kind(placement: str, lora: bool) -> str:
    """What ``weights.transport: auto`` means: inprocess colocated, broadcast split, files for LoRA split
    (the adapter is a few MiB of files; vLLM's broadcast engines send full weights) and for external servers
    (they reach the run store from any host)."""
    if placement == "colocate":
        return "inprocess"
    if placement == "external" or lora:
        return "files"
    return "broadcast"


def transport_classes() -> dict[str, type[Transport]]:
    """Every kind by its ``weights.transport`` name."""
    from grpo_core.weights.files import FilesTransport
    from grpo_core.weights.inprocess import InProcessTransport
    from grpo_core.weights.transfer import BroadcastTransport, CudaIpcTransport

    return {cls.kind: cls for cls in (InProcessTransport, FilesTransport, BroadcastTransport, CudaIpcTransport)}


def make_transport(kind: str) -> Transport:
    """The transport of a resolved ``weights.transport`` (``GRPOConfig.transport``)."""
    classes = transport_classes()
    if kind not in classes:
        raise ValueError(f"weights.transport={kind!r}: expected one of {sorted(classes)} or auto")
    return classes[kind]()
