"""The samplers as one handle: which are live, how a stage is sharded over them, and what a member's failure means.

One class per placement behind one interface (``SamplerFleet``), chosen by ``make_fleet``:

* ``ColocatedFleet``: the samplers are the learner ranks' own actors; a sampler's death is a learner rank's, so it
  is ``EngineLost`` (the flow recreates every actor from the latest checkpoint).
* ``ActorFleet`` (split): a sampler that dies during a rollout has its prompts sent to the live samplers and is
  replaced at the next sync by a new actor in its placement group's bundle (which Ray moves off a lost node), where
  a node can hold it; the fleet can grow or shrink between iterations.
* ``ServerFleet`` (external): each actor drives one `grpo serve` server; a server that stops answering
  (``ServerUnavailable`` after its retries) has its share sent to the live servers and is left out of every stage
  until a later sync finds it answering again.

A fleet never moves weights: members that come back (``restore_members``) or are added (``scale``) are handed to
the weight sync (``grpo_core.cluster.weight_sync``), which catches them up. A new rollout source is one more class.
"""
from __future__ import annotations

import time
from typing import Any, Callable, ClassVar

import pyarrow as pa
import ray
from ray.exceptions import RayActorError

from grpo_core.cluster.calls import ActorNames, EngineLost, gather, last_line
from grpo_core.cluster.ray_cluster import create_sampler_actor, group_placed, kill, node_ids, placed_group, \
    remove_groups
from grpo_core.config import GRPOConfig
from grpo_core.config.placements import Colocated, External, Split
from grpo_core.engine.results import PlacedActor, Sampled, SampledPart, Scaled
from grpo_core.engine.rollout.server import ServerUnavailable

# A replacement sampler that has not built its engine by then is given up until the next sync (it normally takes
# seconds; the bound is for a bundle whose node died after it was chosen and that no other node can hold).
SAMPLER_START_TIMEOUT_S = 300.0


class SamplerUnplaced(RuntimeError):
    """A replacement sampler could not start now: no node can hold it, or its node was lost while it started."""


def shard(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``parts`` contiguous, balanced slices of ``range(n)`` (the first ones one longer)."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def placed_actor(role: str, pid: int, host: str, node: tuple[str, str]) -> PlacedActor:
    return PlacedActor(role=role, pid=pid, host=host, node=node[0], address=node[1])


class SamplerFleet:
    """The run's samplers, by sampler id. ``placed`` is the run's list of where every actor runs (shared with
    the engines' lifecycle: a replaced sampler's entry is updated in place)."""

    placement_kind: ClassVar[str]

    def __init__(self, cfg: GRPOConfig, actors: list, names: ActorNames, placed: list[PlacedActor],
                 groups: list):
        self.cfg = cfg
        self.actors = actors
        self.names = names
        self.placed = placed
        self.groups = groups  # placement groups the fleet may place new members in (split)
        self.dead: set[int] = set()  # out of every stage until they come back
        self.members_changed = False  # a member left since the transfer group was formed (it must be formed again)
        self.replaced = 0  # members that came back, over the run

    # ----------------------------------------------------------------------------------------- members
    def live_ids(self) -> list[int]:
        return [i for i in range(len(self.actors)) if i not in self.dead]

    def live(self) -> list:
        return [self.actors[i] for i in self.live_ids()]

    def __len__(self) -> int:
        return len(self.actors)

    def on_live(self, call: Callable[[Any], Any], what: str) -> list:
        """``call(actor)`` on every live sampler; a death is ``EngineLost``."""
        live = self.live()
        return gather([call(a) for a in live], live, what, self.names)

    def on(self, ids: list[int], call: Callable[[Any], Any], what: str) -> list:
        actors = [self.actors[i] for i in ids]
        return gather([call(a) for a in actors], actors, what, self.names)

    def lost(self, sid: int, exc: BaseException, during: str) -> None:
        """A member failed during a stage: leave it out (or raise, where it cannot be left out)."""
        raise NotImplementedError

    def restore_members(self) -> list:
        """Members that serve again from now on (replaced, or back): the weight sync catches them up."""
        return []

    def scale(self, count: int) -> tuple[list, Scaled]:
        """Change the number of samplers: (the new actors, which need the current weights, and the figures)."""
        raise ValueError(self.cfg.placement.scale_refusal())

    def placement_groups(self) -> list:
        """Placement groups the fleet made itself (for members added by ``scale``), removed with it."""
        return []

    # ----------------------------------------------------------------------------------------- stages
    def versions(self) -> list[int]:
        """The policy version every live sampler serves (asks the samplers only: never waits for a training
        learner)."""
        return [v.sampler for v in self.on_live(lambda a: a.versions.remote(), "versions")]

    def rollout(self, iteration: int, prompts: list[dict[str, Any]], group_offset: int) -> tuple[pa.Table, Sampled]:
        """G samples per prompt, prompts sharded over the live samplers (a group never splits); rows in prompt
        order. A member lost during it (``lost``) has its shard redone by a live one."""
        live = self.live_ids()
        bounds = [b for b in shard(len(prompts), len(live)) if b[1] > b[0]]
        pending: dict[Any, tuple[int, int, int]] = {}
        for sid, (lo, hi) in zip(live, bounds):
            pending[self.actors[sid].sample.remote(iteration, prompts[lo:hi], group_offset + lo)] = (sid, lo, hi)
        lost = 0
        done: dict[int, tuple[pa.Table, SampledPart]] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            sid, lo, hi = pending.pop(ready[0])
            try:
                done[lo] = ray.get(ready[0])
            except (RayActorError, ServerUnavailable) as exc:
                who = self.names.of(self.actors[sid])
                self.lost(sid, exc, f"the rollout of iteration {iteration}")
                lost += 1
                live = self.live_ids()
                if not live:
                    raise EngineLost(f"every sampler died during the rollout of iteration {iteration}") from exc
                other = live[lo % len(live)]
                print(f"{who} died during rollout ({type(exc).__name__}); its {hi - lo} prompts go to sampler {other}"
                      + self.lost_note())
                pending[self.actors[other].sample.remote(iteration, prompts[lo:hi], group_offset + lo)] = \
                    (other, lo, hi)
        parts = [done[lo] for lo in sorted(done)]
        metas = [m for _, m in parts]
        versions = {m.policy_version for m in metas}
        if len(versions) != 1:
            raise RuntimeError(f"samplers served different policy versions {sorted(versions)} in one rollout")
        return pa.concat_tables([t for t, _ in parts]), Sampled(
            seconds=max(m.seconds for m in metas), policy_version=versions.pop(),
            samplers_used=len({m.sampler_id for m in metas}), samplers_lost=lost, samplers_live=len(self.live_ids()))

    def lost_note(self) -> str:
        """What happens to a member lost in a rollout, for the log line."""
        return ""

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool,
                      samples: int) -> tuple[pa.Table, Sampled]:
        live = self.live()
        bounds = [b for b in shard(len(prompts), len(live)) if b[1] > b[0]]
        actors = live[:len(bounds)]
        parts = gather([a.generate_eval.remote(iteration, prompts[lo:hi], greedy, samples, lo)
                        for a, (lo, hi) in zip(actors, bounds)], actors, "generate_eval", self.names)
        metas = [m for _, m in parts]
        return pa.concat_tables([t for t, _ in parts]), Sampled(seconds=max(m.seconds for m in metas),
                                                                policy_version=metas[0].policy_version)

    def serve_checkpoint(self, model_dir: str, version: int) -> float:
        return max(self.on_live(lambda a: a.serve_checkpoint.remote(model_dir, version), "serve_checkpoint"))


