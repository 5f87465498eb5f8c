"""The learner ranks as one handle: what the driver asks of DeepSpeed's data-parallel group.

Every call goes to every rank (the update, checkpoints, ZeRO-3's gathers are collectives) unless it is rank 0's
work alone; any rank's death is ``EngineLost`` (a learner rank cannot rejoin a running process group: the flow
recreates every actor and restores the latest checkpoint).
"""
from __future__ import annotations

from typing import Any, Callable

from grpo_core.run.checkpoint import CheckpointRef, PendingCheckpoint
from grpo_core.cluster.calls import ActorNames, gather, on_each
from grpo_core.cluster.ray_cluster import node_ip
from grpo_core.config import GRPOConfig
from grpo_core.engine.results import FinalPolicy, TrainStep
from grpo_core.weights.transport import Published
from grpo_core.engine.weights_digest import Receipt


class LearnerGroup:
    def __init__(self, cfg: GRPOConfig, actors: list, names: ActorNames):
        self.cfg = cfg
        self.actors = actors
        self.names = names

    def on_all(self, call: Callable[[Any], Any], what: str, ranks: list[int] | None = None) -> list:
        """``call(actor)`` on every rank, or on ``ranks``."""
        return on_each(self.actors if ranks is None else [self.actors[r] for r in ranks], call, what, self.names)

    def on_rank0(self, call: Callable[[Any], Any], what: str):
        """A call whose work happens on rank 0; under ZeRO-3 every rank joins (gathering the full weights is a
        collective)."""
        return self.on_all(call, what, ranks=None if self.cfg.train.zero_stage == 3 else [0])[0]

    # ------------------------------------------------------------------------------------- process group
    def rendezvous(self) -> tuple[str, int]:
        """Rank 0 binds the group's rendezvous on its node: (host, port) for every rank's ``setup``."""
        host = node_ip(self.actors[0])
        port = gather([self.actors[0].open_rendezvous.remote(host)], self.actors[:1], "open_rendezvous",
                      self.names)[0]
        return host, port

    def free_port(self) -> tuple[str, int]:
        """A free port on rank 0's node (a transfer group's rendezvous, which vLLM binds itself)."""
        host = node_ip(self.actors[0])
        return host, gather([self.actors[0].free_port.remote(host)], self.actors[:1], "free_port", self.names)[0]

    # ----------------------------------------------------------------------------------------- training
    def train(self, iteration: int) -> TrainStep:
        return TrainStep.merge(self.on_all(lambda a: a.train.remote(iteration), "train"))

    def version(self) -> int:
        return self.on_all(lambda a: a.versions.remote(), "versions", ranks=[0])[0].learner

    def logprobs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The learner's raw logprobs of each sequence's tokens after its prompt (a collective under ZeRO-3)."""
        return self.on_all(lambda a: a.learner_logprobs.remote(sequences, prompt_lens), "learner_logprobs")[0]

    # -------------------------------------------------------------------------------------------- weights
    def publish(self, keep_versions: list[int]) -> Published:
        """The configured transport's learner side on every rank; rank 0's account of it."""
        return self.on_all(lambda a: a.publish_weights.remote(keep_versions), "publish_weights")[0]

    def publish_to_store(self, keep_versions: list[int]) -> Published:
        """The catch-up route: the current version into the run store's ``weights/v-N/`` (rank 0 writes)."""
        return self.on_rank0(lambda a: a.publish.remote(keep_versions), "publish")

    def published_receipt(self) -> Receipt:
        """The learner's side of the sync check: its version and the digest of its weights as published."""
        return self.on_rank0(lambda a: a.published_receipt.remote(), "published_receipt")

    # ---------------------------------------------------------------------------------------- checkpoints
    def checkpoint_begin(self, iteration: int) -> PendingCheckpoint:
        """Every rank copies its state after ``iteration`` and writes it in the background."""
        started = self.on_all(lambda a: a.checkpoint_begin.remote(iteration), "checkpoint_begin")
        return PendingCheckpoint(iteration=iteration, policy_version=started[0].policy_version,
                                 snapshot_seconds=max(s.snapshot_seconds for s in started),
                                 ranks=[None] * len(self.actors))

    def poll(self, pending: PendingCheckpoint, wait: bool = False) -> bool:
        """Ask the ranks still writing ``pending`` for their files (``wait``: until written); True once all are."""
        todo = pending.waiting_for
        for rank, written in zip(todo, self.on_all(lambda a: a.checkpoint_result.remote(wait), "checkpoint_result",
                                                   ranks=todo)):
            pending.ranks[rank] = written
        return not pending.waiting_for

    def restore(self, ref: CheckpointRef) -> None:
        """Every rank loads the committed checkpoint ``ref`` (the caller then syncs the samplers)."""
        self.on_all(lambda a: a.restore.remote(ref), "restore")

    def save_final(self) -> FinalPolicy:
        return self.on_rank0(lambda a: a.save_final.remote(), "save_final")
