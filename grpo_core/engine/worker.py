"""The engines of one Ray actor: a vLLM sampler, a DeepSpeed learner rank, or both (the colocated placement).

This is a plain class (testable without Ray); ``grpo_core.cluster`` places it as long-lived actors. It is composed of
the two roles (``grpo_core.engine.roles.sampler.SamplerRole``, ``grpo_core.engine.roles.learner.LearnerRole``), each a module a
reader can hold in mind, and holds what they share: the config, the run store, this actor's ends of the weight
transport. Construction is cheap; ``setup`` builds the engines, so that the learner ranks of a run can first agree
on where their process group meets (rank 0's ``address``) and then start together.
"""
from __future__ import annotations

import os
import socket
import time
import torch

from grpo_core.run.checkpoint import CheckpointWriter
from grpo_core.config import GRPOConfig
from grpo_core.run.logs import redirect_process_output
from grpo_core.infra.netaddr import free_port
from grpo_core.engine.precision import resolve_dtype
from grpo_core.engine.results import ActorInfo, TrainStep, Versions
from grpo_core.engine.roles.learner import LearnerRole
from grpo_core.engine.roles.sampler import SamplerRole
from grpo_core.engine.roles.threads import pin_torch_threads
from grpo_core.run.storage import RunStore
from grpo_core.weights.files import FilesTransport
from grpo_core.weights.factory import make_transport
from grpo_core.weights.transport import Ends


class EngineWorker(SamplerRole, LearnerRole):
    def __init__(self, cfg: GRPOConfig, sampler_id: int | None = None, learner_rank: int | None = None,
                 output_file: str | None = None):
        """``output_file``: this process's stdout and stderr go there (the run folder's logs/, see grpo_core.run.logs);
        only for an actor process of its own, never in a caller's process."""
        if sampler_id is None and learner_rank is None:
            raise ValueError("an engine worker holds a sampler, a learner rank, or both")
        if output_file is not None:
            redirect_process_output(output_file)
        self.cfg = cfg
        self.sampler_id, self.learner_rank = sampler_id, learner_rank
        self.store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
        self.sampler = None
        self._episodes = None  # multi-turn runs: the sampler role's environments (grpo_core.envs)
        self.learner = None
        self.critic = None  # PPO's value model beside the learner (critic section)
        self.startup_seconds = 0.0
        self._checkpoint: CheckpointWriter | None = None
        # (iteration, metrics) of the last update: a retried train call (its output write failed) must not step
        # the optimizer twice.
        self._last_train: tuple[int, TrainStep] | None = None
        self.transport = make_transport(cfg.transport)  # weights.transport: this actor's ends of it
        self._catch_up = FilesTransport()  # how a new sampler gets the current weights, whatever the transport
        self._rendezvous = None  # learner rank 0: the held TCPStore of the learners' group
        self.dtype = resolve_dtype(cfg.model.dtype)  # what this actor's engines compute in (auto: its device's)
        self.threads = torch.get_num_threads()  # the actor's OMP_NUM_THREADS, before any engine can change it

    def free_port(self, host: str) -> int:
        """A free port on this actor's node (for vLLM's weight-transfer rendezvous, which binds it itself)."""
        return free_port(host)

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> ActorInfo:
        """Build the engines: the learner group (all ranks call this together), vLLM, DeepSpeed."""
        started = time.perf_counter()
        if self.learner_rank is not None:  # the group first: in a colocated actor vLLM then runs inside it
            self._join_learner_group(master_addr, master_port)
        if self.sampler_id is not None:
            self._build_sampler()
        if self.learner_rank is not None:
            self._build_learner()
        pin_torch_threads(self.threads)
        self.startup_seconds = time.perf_counter() - started
        return self.info()

    @property
    def ends(self) -> Ends:
        """This actor's ends of the weight transport."""
        return Ends(cfg=self.cfg, store=self.store, learner=self.learner, sampler=self.sampler,
                    rank=self.learner_rank)

    # ------------------------------------------------------------------------------------------------ status
    def info(self) -> ActorInfo:
        return ActorInfo(sampler_id=self.sampler_id, learner_rank=self.learner_rank,
                         sampler_load_s=self.sampler.load_seconds if self.sampler else 0.0,
                         learner_init_s=self.learner.init_seconds if self.learner else 0.0,
                         startup_s=self.startup_seconds, pid=os.getpid(), host=socket.gethostname(),
                         dtype=self.dtype, threads=self.threads)

    def versions(self) -> Versions:
        return Versions(sampler=self.sampler.version if self.sampler else None,
                        learner=self.learner.version if self.learner else None)

    def leave_transfer(self) -> None:
        """Leave the transfer group (either role; before the group is formed again with other samplers)."""
        self.transport.leave_group(self.ends)