class ColocatedFleet(SamplerFleet):
    placement_kind = Colocated.kind

    def lost(self, sid: int, exc: BaseException, during: str) -> None:
        raise EngineLost(f"{self.names.of(self.actors[sid])} died during {during}: {last_line(exc)}") from exc


class ActorFleet(SamplerFleet):
    placement_kind = Split.kind

    def __init__(self, cfg: GRPOConfig, actors: list, names: ActorNames, placed: list[PlacedActor],
                 groups: list):
        super().__init__(cfg, actors, names, placed, groups)
        # where each sampler sits: (placement group, bundle index); the first ones share the role's group
        self.slots: list[tuple[Any, int]] = [(groups[0], i) for i in range(len(actors))]
        self.waiting: set[int] = set()  # dead samplers told to wait for a node that can hold them

    def lost(self, sid: int, exc: BaseException, during: str) -> None:
        self.dead.add(sid)
        self.members_changed = True  # broadcast: a group with a dead member would hang

    def lost_note(self) -> str:
        return "; it is replaced at the next sync where a node can hold it"

    def restore_members(self) -> list:
        """A new actor for each sampler that died, where the cluster can hold one now; the others stay out (the
        run goes on with the live samplers) and are tried again at every later sync, so a sampler whose node comes
        back, or finds room elsewhere, rejoins."""
        back = []
        for sid in sorted(self.dead):
            started = time.perf_counter()
            old = self.actors[sid]
            kill(old)
            self.names.forget(old)
            if not group_placed(self.slots[sid][0]):
                self._wait_for_node(sid, "no live node can hold its placement group's bundle now")
                continue
            try:
                back += self._start([sid], timeout=SAMPLER_START_TIMEOUT_S)
            except SamplerUnplaced as exc:
                self._wait_for_node(sid, str(exc))
                continue
            self.dead.discard(sid)
            self.waiting.discard(sid)
            self.replaced += 1
            where = next(a.address for a in self.placed if a.role == f"sampler {sid}")
            print(f"replaced sampler {sid} in {time.perf_counter() - started:.1f}s on node {where}; it takes the "
                  f"current weights before it samples")
        return back

    def _wait_for_node(self, sid: int, why: str) -> None:
        if sid not in self.waiting:
            self.waiting.add(sid)
            print(f"sampler {sid} is not replaced yet ({why}); the run goes on with "
                  f"{len(self.live_ids())} sampler(s) and tries again at every sync")

    def _start(self, ids: list[int], timeout: float | None = None) -> list:
        """Create and set up the sampler actors ``ids`` in their slots; returns them. With ``timeout``, actors
        that are not set up by then, or whose node is lost meanwhile, are killed: ``SamplerUnplaced``."""
        new = []
        for sid in ids:
            group, bundle = self.slots[sid]
            actor = create_sampler_actor(self.cfg, sid, group, bundle)
            self.actors[sid] = actor
            self.names.set(actor, f"sampler {sid}")
            new.append(actor)
        refs = [a.setup.remote(None, None) for a in new]
        if timeout is not None:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            try:
                if len(ready) < len(refs):
                    raise SamplerUnplaced(f"not started within {timeout:.0f}s")
                infos = ray.get(refs)
            except (SamplerUnplaced, RayActorError) as exc:
                for actor in new:
                    kill(actor)
                raise SamplerUnplaced(f"its new actor could not start: {str(exc).strip().splitlines()[0]}") from exc
        else:
            infos = gather(refs, new, "setup", self.names, starting=True)
        for actor, sid, info, node in zip(new, ids, infos, node_ids(new)):
            self.names.set(actor, f"sampler {sid} (pid {info.pid} on {info.host}, node {node[1]})")
            record = placed_actor(f"sampler {sid}", info.pid, info.host, node)
            at = [k for k, a in enumerate(self.placed) if a.role == record.role]
            if at:
                self.placed[at[0]] = record
            else:
                self.placed.append(record)
        return new

    def scale(self, count: int) -> tuple[list, Scaled]:
        """New samplers get a placement group of their own (and the current weights from the sync before they
        serve); removed ones (the highest ids) are killed."""
        if count < 1:
            raise ValueError(f"a run needs at least one sampler, not {count}")
        started, before = time.perf_counter(), len(self.actors)
        new: list = []
        if count > before:
            res = self.cfg.cluster.sampler_resources
            for sid in range(before, count):
                self.slots.append((placed_group(res, 1, f"grpo-{self.cfg.run_name}-sampler-{sid}", "sampler"), 0))
                self.actors.append(None)
            new = self._start(list(range(before, count)))
        elif count < before:
            gone, slots = self.actors[count:], self.slots[count:]
            del self.actors[count:], self.slots[count:]
            for actor in gone:
                kill(actor)
                self.names.forget(actor)
            remove_groups([group for group, _ in slots if group is not self.groups[0]])
            self.members_changed = True
        return new, Scaled(before, len(self.actors), time.perf_counter() - started)

    def placement_groups(self) -> list:
        return [g for g, _ in self.slots if all(g is not h for h in self.groups)]


