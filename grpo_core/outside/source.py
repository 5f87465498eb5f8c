"""Where an outside-driven run's groups come from, behind one interface: an Atropos API server's ``/batch``
(``grpo_core.outside.atropos.source.AtroposSource``) or the endpoint's own clients, programs that drive episodes through the
policy endpoint (``grpo_core.outside.endpoint.clients.ClientsSource``). Either way an iteration asks its source to ``fill``
the run folder's inbox until it holds the groups the iteration needs, and takes them like any inbox group; the run
samples no prompt of its own. The processes a source starts are supervised alike (``Supervisor``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Protocol

import pyarrow as pa

from grpo_core.infra.child_process import ChildProcess


class SourceStarved(RuntimeError):
    """No usable group in time, a process out of restarts, or a server gone for too long: the run cannot go on."""


class GroupRefused(ValueError):
    """A group that is not trained on: ``sequence`` (None: the whole group) and ``field`` say where."""

    def __init__(self, sequence: int | None, field: str | None, reason: str):
        where = (f"sequence {sequence}" if sequence is not None else "the group") + \
            (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {reason}")
        self.sequence, self.field, self.reason = sequence, field, reason

    def as_dict(self) -> dict[str, Any]:
        return {"sequence": self.sequence, "field": self.field, "error": self.reason}


class GroupSink(Protocol):
    """Where a source puts what it receives (the inbox): a group as rows, or a refusal with the group as sent."""

    def accepted(self, table: pa.Table) -> None: ...

    def refused(self, group: Any, error: GroupRefused) -> None: ...


@dataclass
class FillStats:
    groups: int = 0        # groups the source put into the inbox
    refused: int = 0       # groups it refused (with their reason)
    empty_polls: int = 0
    server_restarts: int = 0
    process_restarts: int = 0
    wait_s: float = 0.0
    short: int = 0         # groups the iteration goes without: nothing came for the wait (see ``go_on_short``)

    def add(self, other: "FillStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


class WaitOver:
    """What a source does when nothing new came for its wait: with some usable group the iteration goes on with what
    it has (the rest of its batch masked out: ``tasks/score.py``); with none, the processes that should have sent
    something (alive but silent: hung) are started again, once per iteration, and waited for again; then the run
    cannot go on."""

    def __init__(self, supervisor: "Supervisor"):
        self.supervisor, self.restarted = supervisor, False

    def short(self, have: int, needed: int, what: str, stats: "FillStats") -> bool:
        """True: go on short (``stats.short`` set); False: processes restarted, wait again; or SourceStarved."""
        if have >= 1:
            print(f"{what}; the iteration goes on with {have} of its {needed} groups")
            stats.short = needed - have
            return True
        if self.restarted or not self.supervisor.processes:
            raise SourceStarved(what)
        self.supervisor.restart_all(stats, what)
        self.restarted = True
        return False


class OutsideSource(Protocol):
    totals: FillStats

    def start(self) -> "OutsideSource": ...

    def fill(self, needed: int, sink: GroupSink, stale: Callable[[pa.Table], GroupRefused | None],
             waiting: Callable[[], int]) -> FillStats:
        """Until the inbox holds ``needed`` usable groups (``waiting()`` counts them): groups the source receives
        go through ``sink`` (refused when ``stale`` says so); a source whose groups reach the inbox on their own
        waits for them."""
        ...

    def close(self) -> None: ...


@dataclass
class Supervisor:
    """The processes a source started: one that exits is started again, ``restarts`` times each."""
    processes: list[ChildProcess]
    restarts: int

    def start(self) -> None:
        for p in self.processes:
            p.start()

    def check(self, stats: FillStats) -> None:
        for p in self.processes:
            code = p.exit_code()
            if code is None:
                continue
            if p.starts > self.restarts:
                raise SourceStarved(f"{p.name} exited ({code}) after {p.starts} starts (restarts allowed: "
                                    f"{self.restarts}); its log {p.log_path} ends:\n{p.log_tail()}")
            print(f"{p.name} exited ({code}); starting it again ({p.starts}/{self.restarts + 1}), log {p.log_path}")
            p.start()
            stats.process_restarts += 1

    def restart_all(self, stats: FillStats, why: str) -> None:
        """Stop and start every process (one that hangs is alive but sends nothing), within its restarts."""
        for p in self.processes:
            if p.starts > self.restarts:
                raise SourceStarved(f"{why}; {p.name} has used its {self.restarts} restarts")
            print(f"{why}: starting {p.name} again (log {p.log_path})")
            p.stop()
            p.start()
            stats.process_restarts += 1

    def describe(self) -> str:
        return "; ".join(f"{p.name}: {'running' if p.running() else f'exited {p.exit_code()}'}, "
                         f"{p.starts} start(s), log {p.log_path}" for p in self.processes) or "none started by the run"

    def stop(self) -> None:
        for p in self.processes:
            p.stop()
