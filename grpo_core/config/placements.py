"""Where the samplers run: one class per ``cluster.placement``, chosen here and nowhere else.

A placement states what it means for the rest of the run: which actors Ray places (``roles``), whether the samplers
are the learner ranks' own actors or servers outside the run, whether it can sample while the learner trains, how
many samplers a config means when it does not say, which weight transport ``auto`` picks, and its rules across the
config's sections (``check``). The driver side asks these questions instead of comparing names: the cluster layer
keeps one sampler fleet class per placement (``grpo_core.cluster.fleet``), the config asks ``check``, the CLI asks
``scale_refusal``.

Import-free on purpose (only the standard library): ``grpo_core.config`` imports this module, so nothing here may
import the config, the transports or the engines.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from grpo_core.config import GRPOConfig
    from grpo_core.config import ClusterConfig, RoleResources


class Placement:
    """One ``cluster.placement``. Subclasses set the class attributes and override what differs."""

    kind: ClassVar[str]
    # each actor holds a sampler and a learner rank (a sampler's death is a learner rank's)
    samplers_are_learners: ClassVar[bool] = False
    # each sampler actor is the client of a `grpo serve` server outside the run
    samplers_are_servers: ClassVar[bool] = False

    def roles(self, cluster: "ClusterConfig") -> list[tuple[str, int, "RoleResources"]]:
        """(role, actor count, resources per actor) of the actors Ray places, in placement-group order."""
        return [("sampler", cluster.samplers, cluster.sampler_resources),
                ("learner", cluster.learners, cluster.learner_resources)]

    def sampler_resources_field(self) -> str:
        """The ``cluster.*_resources`` field that reserves a sampler's devices."""
        return "sampler_resources"

    def default_samplers(self, cluster: dict[str, Any]) -> int | None:
        """``cluster.samplers`` when the config does not set it (None: the field's own default)."""
        return None

    def auto_transport(self, lora: bool) -> str:
        """What ``weights.transport: auto`` means here."""
        raise NotImplementedError

    def transport_refusal(self, transport: str) -> str | None:
        """This placement's own reason to refuse a transport that does not list it (None: the transport's)."""
        return None

    def scale_refusal(self) -> str | None:
        """Why the number of samplers cannot change during a run (None: it can, between iterations)."""
        return None

    def check(self, cfg: "GRPOConfig") -> None:
        """Raise ValueError when the config asks this placement for something it cannot do."""
        if cfg.cluster.servers:
            raise ValueError(f"cluster.servers is set but cluster.placement={self.kind}: servers are used only "
                             "with placement=external")


class Colocated(Placement):
    """Each actor holds a vLLM sampler and a DeepSpeed learner rank; weights move in-process."""

    kind = "colocate"
    samplers_are_learners = True

    def roles(self, cluster: "ClusterConfig") -> list[tuple[str, int, "RoleResources"]]:
        return [("policy", cluster.learners, cluster.learner_resources)]

    def sampler_resources_field(self) -> str:
        return "learner_resources"

    def default_samplers(self, cluster: dict[str, Any]) -> int | None:
        return cluster.get("learners")  # `cluster.learners=2` alone means two actors of both roles

    def auto_transport(self, lora: bool) -> str:
        return "inprocess"

    def scale_refusal(self) -> str | None:
        return ("cluster.placement=colocate: samplers are the learner ranks' actors; scale them by resuming with "
                "another cluster.learners")

    def check(self, cfg: "GRPOConfig") -> None:
        super().check(cfg)
        c = cfg.cluster
        if cfg.rollout.max_staleness > 0:
            raise ValueError(f"rollout.max_staleness={cfg.rollout.max_staleness} samples while the learner trains: "
                             f"it needs cluster.placement=split or external (a colocated actor does one at a time)")
        if c.samplers != c.learners:
            raise ValueError(
                f"cluster.placement=colocate puts one sampler and one learner rank in each actor: cluster.samplers "
                f"({c.samplers}) must equal cluster.learners ({c.learners}); use placement=split for other counts")


class Split(Placement):
    """Sampler actors and learner-rank actors apart: a sampler can die and be replaced, the samplers can scale."""

    kind = "split"

    def auto_transport(self, lora: bool) -> str:
        # the adapter is a few MiB of files; vLLM's broadcast engines send full weights
        return "files" if lora else "broadcast"


class External(Placement):
    """Samplers are `grpo serve` servers (``cluster.servers``), each driven by a light actor of the run."""

    kind = "external"
    samplers_are_servers = True

    def default_samplers(self, cluster: dict[str, Any]) -> int | None:
        return len(cluster["servers"]) if cluster.get("servers") else None

    def auto_transport(self, lora: bool) -> str:
        return "files"  # servers reach the run store from any host

    def transport_refusal(self, transport: str) -> str | None:
        return (f"weights.transport={transport} cannot reach a server process: use files (the server reads "
                "weights/v-N/ from the run store) or broadcast (gloo)")

    def scale_refusal(self) -> str | None:
        return ("cluster.placement=external: the samplers are the servers of cluster.servers; start or stop "
                "`grpo serve` processes and resume with the new list")

    def check(self, cfg: "GRPOConfig") -> None:
        c = cfg.cluster
        if not c.servers:
            raise ValueError("cluster.placement=external samples on OpenAI-compatible servers: list their URLs in "
                             "cluster.servers (start one with `grpo serve --model DIR`)")
        if c.samplers != len(c.servers):
            raise ValueError(f"cluster.placement=external has one sampler per server: cluster.samplers "
                             f"({c.samplers}) must equal the number of cluster.servers ({len(c.servers)})")
        bad = [u for u in c.servers if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"cluster.servers must be http(s) base URLs, got {bad}")


PLACEMENTS: dict[str, type[Placement]] = {cls.kind: cls for cls in (Colocated, Split, External)}


def placement_of(kind: str) -> Placement:
    """The placement of a ``cluster.placement`` value."""
    if kind not in PLACEMENTS:
        raise ValueError(f"cluster.placement={kind!r}: expected one of {sorted(PLACEMENTS)}")
    return PLACEMENTS[kind]()
