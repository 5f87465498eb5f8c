"""The registry as one JSON document, ``registry.json``, in a folder (local, or any fsspec URL such as S3).

Every change rewrites the whole document at once (a rename on a local disk, one PUT on an object store), so a reader
sees the registry before a change or after it, never half of it. For teams that do not run MLflow.
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from grpo_core.registry import lock
from grpo_core.registry.records import (Action, ModelVersion, RegistryEvent, RegistryUnavailable, utc_now,
                                        version_of)
from grpo_core.storage.files import RunFolder

DOCUMENT = "registry.json"


class FolderRegistry:
    def __init__(self, folder: str, name: str, storage_options: dict | None = None):
        parent, base = posixpath.split(folder.rstrip("/"))
        self._folder = RunFolder(parent or ".", base, storage_options)
        self.name = name
        self.location = f"{self._folder.uri}/{DOCUMENT} (model {name})"

    def _load(self) -> dict[str, Any]:
        try:
            doc = self._folder.get_json_file(DOCUMENT)
        except (OSError, json.JSONDecodeError) as err:
            raise RegistryUnavailable(f"{self.location}: cannot read it: {err}") from err
        if doc is None:
            return {"name": self.name, "champion": None, "versions": [], "events": []}
        if doc.get("name") != self.name:
            raise RegistryUnavailable(f"{self.location}: the document there registers model {doc.get('name')!r}, "
                                      f"not {self.name!r} (one folder holds one model: set registry.uri)")
        return doc

    def _save(self, doc: dict[str, Any]) -> None:
        try:
            self._folder.put_json_file(DOCUMENT, doc)
        except OSError as err:
            raise RegistryUnavailable(f"{self.location}: cannot write it: {err}") from err

    def versions(self) -> list[ModelVersion]:
        return [ModelVersion.from_json(v) for v in self._load()["versions"]]

    def events(self) -> list[RegistryEvent]:
        return [RegistryEvent.from_json(e) for e in self._load()["events"]]

    def champion(self) -> ModelVersion | None:
        doc = self._load()
        number = doc["champion"]
        if number is None:
            return None
        return version_of([ModelVersion.from_json(v) for v in doc["versions"]], number, self.location)

    def _move(self, doc: dict[str, Any], action: Action, version: int, champion: int | None, by: str,
              reason: str) -> None:
        doc["events"].append(RegistryEvent(action, version, doc["champion"], champion, by, reason).to_json())
        doc["champion"] = champion
        self._save(doc)

    def record(self, candidate: ModelVersion, by: str) -> ModelVersion:
        doc = self._load()
        number = 1 + max((v["version"] for v in doc["versions"]), default=0)
        registered = replace(candidate, version=number, registered_at=utc_now())
        doc["versions"].append(registered.to_json())
        champion = number if candidate.decision == "promoted" else doc["champion"]
        self._move(doc, candidate.decision, number, champion, by, candidate.reason)
        return registered

    def set_champion(self, version: int, action: Action, by: str, reason: str) -> None:
        doc = self._load()
        version_of([ModelVersion.from_json(v) for v in doc["versions"]], version, self.location)
        self._move(doc, action, version, version, by, reason)

    def lock(self, on_wait: Callable[[str], None] = print) -> AbstractContextManager[None]:
        local = self._folder.uri if self._folder.is_local else None
        return lock.exclusive(lock.lock_path(self.location, local), self.location, on_wait)
