"""Test helpers that act on a running flow from a thread: at a chosen moment of a rollout."""
from __future__ import annotations

import threading
import time
from typing import Callable

import psutil

from grpo_core.storage import RunStore


def during_rollout(store: RunStore, after_iteration: int, stop: threading.Event,
                   action: Callable[[psutil.Process], None]) -> list[int]:
    """Once ``after_iteration`` is in metrics.parquet, call ``action`` with the first sampler actor process seen
    inside ``sample`` (Ray titles a busy actor process ``ray::EngineWorker.sample``), i.e. in the middle of a
    rollout. Returns a list that gets that process's pid once the action ran."""
    fired: list[int] = []

    def watch() -> None:
        while not stop.is_set():
            try:
                if after_iteration in store.read_metrics().column("iteration").to_pylist():
                    break
            except OSError:
                pass
            time.sleep(0.02)
        while not stop.is_set() and not fired:
            for p in psutil.Process().children(recursive=True):
                try:
                    if "EngineWorker.sample" in " ".join(p.cmdline()):
                        action(p)
                        fired.append(p.pid)
                        return
                except psutil.NoSuchProcess:
                    pass
            time.sleep(0.002)

    threading.Thread(target=watch, daemon=True).start()
    return fired
