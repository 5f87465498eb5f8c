"""Finished episodes, gathered by group, written as inbox items: how the endpoint's episodes reach training.

GRPO compares the G samples of one task: an environment finishes each episode with its reward and the task's
``group`` name, and once G episodes of a group are in, they are written as one inbox item (``inbox/<name>.parquet``
then ``<name>.ready``), which the flow takes under the staleness rule like any inbox group. An episode finished
without a group, or into a group that already has G, is refused at finish time (the client hears why); a group
still short of G when the run ends is reported, not trained on.

A complete group that cannot be trained on (its episodes start from different prompts, a row the inbox would refuse,
rewards whose group statistics are not finite) is not lost: it goes to ``inbox/rejected/<name>.parquet`` (each
episode a row, as its own group when the prompts differ) with ``<name>.error.json`` giving the reason, as the
inbox keeps the items it refuses, and the finish call that completed it answers with that fate (``GroupFate``). A
group the run folder cannot take (a storage fault) waits again for its last episode, whose finish can be tried again.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from grpo_core.outside.endpoint.policy import episode_rows
from grpo_core.outside.endpoint.recorder import FinishedEpisode
from grpo_core.outside.endpoint.requests import RequestError
from grpo_core.pipeline.inbox import INBOX, REJECTED, InboxError, put_item, validate
from grpo_core.run.storage import RunStore


@dataclass(frozen=True)
class GroupFate:
    """What a finish did to its group: nothing yet (both None), written as inbox item ``item``, or ``rejected``
    (the ``inbox/rejected/`` item's name and the reason: file, row, field, error)."""
    item: str | None = None
    rejected: dict[str, Any] | None = None


def _prompt_error(members: list[FinishedEpisode], url: str) -> InboxError | None:
    """GRPO compares samples of one prompt: an episode that starts from another prompt than the first's."""
    first = members[0]
    other = next((i for i, e in enumerate(members) if e.prompt_ids != first.prompt_ids), None)
    if other is None:
        return None
    return InboxError(url, other, "prompt_token_ids", f"episode {members[other].episode_id!r} starts from another "
                                                      f"prompt than episode {first.episode_id!r} of its group: a "
                                                      "group's episodes are samples of one prompt")


def _statistics_error(rewards: list[float | None], url: str) -> InboxError | None:
    """The group's reward statistics as the learner computes them (float32): finite, or the reason they are not."""
    scored = np.array([r for r in rewards if r is not None], dtype=np.float64)
    if scored.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        as_trained = scored.astype(np.float32)
        stats = (as_trained.mean(), as_trained.std())
    if not np.isfinite(as_trained).all() or not all(np.isfinite(s) for s in stats):
        return InboxError(url, None, "reward", f"the group's rewards {scored.tolist()} have no finite float32 mean "
                                               "and standard deviation: GRPO's advantages could not be computed")
    return None


class EpisodeGroups:
    def __init__(self, store: RunStore, group_size: int, prefix: str = "endpoint"):
        self.store, self.group_size, self.prefix = store, group_size, prefix
        self._groups: dict[str, list[FinishedEpisode]] = {}
        self._lock = threading.Lock()
        self.items_written = 0
        self.groups_rejected = 0

    def check(self, group: str | None) -> None:
        """Before an episode is finished into ``group``: refuse what could never be trained on."""
        if group is None:
            raise RequestError(f"finish needs the episode's group (the task it is one of {self.group_size} "
                               "samples of)", param="group")
        with self._lock:
            if len(self._groups.get(group, ())) >= self.group_size:
                raise RequestError(f"group {group!r} already has its {self.group_size} episodes", param="group",
                                   code="group_full", status=409)

    def add(self, episode: FinishedEpisode) -> GroupFate:
        """Keep ``episode``; when its group is complete, the group is written to the inbox, or, when it cannot be
        trained on, kept under ``inbox/rejected/`` with the reason."""
        with self._lock:
            members = self._groups.setdefault(episode.group, [])
            members.append(episode)
            if len(members) < self.group_size:
                return GroupFate()
            del self._groups[episode.group]
            self.items_written += 1
            name = f"{self.prefix}-{time.time_ns()}-{self.items_written:06d}"
        url = self.store.url(f"{INBOX}/{name}.parquet")
        table, error = None, _prompt_error(members, url)
        if error is None:
            try:
                table = validate(episode_rows([members]), url, self.group_size)
                error = _statistics_error(table.column("reward").to_pylist(), url)
            except InboxError as exc:
                error = exc
        try:
            if error is None:
                put_item(self.store, name, table)
                return GroupFate(item=name)
            return GroupFate(rejected=self._reject(name, members, error))
        except BaseException:  # the run folder did not take it: the group waits again for its last episode
            with self._lock:
                self._groups.setdefault(episode.group, [])[:0] = members[:-1]
            raise

    def _reject(self, name: str, members: list[FinishedEpisode], error: InboxError) -> dict[str, Any]:
        """The group's episodes as rows (each its own group: they may not share a prompt) and why, under
        ``inbox/rejected/``; nothing of them is dropped."""
        rows = episode_rows([[e] for e in members])
        buf = pa.BufferOutputStream()
        pq.write_table(rows, buf)
        self.store.put_bytes(f"{REJECTED}/{name}.parquet", buf.getvalue().to_pybytes())
        reason = {**error.as_dict(), "item": name, "group": members[0].group, "source": "policy endpoint",
                  "episode_ids": [e.episode_id for e in members]}
        self.store.put_json_file(f"{REJECTED}/{name}.error.json", reason)
        with self._lock:
            self.groups_rejected += 1
        print(f"policy endpoint: group {members[0].group!r} cannot be trained on ({error}); kept in "
              f"{self.store.url(f'{REJECTED}/{name}.parquet')}")
        return reason

    def incomplete(self) -> dict[str, int]:
        """Groups still short of their episodes: name -> episodes in."""
        with self._lock:
            return {g: len(m) for g, m in self._groups.items()}
