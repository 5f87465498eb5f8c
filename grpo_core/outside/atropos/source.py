"""The run's side of Atropos: the API server (started by the run or joined), the environments' processes, and the
pulls of scored groups that feed the iterations.

The run registers with a batch of one group (``batch_size`` = the group size), so each ``/batch`` answer is one
group: an iteration pulls exactly the groups it needs, and an environment's ``max_batches_offpolicy`` counts groups
queued ahead. Atropos counts "steps" per ``/batch`` answer, so its steps are groups here. Faults: an environment that
exits is started again (``env_restarts`` times, ``outside_source.Supervisor``); an API server that stops answering
is waited for (``api_timeout_s``; one the run started is started again and the run registers again); an iteration
that gets no group for ``wait_s`` goes on with the groups it has, or with none starts the environments again (hung)
and waits once more, then fails with the queue's and each environment's state (``WaitOver``). A group pulled is written to
the run folder before the next pull (``GroupSink``), so a crash loses at most the answer in flight; groups still
queued in an API server the run started die with it (its queue is in memory), and the environments sample new ones.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

import pyarrow as pa

from grpo_core.outside.atropos.client import AtroposClient, AtroposUnavailable, BadBatch, Registration
from grpo_core.outside.atropos.groups import GroupLimits, group_rows
from grpo_core.infra.child_process import ChildProcess
from grpo_core.outside.endpoint.ledger import SampledLedger
from grpo_core.outside.source import FillStats, GroupRefused, GroupSink, SourceStarved, Supervisor, WaitOver


@dataclass
class AtroposSource:
    client: AtroposClient
    registration: Registration
    limits: GroupLimits
    ledger: SampledLedger
    decode: Callable[[list[int]], str]
    api: ChildProcess | None  # None: joined, not ours to restart
    envs: Supervisor
    wait_s: float
    api_timeout_s: float
    poll_s: float = 0.2
    totals: FillStats = field(default_factory=FillStats)

    def __post_init__(self) -> None:
        if self.limits.max_sequence_len is None:  # no sequence longer than the trainer registered to take
            self.limits = replace(self.limits, max_sequence_len=self.registration.max_token_len)

    def start(self) -> "AtroposSource":
        """API server up (started when ours), registered, its first /batch asked (environments may only register
        after it), then the environments started."""
        try:
            if self.api is not None:
                self.api.start()
            self._wait_for_api()
            self.client.register(self.registration)
            self.client.batch()
            self.envs.start()
        except BaseException:
            self.close()  # nothing started is left behind
            raise
        return self

    def _wait_for_api(self) -> None:
        try:
            self.client.wait_up(self.api_timeout_s)
        except AtroposUnavailable as exc:
            tail = f"; its log ends:\n{self.api.log_tail()}" if self.api is not None else ""
            raise SourceStarved(f"the Atropos API server at {self.client.url} does not answer: {exc}{tail}") from exc

    def _recover_api(self, exc: AtroposUnavailable, stats: FillStats) -> None:
        print(f"atropos: the API server does not answer ({exc}); "
              + ("starting it again" if self.api is not None and not self.api.running() else "waiting for it"))
        if self.api is not None and not self.api.running():
            self.api.start()
            stats.server_restarts += 1
        self._wait_for_api()
        self.client.register(self.registration)  # a restarted server lost it; a running one keeps its queue

    def fill(self, needed: int, sink: GroupSink, stale: Callable[[pa.Table], GroupRefused | None],
             waiting: Callable[[], int]) -> FillStats:
        """Pull until the inbox holds ``needed`` usable groups (``waiting()`` of them before): each accepted group
        goes to ``sink`` at once, each refused one (``stale`` included) with the reason."""
        stats = FillStats()
        started = last_group = time.monotonic()
        waited = waiting()
        wanted = needed - waited
        over = WaitOver(self.envs)
        while stats.groups < wanted:
            self.envs.check(stats)
            try:
                batch = self.client.batch()
            except BadBatch as bad:  # an answer that cannot be read as groups: refused whole, with the text
                sink.refused(bad.text, GroupRefused(None, None, bad.reason))
                stats.refused += 1
                continue
            except AtroposUnavailable as exc:
                self._recover_api(exc, stats)
                continue
            if not batch:
                stats.empty_polls += 1
                if time.monotonic() - last_group > self.wait_s:
                    if over.short(waited + stats.groups, needed, self._starved_message(stats, wanted), stats):
                        break
                    last_group = time.monotonic()
                time.sleep(self.poll_s)
                continue
            last_group = time.monotonic()
            for group in batch:
                try:
                    table = group_rows(group, self.limits, self.ledger, self.decode)
                    error = stale(table)
                    if error is not None:
                        raise error
                except GroupRefused as refused:
                    sink.refused(group, refused)
                    stats.refused += 1
                    continue
                sink.accepted(table)
                stats.groups += 1
        stats.wait_s = time.monotonic() - started
        self.totals.add(stats)
        return stats

    def _starved_message(self, stats: FillStats, wanted: int) -> str:
        try:
            queue = self.client.status()
        except AtroposUnavailable as exc:
            queue = f"unknown ({exc})"
        envs = self.envs.describe()
        return (f"no usable group from the Atropos API server at {self.client.url} for {self.wait_s:.0f} s "
                f"(atropos.wait_s): {stats.groups}/{wanted} groups this iteration, {stats.refused} refused; "
                f"server status {queue}; environments: {envs}")

    def close(self) -> None:
        self.envs.stop()
        if self.api is not None:
            self.api.stop()
        self.client.close()