class ServerFleet(SamplerFleet):
    placement_kind = External.kind

    def on_live(self, call: Callable[[Any], Any], what: str) -> list:
        """A server that does not answer is marked down and left out (the results are those of the servers that
        answered); it is an error only when none is left."""
        ids = self.live_ids()
        refs = [call(self.actors[i]) for i in ids]
        results = []
        for sid, ref in zip(ids, refs):
            try:
                results.append(ray.get(ref))
            except ServerUnavailable as exc:
                self.lost(sid, exc, what)
        if not self.live_ids():
            raise EngineLost(f"every server of cluster.servers stopped answering (last during {what})")
        return results

    def lost(self, sid: int, exc: BaseException, during: str) -> None:
        self.dead.add(sid)
        self.members_changed = True  # broadcast: a group with a silent member would hang
        print(f"server {self.cfg.cluster.servers[sid]} (sampler {sid}) stopped answering during {during}: "
              f"{last_line(exc)}; it is left out until it answers again")

    def restore_members(self) -> list:
        """Servers that were down and answer their health check again serve from the next rollout on."""
        back = []
        for sid in sorted(self.dead):
            try:
                if ray.get(self.actors[sid].server_alive.remote()):
                    back.append(sid)
            except RayActorError:
                continue  # its client actor is gone: the server stays out
        if back:
            self.dead.difference_update(back)
            print(f"server(s) {[self.cfg.cluster.servers[s] for s in back]} answer again and rejoin")
        return [self.actors[sid] for sid in back]


FLEETS: dict[str, type[SamplerFleet]] = {cls.placement_kind: cls for cls in (ColocatedFleet, ActorFleet,
                                                                               ServerFleet)}


def make_fleet(cfg: GRPOConfig, actors: list, names: ActorNames, placed: list[PlacedActor],
               groups: list) -> SamplerFleet:
    """The fleet class of the run's placement."""
    return FLEETS[cfg.placement.kind](cfg, actors, names, placed, groups)
