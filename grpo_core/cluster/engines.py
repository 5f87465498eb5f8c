"""The engine actors of one flow run: their lifecycle, and the three handles the tasks talk to (never to Ray).

``Engines`` places the actors (one colocated actor per device, or sampler actors and learner-rank actors apart, or
light actors that drive external servers), builds their engines, and hands the stages three handles:

* ``learners`` (``LearnerGroup``): the update, logprobs, checkpoints, restore, the final policy;
* ``samplers`` (``SamplerFleet``, one class per placement): rollouts and evaluations sharded over the live
  samplers, a member's loss handled as its placement allows (re-sharded and replaced, left out until it answers,
  or ``EngineLost``), scaling;
* ``weights`` (``WeightSync``): the transfer group, the sync, catching samplers up, the sync check.

What stays here is their lifecycle: start, recreate after a lost actor (a learner rank cannot rejoin a running
process group, so the flow recreates every actor and restores the latest checkpoint), close.
"""
from __future__ import annotations

import time
from dataclasses import replace

from grpo_core.cluster.calls import ActorNames, EngineLost, EngineStartError, gather
from grpo_core.cluster.fleet import SamplerFleet, SamplerUnplaced, make_fleet, placed_actor, shard
from grpo_core.cluster.learner_group import LearnerGroup
from grpo_core.cluster.ray_cluster import create_engine_actors, kill, node_ids, remove_groups, start_ray, stop_ray
from grpo_core.cluster.weight_sync import SyncCheck, SyncCheckFailed, WeightSync, check_gap, check_weights
from grpo_core.config import GRPOConfig
from grpo_core.engine.results import EnginesInfo, PlacedActor, Scaled

__all__ = ["EngineLost", "EngineStartError", "Engines", "SamplerUnplaced", "SyncCheck", "SyncCheckFailed",
           "check_gap", "check_weights", "shard"]


def _unique(actors: list) -> list:
    seen, out = set(), []
    for a in actors:
        if id(a) not in seen:
            seen.add(id(a))
            out.append(a)
    return out


def _role(actor, samplers: list, learners: list) -> str:
    parts = []
    if actor in samplers:
        parts.append(f"sampler {samplers.index(actor)}")
    if actor in learners:
        parts.append(f"learner rank {learners.index(actor)}")
    return ("colocated " if len(parts) == 2 else "") + " + ".join(parts)


class Engines:
    learners: LearnerGroup
    samplers: SamplerFleet
    weights: WeightSync

    def __init__(self, cfg: GRPOConfig):
        self.cfg = cfg
        self.names = ActorNames()
        self.placed: list[PlacedActor] = []  # where every actor runs (status.json holds this list)
        self.info: EnginesInfo | None = None
        self._actors: list = []
        self._groups: list = []
        self._replaced_before = 0  # samplers replaced by fleets since recreated
        self._connected = False
        self._owns_ray = False  # connect() started or joined Ray itself (close() then stops it)

    def connect(self) -> None:
        """Start (or join) Ray, once: the reward models' actors are placed on it before the engines are."""
        if not self._connected:
            self._owns_ray, self._connected = start_ray(self.cfg), True

    def start(self) -> EnginesInfo:
        """Connect to Ray, place the actors and build their engines."""
        self.connect()
        return self._create()

    def _create(self) -> EnginesInfo:
        started = time.perf_counter()
        samplers, learners, self._groups = create_engine_actors(self.cfg)
        self._actors = _unique(samplers + learners)
        fleet = None
        try:
            infos = self._setup(samplers, learners)
            dtypes = {i.dtype for i in infos}
            fleet = make_fleet(self.cfg, samplers, self.names, self.placed, self._groups)
            weights = WeightSync(self.cfg, self.learners, fleet, dtypes)
            weights.form_group()
        except BaseException:
            # Actors that never became the run's engines are stopped here and the error raised is their setup's
            # (close() would otherwise meet a half-made fleet and weight sync, and fail on those instead).
            self._teardown(fleet)
            raise
        self.samplers, self.weights = fleet, weights
        self.info = EnginesInfo(dtypes=tuple(sorted(dtypes)), actors=self.placed,
                                sampler_load_s=max(i.sampler_load_s for i in infos),
                                learner_init_s=max(i.learner_init_s for i in infos),
                                setup_s=time.perf_counter() - started)
        return self.info

    def _setup(self, samplers: list, learners: list) -> list:
        """Every placed actor's engines built (the learner group's rendezvous first), and where each runs recorded;
        returns the actors' setup infos."""
        for a in self._actors:
            self.names.set(a, _role(a, samplers, learners))
        self.learners = LearnerGroup(self.cfg, learners, self.names)
        host, port = self.learners.rendezvous()
        infos = gather([a.setup.remote(*((host, port) if a in learners else (None, None))) for a in self._actors],
                       self._actors, "setup", self.names, starting=True)
        self.placed[:] = []
        for a, info, node in zip(self._actors, infos, node_ids(self._actors)):
            role = _role(a, samplers, learners)
            self.names.set(a, f"{role} (pid {info.pid} on {info.host}, node {node[1]})")
            self.placed.append(placed_actor(role, info.pid, info.host, node))
        return infos

    def recreate(self) -> EnginesInfo:
        """Replace every actor by a fresh one holding the initial weights (a learner rank cannot rejoin)."""
        started = time.perf_counter()
        self._teardown(self.samplers)
        info = self._create()
        self.info = replace(info, recreate_s=time.perf_counter() - started)
        return self.info

    @property
    def replaced_samplers(self) -> int:
        """Samplers replaced (or servers back) over the run."""
        return self._replaced_before + (self.samplers.replaced if self._actors else 0)

    def scale_samplers(self, count: int) -> Scaled:
        """Change the number of sampler actors between iterations (where the placement allows): new ones load
        the current weights before they serve; removed ones leave the transfer group at the next sync."""
        refusal = self.cfg.placement.scale_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        self.weights.admit(self.samplers.restore_members())
        new, scaled = self.samplers.scale(count)
        self.weights.admit(new)
        return scaled

    def _teardown(self, fleet: SamplerFleet | None) -> None:
        """Stop the actors and remove their placement groups, ``fleet``'s too (the samplers it placed; None: no
        fleet was made)."""
        for a in self._actors:
            kill(a)
        if self._actors:
            self._replaced_before += fleet.replaced if fleet is not None else 0
            remove_groups(self._groups + (fleet.placement_groups() if fleet is not None else []))
        self._actors, self._groups = [], []
        self.names.clear()

    def close(self) -> None:
        if self._actors:
            self.weights.release_servers()
            self._teardown(self.samplers)
        if self._owns_ray:  # a Ray the caller connected to before the run stays up
            stop_ray()

    def describe(self) -> str:
        return "; ".join(self.names.of(a) for a in self._actors)
