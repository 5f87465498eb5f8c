"""The engine actors of one flow run behind one object: tasks call methods here and never touch Ray.

Why: the flow talks to "the samplers" and "the learner", whatever the placement. This module places the actors
(one colocated actor per device, or sampler actors and learner-rank actors apart), fans each stage out over them
(prompts sharded over samplers, the batch over learner ranks), moves weights with the configured transport, and
turns actor deaths into errors the flow can act on:

* a sampler that dies during a rollout (split placement) has its prompts sent to the live samplers, and is replaced
  by a new actor that catches up through the files transport: the iteration is not lost;
* any other death raises ``EngineLost`` naming the actor, its pid and node; the flow then recreates every actor
  and restores the latest checkpoint (a learner rank cannot rejoin a running process group).

External placement: each sampler actor drives one `grpo serve` server over HTTP. A server that stops answering
(``ServerUnavailable`` after its retries) has its share of the rollout sent to the live servers and is reported; it
is left out of every stage until a later sync finds it answering again, when it catches up to the current weights
and rejoins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import ray
from ray.exceptions import RayActorError

from grpo_core.checkpoint import CheckpointRef
from grpo_core.cluster.ray_cluster import (
    create_engine_actors, create_sampler_actor, group_placed, kill, node_ids, node_ip, placed_group, remove_groups,
    start_ray, stop_ray,
)
from grpo_core.cluster.weight_client import SamplerWeightClient
from grpo_core.config import GRPOConfig
from grpo_core.precision import LogprobGap, logprob_gap
from grpo_core.rollout.server import ServerUnavailable
from grpo_core.weights.transport import make_transport
from grpo_core.weights_digest import Receipt, compare_receipts, describe


class EngineLost(RuntimeError):
    """An engine actor died; the message says which one, where, and what Ray reported."""


class SyncCheckFailed(RuntimeError):
    """After a sync a sampler serves other weights than the learner published: another version, or tensors whose
    digest differs (or, when ``weights.check_tolerance`` is set, logprobs further apart than it allows)."""


class EngineStartError(RuntimeError):
    """An engine actor could not be created (its constructor or set-up raised): retrying would fail the same way."""


class SamplerUnplaced(RuntimeError):
    """A replacement sampler could not start now: no node can hold it, or its node was lost while it started."""


# A replacement sampler that has not built its engine by then is given up until the next sync (it normally takes
# seconds; the bound is for a bundle whose node died after it was chosen and that no other node can hold).
SAMPLER_START_TIMEOUT_S = 300.0


def shard(n: int, parts: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``parts`` contiguous, balanced slices of ``range(n)`` (the first ones one longer)."""
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def merge_train_metrics(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One update's metrics from every learner rank: losses and token counts add up, wall time and the largest
    sampler/learner logprob gap are the slowest / largest rank's, the rest (clip fractions, KL, entropy, ...) are
    averaged; grad norm, lr and version agree by construction and are rank 0's."""
    out = dict(per_rank[0])
    for key in per_rank[0]:
        values = [m[key] for m in per_rank if isinstance(m.get(key), (int, float))]
        if len(values) != len(per_rank):
            continue
        if key in ("loss", "pg_loss", "tokens"):
            out[key] = float(sum(values))
        elif key in ("seconds", "mismatch_abs_logp_max"):
            out[key] = max(values)
        elif key not in ("grad_norm", "lr", "policy_version", "optimizer_steps"):
            out[key] = sum(values) / len(values)
    out["learners"] = len(per_rank)
    return out


@dataclass(frozen=True)
class SyncCheck:
    """A passed sync check: every sampler was handed the learner's tensors (``tensors`` of them, by digest), and
    the logprob gap that remains between the two engines on the same tokens (``LogprobGap``)."""
    tensors: int
    gap: LogprobGap


def check_weights(published: Receipt, served: dict[int, Receipt]) -> int:
    """The sync check proper: every sampler's receipt (version and digest of what its loader was handed) against
    the learner's. Raises ``SyncCheckFailed`` naming each sampler that differs and how; returns the tensors
    compared."""
    problems = compare_receipts(published, served)
    total = len(published.digest.tensors) if published.digest is not None else 0
    if any(problems.values()):
        raise SyncCheckFailed(f"after the sync to version {published.version}, sampler(s) "
                              f"{sorted(i for i, p in problems.items() if p)} serve other weights than the learner "
                              f"published: {describe(problems, total)}")
    return total


def check_gap(gap: LogprobGap, tolerance: float | None, dtype: str) -> None:
    """``weights.check_tolerance``, when set: a bound on the largest logprob gap (off by default: the digests
    decide whether a sync worked; the gap also measures numerics, and bfloat16's tails reach 0.3-0.8 on a real
    model with identical weights)."""
    if tolerance is not None and gap.max_diff > tolerance:
        bad = {i: round(d, 6) for i, d in gap.per_sampler.items() if d > tolerance}
        raise SyncCheckFailed(
            f"after the sync, sampler(s) {sorted(bad)} differ from the learner beyond weights.check_tolerance: "
            f"|sampler logprob - learner logprob| up to {gap.max_diff:.3g} (per sampler {bad}), above "
            f"{tolerance:g} for {dtype} engines")


class Engines:
    def __init__(self, cfg: GRPOConfig):
        self.cfg = cfg
        self.colocated = cfg.cluster.placement == "colocate"
        self.external = cfg.cluster.placement == "external"
        self.transport = make_transport(cfg.transport)  # the driver asks it what it can do, never its name
        self.samplers: list = []
        self.learners: list = []
        self._groups: list = []
        self._slots: list = []
        self._described: dict[Any, str] = {}
        self._checkpoint_results: list | None = None
        self.info: dict[str, Any] = {}
        self.replaced_samplers = 0
        self._dead: set[int] = set()  # split: died in a rollout, replaced at a sync; external: server down
        self._waiting: set[int] = set()  # split: dead samplers told to wait for a node that can hold them
        self.servers_down = 0  # external: times a server stopped answering
        self._transfer_members_changed = False
        self.dtypes: set[str] = set()  # what the engines compute in (model.dtype, auto resolved by each actor)
        self._connected = False
        self._owns_ray = False  # connect() started or joined Ray itself (close() then stops it)

    # ------------------------------------------------------------------------------------------ lifecycle
    def connect(self) -> None:
        """Start (or join) Ray, once: the reward models' actors are placed on it before the engines are."""
        if not self._connected:
            self._owns_ray, self._connected = start_ray(self.cfg), True

    def start(self) -> dict[str, Any]:
        """Connect to Ray, place the actors and build their engines; returns start-up figures."""
        self.connect()
        return self._create()

    def _actors(self) -> list:
        seen, out = set(), []
        for a in self.samplers + self.learners:
            if id(a) not in seen:
                seen.add(id(a))
                out.append(a)
        return out

    def _create(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.samplers, self.learners, self._groups = create_engine_actors(self.cfg)
        # where each sampler sits: (placement group, bundle index); split placement's samplers share group 0
        self._slots = [(self._groups[0], i) for i in range(len(self.samplers))]
        for a in self._actors():
            self._described[a] = self._role(a)
        host = node_ip(self.learners[0])
        port = self._get([self.learners[0].open_rendezvous.remote(host)], [self.learners[0]], "open_rendezvous")[0]
        actors = self._actors()
        infos = self._get([a.setup.remote(host if a in self.learners else None, port if a in self.learners else None)
                           for a in actors], actors, "setup", starting=True)
        nodes = node_ids(actors)
        for a, info, (_, address) in zip(actors, infos, nodes):
            self._described[a] = f"{self._role(a)} (pid {info['pid']} on {info['host']}, node {address})"
        self._init_transfer()
        self.dtypes = {i["dtype"] for i in infos}
        self.info = {
            "dtypes": sorted(self.dtypes),
            "actors": [{"role": self._role(a), "pid": i["pid"], "host": i["host"], "node": node, "address": address}
                       for a, i, (node, address) in zip(actors, infos, nodes)],
            "sampler_load_s": max(i["sampler_load_s"] for i in infos),
            "learner_init_s": max(i["learner_init_s"] for i in infos),
            "setup_s": time.perf_counter() - started,
        }
        return self.info

    def _init_transfer(self) -> None:
        """A transport that forms a transfer group (broadcast, cuda_ipc): every learner rank builds vLLM's
        trainer-side engine; rank 0 rendezvouses with every live sampler worker (a new group each time the set of
        samplers changes)."""
        if not self.transport.forms_group:
            return
        self._transfer_members_changed = False
        host = node_ip(self.learners[0])
        port = self._get([self.learners[0].free_port.remote(host)], [self.learners[0]], "free_port")[0]
        client = SamplerWeightClient(self.live_samplers(), workers_per_sampler=self.cfg.rollout.tensor_parallel_size)
        self._on_learners(lambda a: a.join_transfer.remote(client, host, port), "join_transfer")

    def _role(self, actor) -> str:
        parts = []
        if actor in self.samplers:
            parts.append(f"sampler {self.samplers.index(actor)}")
        if actor in self.learners:
            parts.append(f"learner rank {self.learners.index(actor)}")
        return ("colocated " if len(parts) == 2 else "") + " + ".join(parts)

    def recreate(self) -> dict[str, Any]:
        """Replace every actor by a fresh one holding the initial weights (a learner rank cannot rejoin)."""
        started = time.perf_counter()
        self._teardown()
        info = self._create()
        info["recreate_s"] = time.perf_counter() - started
        return info

    def _teardown(self) -> None:
        for a in self._actors():
            kill(a)
        remove_groups(self._groups + [g for g, _ in self._slots if all(g is not h for h in self._groups)])
        self.samplers, self.learners, self._groups, self._slots = [], [], [], []
        self._checkpoint_results = None
        self._dead.clear()
        self._waiting.clear()

    def close(self) -> None:
        if self.external and self.transport.forms_group and self.samplers:
            # the servers outlive the run: they leave its transfer group (the next run forms its own)
            try:
                self._on_samplers(lambda a: a.leave_transfer.remote(), "leave_transfer")
            except (EngineLost, RayActorError) as exc:
                print(f"could not release the servers' weight-transfer group: {exc}")
        if self._groups or self.samplers:
            self._teardown()
        if self._owns_ray:  # a Ray the caller connected to before the run stays up
            stop_ray()

    def describe(self) -> str:
        return "; ".join(self._described.get(a, self._role(a)) for a in self._actors())

    def _get(self, refs: list, actors: list, what: str, starting: bool = False) -> list:
        """Results of calls on several actors, failing as soon as one of them fails (a dead peer would otherwise
        leave the others waiting in a collective)."""
        results: dict[int, Any] = {}
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except RayActorError as exc:
                who = self._described.get(actors[i], self._role(actors[i]))
                if exc.actor_init_failed or starting:
                    raise EngineStartError(f"starting {who} failed during {what}: {exc}") from exc
                lines = [line.strip() for line in str(exc).strip().splitlines()]
                detail = [line for line in lines if line.startswith(("pid:", "ip:"))] + lines[-1:]
                raise EngineLost(f"{who} died during {what}: {'; '.join(detail)}") from exc
        return [results[i] for i in range(len(refs))]

    def _on_learners(self, call: Callable[[Any], Any], what: str, ranks: list[int] | None = None) -> list:
        """``call(actor)`` (an actor method's ``.remote(...)``) on every learner rank, or on ``ranks``; ``what``
        names it in errors."""
        actors = self.learners if ranks is None else [self.learners[r] for r in ranks]
        return self._get([call(a) for a in actors], actors, what)

    def _on_rank0(self, call: Callable[[Any], Any], what: str):
        """A call whose work happens on learner rank 0; under ZeRO-3 every rank joins (gathering the full weights
        is a collective)."""
        ranks = None if self.cfg.train.zero_stage == 3 else [0]
        return self._on_learners(call, what, ranks=ranks)[0]

    def live_sampler_ids(self) -> list[int]:
        return [i for i in range(len(self.samplers)) if i not in self._dead]

    def live_samplers(self) -> list:
        return [self.samplers[i] for i in self.live_sampler_ids()]

    def _on_samplers(self, call: Callable[[Any], Any], what: str) -> list:
        """``call(actor)`` on every live sampler. External: a server that does not answer is marked down and left
        out (the results are those of the servers that answered); it is an error only when none is left."""
        ids = self.live_sampler_ids()
        actors = [self.samplers[i] for i in ids]
        refs = [call(a) for a in actors]
        if not self.external:
            return self._get(refs, actors, what)
        results = []
        for sid, ref in zip(ids, refs):
            try:
                results.append(ray.get(ref))
            except ServerUnavailable as exc:
                self._server_down(sid, exc, what)
        if not self.live_sampler_ids():
            raise EngineLost(f"every server of cluster.servers stopped answering (last during {what})")
        return results

    def _server_down(self, sid: int, exc: BaseException, during: str) -> None:
        self._dead.add(sid)
        self.servers_down += 1
        self._transfer_members_changed = True  # broadcast: a group with a silent member would hang
        print(f"server {self.cfg.cluster.servers[sid]} (sampler {sid}) stopped answering during {during}: "
              f"{str(exc).strip().splitlines()[-1]}; it is left out until it answers again")

    # ----------------------------------------------------------------------------------------------- status
    def versions(self) -> tuple[list[int], int]:
        """(every sampler's policy version, the learner's)."""
        sampler = self.sampler_versions()  # live ones
        learner = self._on_learners(lambda a: a.versions.remote(), "versions", ranks=[0])[0]["learner"]
        return sampler, learner

    # --------------------------------------------------------------------------------------------- sampling
    def rollout(self, iteration: int, prompts: list[dict[str, Any]], group_offset: int) -> tuple[pa.Table, dict]:
        """G samples per prompt, prompts sharded over the live samplers (a group never splits); rows in prompt
        order. In split placement a sampler that dies has its shard redone by a live one; it is replaced at the
        next sync (``replace_dead_samplers``), so that it catches up to the version the learner then publishes:
        in async RL the learner is training while this runs."""
        live = self.live_sampler_ids()
        bounds = [b for b in shard(len(prompts), len(live)) if b[1] > b[0]]
        pending: dict[Any, tuple[int, int, int]] = {}
        for sid, (lo, hi) in zip(live, bounds):
            ref = self.samplers[sid].sample.remote(iteration, prompts[lo:hi], group_offset + lo)
            pending[ref] = (sid, lo, hi)
        lost = 0
        done: dict[int, tuple[pa.Table, dict]] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            sid, lo, hi = pending.pop(ref)
            try:
                done[lo] = ray.get(ref)
            except (RayActorError, ServerUnavailable) as exc:
                if self.colocated:
                    raise EngineLost(f"{self._described.get(self.samplers[sid])} died during rollout: "
                                     f"{str(exc).strip().splitlines()[-1]}") from exc
                if self.external:
                    self._server_down(sid, exc, f"the rollout of iteration {iteration}")
                else:
                    self._dead.add(sid)
                    self._transfer_members_changed = True  # broadcast: a group with a dead member would hang
                lost += 1
                live = self.live_sampler_ids()
                if not live:
                    raise EngineLost(f"every sampler died during the rollout of iteration {iteration}") from exc
                other = live[lo % len(live)]
                print(f"{self._described.get(self.samplers[sid])} died during rollout ({type(exc).__name__}); its "
                      f"{hi - lo} prompts go to sampler {other}"
                      + ("" if self.external else "; it is replaced at the next sync where a node can hold it"))
                pending[self.samplers[other].sample.remote(iteration, prompts[lo:hi], group_offset + lo)] = \
                    (other, lo, hi)
        parts = [done[lo] for lo in sorted(done)]
        table = pa.concat_tables([t for t, _ in parts])
        metas = [m for _, m in parts]
        versions = {m["policy_version"] for m in metas}
        if len(versions) != 1:
            raise RuntimeError(f"samplers served different policy versions {sorted(versions)} in one rollout")
        return table, {"seconds": max(m["seconds"] for m in metas), "policy_version": versions.pop(),
                       "samplers_used": len({m["sampler_id"] for m in metas}), "samplers_lost": lost,
                       "samplers_live": len(self.live_sampler_ids())}

    def sampler_versions(self) -> list[int]:
        """The policy version every live sampler serves (asks the samplers only: never waits for a training
        learner)."""
        return [v["sampler"] for v in self._on_samplers(lambda a: a.versions.remote(), "versions")]

    def replace_dead_samplers(self) -> int:
        """Split: a new actor for each sampler that died, where the cluster can hold one now; the others stay out
        (the run goes on with the live samplers) and are tried again at every later sync, so a sampler whose node
        comes back, or finds room elsewhere, rejoins. External: servers that answer again rejoin. Returns how many
        samplers came back."""
        if self.external:
            return self._rejoin_servers()
        return sum(self._replace_sampler(sid) for sid in sorted(self._dead))

    def _rejoin_servers(self) -> int:
        """External: a server that was down and answers its health check again takes the current weights (files;
        with broadcast the transfer group is formed again with it) and serves from the next rollout on."""
        back = []
        for sid in sorted(self._dead):
            try:
                if ray.get(self.samplers[sid].server_alive.remote()):
                    back.append(sid)
            except RayActorError:
                continue  # its client actor is gone: the server stays out
        if not back:
            return 0
        actors = [self.samplers[sid] for sid in back]
        self._dead.difference_update(back)
        if self.transport.forms_group:  # the group is formed again with them; the next sync brings them up
            self._reform_transfer(joined=actors)
        else:
            self._catch_up(actors)
        print(f"server(s) {[self.cfg.cluster.servers[s] for s in back]} answer again and rejoin")
        return len(back)

    def _replace_sampler(self, sid: int) -> bool:
        """A new sampler actor in the dead one's place (its placement group's bundle, which Ray moves off a lost
        node), serving the learner's current weights (caught up through the run store). False, and the sampler
        stays out, when no node can hold it now."""
        started = time.perf_counter()
        old = self.samplers[sid]
        kill(old)
        self._described.pop(old, None)
        group, _ = self._slots[sid]
        if not group_placed(group):
            self._wait_for_node(sid, "no live node can hold its placement group's bundle now")
            return False
        self._dead.discard(sid)  # live again: the transfer group formed while replacing it must include it
        try:
            version = self._start_samplers([sid], timeout=SAMPLER_START_TIMEOUT_S)
        except SamplerUnplaced as exc:
            self._dead.add(sid)
            self._transfer_members_changed = True
            self._wait_for_node(sid, str(exc))
            return False
        self._waiting.discard(sid)
        self.replaced_samplers += 1
        where = next(a["address"] for a in self.info["actors"] if a["role"] == f"sampler {sid}")
        print(f"replaced sampler {sid} in {time.perf_counter() - started:.1f}s on node {where}; it caught up to "
              f"policy version {version} through {self.cfg.storage.root}/.../weights/")
        return True

    def _wait_for_node(self, sid: int, why: str) -> None:
        if sid not in self._waiting:
            self._waiting.add(sid)
            print(f"sampler {sid} is not replaced yet ({why}); the run goes on with "
                  f"{len(self.live_sampler_ids())} sampler(s) and tries again at every sync")

    def _start_samplers(self, ids: list[int], timeout: float | None = None) -> int:
        """Create, set up and catch up the sampler actors ``ids`` in their slots (through ``weights/``); the
        transfer group is formed again with them. Returns the version they serve. With ``timeout``, actors that
        are not set up by then, or whose node is lost meanwhile, are killed: ``SamplerUnplaced``."""
        new = []
        for sid in ids:
            group, bundle = self._slots[sid]
            actor = create_sampler_actor(self.cfg, sid, group, bundle)
            self.samplers[sid] = actor
            self._described[actor] = f"sampler {sid}"
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
            infos = self._get(refs, new, "setup", starting=True)
        for actor, sid, info, (node, address) in zip(new, ids, infos, node_ids(new)):
            self._described[actor] = f"sampler {sid} (pid {info['pid']} on {info['host']}, node {address})"
            record = {"role": f"sampler {sid}", "pid": info["pid"], "host": info["host"], "node": node,
                      "address": address}
            actors = self.info.setdefault("actors", [])  # in place: the run status holds this list
            at = [k for k, a in enumerate(actors) if a["role"] == record["role"]]
            if at:
                actors[at[0]] = record
            else:
                actors.append(record)
        version = self._catch_up(new)
        self._reform_transfer(joined=new)
        return version

    def _reform_transfer(self, joined: list = ()) -> None:
        """A transport with a transfer group: the group is formed again with the current samplers (the ones in
        ``joined`` were not members of the old one)."""
        if not self.transport.forms_group:
            return
        members = [s for s in self.live_samplers() if s not in joined] + self.learners
        self._get([a.leave_transfer.remote() for a in members], members, "leave_transfer")
        self._init_transfer()

    def scale_samplers(self, count: int) -> dict[str, Any]:
        """Change the number of sampler actors between iterations (split placement): new ones get a placement
        group of their own and load the current weights before they serve; removed ones (the highest ids) are
        killed."""
        if self.colocated:
            raise ValueError("cluster.placement=colocate: samplers are the learner ranks' actors; scale them by "
                             "resuming with another cluster.learners")
        if self.external:
            raise ValueError("cluster.placement=external: the samplers are the servers of cluster.servers; start or "
                             "stop `grpo serve` processes and resume with the new list")
        if count < 1:
            raise ValueError(f"a run needs at least one sampler, not {count}")
        self.replace_dead_samplers()
        started, before = time.perf_counter(), len(self.samplers)
        if count > before:
            res = self.cfg.cluster.sampler_resources
            for sid in range(before, count):
                self._slots.append((placed_group(res, 1, f"grpo-{self.cfg.run_name}-sampler-{sid}", "sampler"), 0))
                self.samplers.append(None)
            self._start_samplers(list(range(before, count)))
        elif count < before:
            gone, slots = self.samplers[count:], self._slots[count:]
            self.samplers, self._slots = self.samplers[:count], self._slots[:count]
            for actor in gone:
                kill(actor)
                self._described.pop(actor, None)
            remove_groups([group for group, _ in slots if group is not self._groups[0]])
            self._reform_transfer()
        return {"samplers_before": before, "samplers": len(self.samplers), "seconds": time.perf_counter() - started}

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool,
                      samples: int) -> tuple[pa.Table, dict]:
        live = self.live_samplers()
        bounds = [b for b in shard(len(prompts), len(live)) if b[1] > b[0]]
        actors = live[:len(bounds)]
        parts = self._get([a.generate_eval.remote(iteration, prompts[lo:hi], greedy, samples, lo)
                           for a, (lo, hi) in zip(actors, bounds)], actors, "generate_eval")
        metas = [m for _, m in parts]
        return pa.concat_tables([t for t, _ in parts]), {"seconds": max(m["seconds"] for m in metas),
                                                        "policy_version": metas[0]["policy_version"]}

    # ------------------------------------------------------------------------------------------------ train
    def train(self, iteration: int) -> dict[str, Any]:
        return merge_train_metrics(self._on_learners(lambda a: a.train.remote(iteration), "train"))

    # ------------------------------------------------------------------------------------------------- sync
    def sync(self) -> dict[str, Any]:
        """Push the learner's weights to every sampler with the configured transport (samplers that died since
        the last sync are replaced first): every learner rank publishes, then every live sampler receives."""
        started = time.perf_counter()
        back = self.replace_dead_samplers()
        keep = [v for v in self.sampler_versions() if v is not None] if self.transport.keeps_serving_versions else []
        if self._transfer_members_changed:  # a sampler died or a server went down: the group goes on without it
            self._reform_transfer()
        published = self._on_learners(lambda a: a.publish_weights.remote(keep), "publish_weights")[0]
        version = int(published["version"])
        self._on_samplers(lambda a: a.receive_weights.remote(version), "receive_weights")
        return {"seconds": time.perf_counter() - started, "version": float(version), "transport": self.transport.kind,
                "samplers_back": back, "samplers_out": len(self._dead),
                **({"bytes": published["bytes"]} if published["bytes"] is not None else {})}

    def _catch_up(self, actors: list) -> int:
        """Bring samplers that were not in the last sync (new, replacing a dead one, or a server back) to the
        learner's current version through the run store (``weights/v-N/``); returns that version."""
        serving = [v for v in self.sampler_versions() if v is not None]
        version = int(self._on_rank0(lambda a: a.publish.remote(serving), "publish")["version"])
        self._get([a.load_published.remote(version) for a in actors], actors, "load_published")
        return version

    def check_sync(self, rows: dict[int, tuple[list[list[int]], list[int]]]) -> SyncCheck:
        """Right after a sync: every sampler in ``rows`` must have been handed exactly the learner's weights
        (``check_weights``: versions and per-tensor digests), else ``SyncCheckFailed``. Then the logprob gap on
        some of each sampler's sequences (``{sampler_id: (sequences, prompt lengths)}``), a measure of the engines'
        numerical mismatch."""
        ids = sorted(rows)
        actors = [self.samplers[i] for i in ids]
        published = self.published_receipt()
        served = self._get([a.served_receipt.remote() for a in actors], actors, "served_receipt")
        tensors = check_weights(published, dict(zip(ids, served)))
        sampled = self._get([a.sampler_logprobs.remote(*rows[i]) for a, i in zip(actors, ids)], actors,
                            "sampler_logprobs")
        seqs = [s for i in ids for s in rows[i][0]]
        lens = [p for i in ids for p in rows[i][1]]
        learned = self._on_learners(lambda a: a.learner_logprobs.remote(seqs, lens), "learner_logprobs")[0]
        gap = logprob_gap(ids, sampled, learned)
        check_gap(gap, self.cfg.weights.check_tolerance, "/".join(sorted(self.dtypes)) or "float32")
        return SyncCheck(tensors=tensors, gap=gap)

    def serve_checkpoint(self, model_dir: str, version: int) -> float:
        return max(self._on_samplers(lambda a: a.serve_checkpoint.remote(model_dir, version), "serve_checkpoint"))

    def published_receipt(self) -> Receipt:
        """The learner's side of the sync check: its version and the digest of its weights as the transports
        publish them."""
        return self._on_rank0(lambda a: a.published_receipt.remote(), "published_receipt")

    # ------------------------------------------------------------------------------------------ checkpoints
    def checkpoint_begin(self, iteration: int) -> dict[str, Any]:
        outs = self._on_learners(lambda a: a.checkpoint_begin.remote(iteration), "checkpoint_begin")
        self._checkpoint_results = [None] * len(self.learners)
        return {"snapshot_seconds": max(o["snapshot_seconds"] for o in outs),
                "policy_version": outs[0]["policy_version"]}

    def checkpoint_result(self, wait: bool = False) -> dict[str, Any] | None:
        """Every rank's written files of the pending checkpoint, merged (None until all ranks are done)."""
        if self._checkpoint_results is None:
            return None
        todo = [r for r, res in enumerate(self._checkpoint_results) if res is None]
        results = self._on_learners(lambda a: a.checkpoint_result.remote(wait), "checkpoint_result", ranks=todo)
        for r, res in zip(todo, results):
            self._checkpoint_results[r] = res
        if any(res is None for res in self._checkpoint_results):
            return None
        results, self._checkpoint_results = self._checkpoint_results, None
        files = {name: rec for res in results for name, rec in res["files"].items()}
        return {"files": files, "bytes": sum(res["bytes"] for res in results),
                "write_seconds": max(res["write_seconds"] for res in results)}

    def restore(self, ref: CheckpointRef) -> dict[str, Any]:
        """Every learner rank loads the checkpoint, then the samplers get its weights."""
        started = time.perf_counter()
        payload = {"iteration": ref.iteration, "policy_version": ref.policy_version, "path": ref.path}
        self._on_learners(lambda a: a.restore.remote(payload), "restore")
        self._checkpoint_results = None
        self.sync()
        return {"seconds": time.perf_counter() - started, "policy_version": ref.policy_version}

    def save_final(self) -> dict[str, Any]:
        return self._on_rank0(lambda a: a.save_final.remote(), "save_final")
