"""Finished episodes, gathered by group, written as inbox items: how the endpoint's episodes reach training.

GRPO compares the G samples of one task: an environment finishes each episode with its reward and the task's
``group`` name, and once G episodes of a group are in, they are written as one inbox item (``inbox/<name>.parquet``
then ``<name>.ready``), which the flow takes under the staleness rule like any inbox group. An episode finished
without a group, or into a group that already has G, is refused at finish time (the client hears why); a group
still short of G when the run ends is reported, not trained on.
"""
from __future__ import annotations

import threading
import time


from grpo_core.endpoint.policy import episode_rows
from grpo_core.endpoint.recorder import FinishedEpisode, RequestError
from grpo_core.pipeline.inbox import put_item
from grpo_core.storage import RunStore


class EpisodeGroups:
    def __init__(self, store: RunStore, group_size: int, prefix: str = "endpoint"):
        self.store, self.group_size, self.prefix = store, group_size, prefix
        self._groups: dict[str, list[FinishedEpisode]] = {}
        self._lock = threading.Lock()
        self.items_written = 0

    def check(self, group: str | None) -> None:
        """Before an episode is finished into ``group``: refuse what could never be trained on."""
        if group is None:
            raise RequestError(f"finish needs the episode's group (the task it is one of {self.group_size} "
                               "samples of)", param="group")
        with self._lock:
            if len(self._groups.get(group, ())) >= self.group_size:
                raise RequestError(f"group {group!r} already has its {self.group_size} episodes", param="group",
                                   code="group_full", status=409)

    def add(self, episode: FinishedEpisode) -> str | None:
        """Keep ``episode``; returns the inbox item's name when its group is complete and written."""
        with self._lock:
            members = self._groups.setdefault(episode.group, [])
            members.append(episode)
            if len(members) < self.group_size:
                return None
            del self._groups[episode.group]
            self.items_written += 1
            name = f"{self.prefix}-{time.time_ns()}-{self.items_written:06d}"
        put_item(self.store, name, episode_rows([members]))
        return name

    def incomplete(self) -> dict[str, int]:
        """Groups still short of their episodes: name -> episodes in."""
        with self._lock:
            return {g: len(m) for g, m in self._groups.items()}
