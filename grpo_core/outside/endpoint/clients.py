"""The endpoint's clients as a run's source of groups (``endpoint.clients``): programs the run starts once its policy
endpoint serves (an OpenEnv environment's driver, an agent harness) that drive episodes through it and finish each
with its reward and group. Their groups reach the inbox on their own (``EpisodeGroups``); an iteration waits until
the inbox holds the groups it needs, while the clients are supervised (one that exits is started again); with no new
group for ``wait_s`` it goes on with what it has, or with nothing starts the clients again once (``WaitOver``)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from grpo_core.outside.source import FillStats, GroupRefused, GroupSink, Supervisor, WaitOver


@dataclass
class ClientsSource:
    clients: Supervisor
    wait_s: float  # without a new group for this long, the run fails
    poll_s: float = 0.1
    totals: FillStats = field(default_factory=FillStats)

    def start(self) -> "ClientsSource":
        self.clients.start()
        return self

    def fill(self, needed: int, sink: GroupSink, stale: Callable[[pa.Table], GroupRefused | None],
             waiting: Callable[[], int]) -> FillStats:
        """Wait until ``waiting()`` (the inbox's usable groups) reaches ``needed``. The groups are written by the
        endpoint as episodes finish, checked when taken: ``sink`` and ``stale`` are not used here."""
        stats = FillStats()
        started = last_change = time.monotonic()
        first = have = waiting()
        over = WaitOver(self.clients)
        while have < needed:
            self.clients.check(stats)
            time.sleep(self.poll_s)
            now = waiting()
            if now != have:
                have, last_change = now, time.monotonic()
            elif time.monotonic() - last_change > self.wait_s:
                what = (f"no finished group from the endpoint's clients for {self.wait_s:.0f} s "
                        f"(endpoint.groups_wait_s): the inbox holds {have} of the {needed} groups the iteration "
                        f"needs; clients: {self.clients.describe()}")
                if over.short(have, needed, what, stats):
                    break
                last_change = time.monotonic()
            stats.empty_polls += 1
        stats.groups, stats.wait_s = max(0, have - first), time.monotonic() - started
        self.totals.add(stats)
        return stats

    def close(self) -> None:
        self.clients.stop()
