"""What each weight transport can do, as a table: the config's checks read it without importing a transport.

Why a table apart from the classes (``grpo_core.weights``): the config checks a run before any engine exists, and
the transport classes import the learner and the sampler (which import the config). Keeping their capabilities
here, import-free, is what lets ``grpo_core.config`` import nothing above it; each class reads its row
(``Transport.__init_subclass__``), so the table is the one statement of what a kind can do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_core.config import GRPOConfig


@dataclass(frozen=True)
class TransportKind:
    """One ``weights.transport`` kind's capabilities."""
    kind: str
    placements: tuple[str, ...]  # cluster.placement values it works in
    refusal: str  # why it refuses another placement ({placement} is filled in)
    carries_adapter: bool = True  # carries a LoRA adapter alone (model.lora)
    forms_group: bool = False  # learner rank 0 and the samplers' vLLM workers form a transfer group
    needs_cuda: bool = False  # moves weights through CUDA memory: both roles need GPUs
    keeps_serving_versions: bool = False  # publish keeps the versions the samplers still serve, drops the others

    def check(self, cfg: "GRPOConfig") -> None:
        """Raise ValueError when the config asks this kind for something it cannot do."""
        c = cfg.cluster
        if c.placement not in self.placements:
            raise ValueError(cfg.placement.transport_refusal(self.kind) or self.refusal.format(placement=c.placement))
        if cfg.model.lora is not None and not self.carries_adapter:
            raise ValueError(f"model.lora is set: each sync ships only the adapter, which weights.transport="
                             f"{self.kind} cannot carry (it streams full weights into vLLM); use files "
                             "(placement=split; auto picks it) or inprocess (placement=colocate)")
        if self.needs_cuda and (c.sampler_resources.num_gpus <= 0 or c.learner_resources.num_gpus <= 0):
            raise ValueError(f"weights.transport={self.kind} shares GPU memory between a learner and a sampler on "
                             "the same GPU: set cluster.sampler_resources.num_gpus and "
                             "cluster.learner_resources.num_gpus (fractions, e.g. 0.5 each)")


_SEPARATE = ("weights.transport={kind} moves weights between separate actors: it needs cluster.placement={needs} "
             "(colocated actors use inprocess)")

TRANSPORT_KINDS: dict[str, TransportKind] = {k.kind: k for k in (
    TransportKind("inprocess", ("colocate",),
                  "weights.transport=inprocess needs sampler and learner in one actor (cluster.placement=colocate), "
                  "not placement={placement}; use broadcast or files"),
    TransportKind("files", ("colocate", "split", "external"), "weights.transport=files works in every placement",
                  keeps_serving_versions=True),
    TransportKind("broadcast", ("split", "external"), _SEPARATE.format(kind="broadcast", needs="split or external"),
                  carries_adapter=False, forms_group=True),
    TransportKind("cuda_ipc", ("split",), _SEPARATE.format(kind="cuda_ipc", needs="split"),
                  carries_adapter=False, forms_group=True, needs_cuda=True),
)}


def transport_kind(kind: str) -> TransportKind:
    """The capabilities of a resolved ``weights.transport``."""
    if kind not in TRANSPORT_KINDS:
        raise ValueError(f"weights.transport={kind!r}: expected one of {sorted(TRANSPORT_KINDS)} or auto")
    return TRANSPORT_KINDS[kind]
