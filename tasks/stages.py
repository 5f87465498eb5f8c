"""The flow run's tasks, each with the storage retry policy of the run's config and called through `Opaque`: every
stage the flow and its batch sources run goes through one ``Stages``."""
from __future__ import annotations

from grpo_core.config import GRPOConfig
from tasks.checkpoint import begin_checkpoint, commit_checkpoint, restore, save_final
from tasks.context import Opaque
from tasks.conversations import conversations
from tasks.evaluate import evaluate
from tasks.gate import gate
from tasks.inbox import take_inbox
from tasks.io_retry import io_retry_options
from tasks.outside import fill_inbox
from tasks.rollout import rollout
from tasks.run_state import latest_checkpoint, prepare_run, record, resolve_inputs, scale_samplers, write_status
from tasks.score import assemble, score
from tasks.sync import sync
from tasks.train import train


class Stages:
    """The tasks of one flow run, wrapped once."""

    def __init__(self, cfg: GRPOConfig):
        opts = io_retry_options(cfg.storage)

        def stage(fn) -> Opaque:
            return Opaque(fn.with_options(**opts))

        self.prepare_run, self.resolve_inputs = stage(prepare_run), stage(resolve_inputs)
        self.take_inbox, self.rollout, self.score, self.assemble = \
            stage(take_inbox), stage(rollout), stage(score), stage(assemble)
        self.fill_inbox, self.conversations = stage(fill_inbox), stage(conversations)
        self.train, self.sync, self.evaluate = stage(train), stage(sync), stage(evaluate)
        self.begin_checkpoint, self.commit_checkpoint = stage(begin_checkpoint), stage(commit_checkpoint)
        self.latest_checkpoint, self.restore, self.save_final = \
            stage(latest_checkpoint), stage(restore), stage(save_final)
        self.record, self.write_status, self.scale_samplers = stage(record), stage(write_status), stage(scale_samplers)
        self.gate = stage(gate)
