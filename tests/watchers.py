"""Test helpers that act on a running flow from a thread: at a chosen moment of a rollout."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import psutil

from grpo_core.run.storage import RunStore


def recorded(store: RunStore, iteration: int) -> bool:
    """Whether ``iteration``'s row is in metrics.parquet (False while the file is not written yet)."""
    try:
        return iteration in store.read_metrics().column("iteration").to_pylist()
    except OSError:
        return False


def actor_runs(p: psutil.Process, method: str) -> bool:
    """Whether Ray's title of the engine actor process ``p`` says it is inside ``method``
    (``ray::EngineWorker.<method>``), the method's name matched whole: ``sampler_logprobs`` starts with ``sample``."""
    return f"EngineWorker.{method} " in " ".join(p.cmdline()) + " "


def suspended(p: psutil.Process) -> None:
    """SIGSTOP ``p`` and return once it is stopped (or gone): the signal is delivered asynchronously, and what is read
    of the process or its files afterwards must not change under the reader."""
    p.suspend()
    while p.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
        time.sleep(0.0005)


def during_rollout(store: RunStore, after_iteration: int, stop: threading.Event,
                   action: Callable[[psutil.Process], None]) -> list[int]:
    """Once ``after_iteration`` is in metrics.parquet, call ``action`` with the first sampler actor process seen
    inside ``sample``, i.e. in the middle of a rollout. Returns a list that gets that process's pid once the action
    ran.

    Ray titles an actor process ``ray::EngineWorker.sample`` while that method runs and puts its plain title back
    when it returns (``ray._private.worker._changeproctitle``). The title is matched whole: ``sampler_logprobs``
    (the sync check) starts with ``sample``, and a substring match once killed the sampler there, where the flow
    recovers differently. A title read, then an action, would still race the tiny model's rollout (a few
    milliseconds): the process is stopped first and its title read again while it cannot change, so the action lands
    inside ``sample`` or not at all (the process is let go and watched again)."""
    fired: list[int] = []

    def watch() -> None:
        while not stop.is_set() and not recorded(store, after_iteration):
            time.sleep(0.02)
        while not stop.is_set() and not fired:
            for p in psutil.Process().children(recursive=True):
                try:
                    if not actor_runs(p, "sample"):
                        continue
                    suspended(p)
                    if actor_runs(p, "sample"):
                        action(p)  # the process is left as the action leaves it
                        fired.append(p.pid)
                        return
                    p.resume()
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.002)

    threading.Thread(target=watch, daemon=True).start()
    return fired


class RequestTrap:
    """A TCP forwarder on a free loopback port in front of one server (``url`` is what the flow is given).

    Watching actor process titles for a rollout in progress races the tiny model, whose server can answer a whole
    shard in a few milliseconds: the action then lands after the answers. Here the action runs when the server is
    actually asked for completions: the first ``POST /v1/completions`` that reaches the server once ``after_iteration``
    is in metrics.parquet runs ``action`` (freeze or kill the server) before its bytes are passed on, so that request
    is in flight against a server that can no longer answer it. ``fired`` is set once the action ran."""

    MARK = b"POST /v1/completions"

    def __init__(self, port: int, store: RunStore, after_iteration: int, action: Callable[[], None]):
        self.target = port
        self.store, self.after = store, after_iteration
        self.action = action
        self.fired = threading.Event()
        self._armed = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _is_armed(self) -> bool:
        self._armed = self._armed or recorded(self.store, self.after)
        return self._armed

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()  # the server is gone: the client sees its connection closed
                continue
            upstream.settimeout(None)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if from_client and self.MARK in chunk and not self.fired.is_set():
                    with self._lock:
                        if not self.fired.is_set() and self._is_armed():
                            self.action()
                            self.fired.set()
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
