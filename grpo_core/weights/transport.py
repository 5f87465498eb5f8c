"""How a new policy version reaches the samplers: one interface, one class per kind, chosen in one place.

A transport has a learner side, run in every learner rank's actor after an update (``publish``: make version N
available, by pushing it into the colocated sampler, writing it to the run store, or streaming it to a transfer
group), and a sampler side, run in every sampler actor afterwards (``receive``: take version N from where
``publish`` left it; a kind that pushes has nothing to do there). The driver (``grpo_core.cluster.engines``) calls
``publish`` on every learner rank and then ``receive`` on every sampler, whatever the kind; the version a sampler
serves is its engine's own ``version``.

What a kind can do (the placements it works in, whether it carries a LoRA adapter, whether the samplers form a
transfer group with learner rank 0, whether it needs CUDA) is its row of ``grpo_core.config.transport_kinds``, an
import-free table the config's checks read; each class here carries its row's values, so the driver asks the
transport what it can do, never its name.

LoRA is a payload, not a route: ``inprocess`` and ``files`` carry the adapter alone when ``model.lora`` is set
(the learner's snapshot is the adapter); ``broadcast`` and ``cuda_ipc`` stream full state dicts into vLLM's
weights and refuse it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from grpo_core.config.transport_kinds import TransportKind, transport_kind


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
    store: Any  # grpo_core.run.storage.RunStore
    learner: Any = None  # grpo_core.engine.train.learner.Learner
    sampler: Any = None  # grpo_core.engine.rollout.sampler.VLLMSampler or grpo_core.engine.rollout.server.ServerSampler
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
    """A weight transport (``weights.transport``). A subclass names its ``kind``; what the kind can do is read from
    its row of ``grpo_core.config.transport_kinds`` (the table the config's checks read). Subclasses implement
    ``publish`` (and ``receive`` where the samplers pull)."""

    kind: ClassVar[str]
    capabilities: ClassVar[TransportKind]
    placements: ClassVar[tuple[str, ...]] = ()
    carries_adapter: ClassVar[bool] = True
    forms_group: ClassVar[bool] = False
    needs_cuda: ClassVar[bool] = False
    keeps_serving_versions: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:  # a concrete kind: its capabilities are its table row's
            cls.capabilities = transport_kind(cls.kind)
            for name in ("placements", "carries_adapter", "forms_group", "needs_cuda", "keeps_serving_versions"):
                setattr(cls, name, getattr(cls.capabilities, name))

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

