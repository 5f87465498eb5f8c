"""The weight sync: the one handle that knows both sides, the learner group and the sampler fleet.

It forms the transport's transfer group where the kind has one (learner rank 0 and every live sampler's vLLM
workers, formed again when the members change), pushes a new version (every learner rank publishes, then every
live sampler receives), catches up samplers that missed syncs through the run store (``weights/v-N/``, whatever the
transport), and checks a sync: every sampler must have been handed exactly the learner's tensors (by digest), and
the logprob gap that remains between the two engines is measured.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ray.exceptions import RayActorError

from grpo_core.cluster.calls import EngineLost, gather
from grpo_core.cluster.fleet import SamplerFleet
from grpo_core.cluster.learner_group import LearnerGroup
from grpo_core.cluster.weight_client import SamplerWeightClient
from grpo_core.config import GRPOConfig
from grpo_core.engine.precision import LogprobGap, logprob_gap
from grpo_core.engine.results import SyncResult
from grpo_core.weights.factory import make_transport
from grpo_core.engine.weights_digest import Receipt, compare_receipts, describe


class SyncCheckFailed(RuntimeError):
    """After a sync a sampler serves other weights than the learner published: another version, or tensors whose
    digest differs (or, when ``weights.check_tolerance`` is set, logprobs further apart than it allows)."""


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


class WeightSync:
    def __init__(self, cfg: GRPOConfig, learners: LearnerGroup, fleet: SamplerFleet, dtypes: set[str]):
        self.cfg = cfg
        self.learners = learners
        self.fleet = fleet
        self.dtypes = dtypes  # what the engines compute in (the check's error names it)
        self.transport = make_transport(cfg.transport)  # asked what it can do, never its name

    # ---------------------------------------------------------------------------------- transfer group
    def form_group(self) -> None:
        """A transport that forms a transfer group (broadcast, cuda_ipc): every learner rank builds vLLM's
        trainer-side engine; rank 0 rendezvouses with every live sampler worker."""
        if not self.transport.forms_group:
            return
        self.fleet.members_changed = False
        host, port = self.learners.free_port()
        client = SamplerWeightClient(self.fleet.live(), workers_per_sampler=self.cfg.rollout.tensor_parallel_size)
        self.learners.on_all(lambda a: a.join_transfer.remote(client, host, port), "join_transfer")

    def reform_group(self, joined: list = ()) -> None:
        """The transfer group formed again with the current samplers (``joined`` were not in the old one)."""
        if not self.transport.forms_group:
            return
        members = [s for s in self.fleet.live() if s not in joined] + self.learners.actors
        gather([a.leave_transfer.remote() for a in members], members, "leave_transfer", self.fleet.names)
        self.form_group()

    def admit(self, actors: list) -> None:
        """Samplers that missed syncs (new, or a replacement) serve the learner's current version before the next
        rollout: caught up through the run store, and taken into the transfer group."""
        if actors:
            self.catch_up(actors)
            self.reform_group(joined=actors)

    def release_servers(self) -> None:
        """External servers outlive the run: they leave its transfer group (the next run forms its own)."""
        if not (self.transport.forms_group and self.cfg.placement.samplers_are_servers and len(self.fleet)):
            return
        try:
            self.fleet.on_live(lambda a: a.leave_transfer.remote(), "leave_transfer")
        except (EngineLost, RayActorError) as exc:
            print(f"could not release the servers' weight-transfer group: {exc}")

    # ------------------------------------------------------------------------------------------- sync
    def sync(self) -> SyncResult:
        """Push the learner's weights to every sampler with the configured transport: samplers that came back
        since the last sync (replaced, or a server answering again) first rejoin the transfer group, then every
        learner rank publishes and every live sampler receives."""
        started = time.perf_counter()
        back = self.fleet.restore_members()
        keep = [v for v in self.fleet.versions() if v is not None] if self.transport.keeps_serving_versions else []
        if back or self.fleet.members_changed:  # a group with a dead or silent member would hang
            self.reform_group(joined=back)
        published = self.learners.publish(keep)
        self.fleet.on_live(lambda a: a.receive_weights.remote(published.version), "receive_weights")
        return SyncResult(seconds=time.perf_counter() - started, version=published.version,
                          transport=self.transport.kind, bytes=published.bytes, samplers_replaced=len(back),
                          samplers_out=len(self.fleet.dead))

    def catch_up(self, actors: list) -> int:
        """Bring samplers that were not in the last sync to the learner's current version through the run store
        (``weights/v-N/``); returns that version."""
        serving = [v for v in self.fleet.versions() if v is not None]
        version = self.learners.publish_to_store(serving).version
        gather([a.load_published.remote(version) for a in actors], actors, "load_published", self.fleet.names)
        print(f"{len(actors)} sampler(s) caught up to policy version {version} through "
              f"{self.cfg.storage.root}/.../weights/")
        return version

    def check(self, rows: dict[int, tuple[list[list[int]], list[int]]]) -> SyncCheck:
        """Right after a sync: every sampler in ``rows`` must have been handed exactly the learner's weights
        (``check_weights``: versions and per-tensor digests), else ``SyncCheckFailed``. Then the logprob gap on
        some of each sampler's sequences (``{sampler_id: (sequences, prompt lengths)}``), a measure of the engines'
        numerical mismatch."""
        ids = sorted(rows)
        published = self.learners.published_receipt()
        served = self.fleet.on(ids, lambda a: a.served_receipt.remote(), "served_receipt")
        tensors = check_weights(published, dict(zip(ids, served)))
        actors = [self.fleet.actors[i] for i in ids]
        sampled = gather([a.sampler_logprobs.remote(*rows[i]) for a, i in zip(actors, ids)], actors,
                         "sampler_logprobs", self.fleet.names)
        seqs = [s for i in ids for s in rows[i][0]]
        lens = [p for i in ids for p in rows[i][1]]
        gap = logprob_gap(ids, sampled, self.learners.logprobs(seqs, lens))
        check_gap(gap, self.cfg.weights.check_tolerance, "/".join(sorted(self.dtypes)) or "float32")
        return SyncCheck(tensors=tensors, gap=gap)
