"""The registry as one JSON document, ``registry.json``, in a folder (local, or any fsspec URL such as S3).

Every change rewrites the whole document at once, so a reader sees the registry before a change or after it, never
half of it. The commit point of a change is the one write of the document: on a local disk the rename of a fully
written and fsynced temporary file over ``registry.json`` (`RunFolder.put_json_file`), on an object store its one
PUT. A fault before it leaves the old document; nothing is written before it that a reader could see.

No ``registry.json`` is "no registry yet" (an empty one). A ``registry.json`` that is not a registry (empty, not
JSON, a list, keys missing, a champion that is no version) is `RegistryCorrupt`, naming the file: never read as
empty, never overwritten. For teams that do not run MLflow.
"""
from __future__ import annotations

import posixpath
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_core.lifecycle.registry import lock
from grpo_core.lifecycle.registry.records import (Action, ModelVersion, RegistryCorrupt, RegistryEvent, RegistryUnavailable,
                                        one_line, status_line, utc_now, version_of)
from grpo_core.run.storage.errors import StorageError
from grpo_core.run.storage.files import RunFolder

DOCUMENT = "registry.json"
KEYS = ("name", "champion", "versions", "events")


@dataclass
class RegistryDocument:
    """What ``registry.json`` holds: the whole registry of one model."""

    name: str
    champion: int | None = None
    versions: list[ModelVersion] = field(default_factory=list)
    events: list[RegistryEvent] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "champion": self.champion, "versions": [v.to_json() for v in self.versions],
                "events": [e.to_json() for e in self.events]}


def parse_document(doc: Any) -> RegistryDocument:
    """``registry.json``'s content as a registry (ValueError, one line: what makes it none)."""
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object with {', '.join(KEYS)}")
    missing = [k for k in KEYS if k not in doc]
    if missing:
        raise ValueError(f"no {', '.join(missing)} (a registry document has {', '.join(KEYS)})")
    if not isinstance(doc["name"], str):
        raise ValueError(f"name: {doc['name']!r} is not a model name")
    for key in ("versions", "events"):
        if not isinstance(doc[key], list):
            raise ValueError(f"{key}: a JSON {type(doc[key]).__name__}, not a list")
    versions = [_entry(ModelVersion, "versions", i, v) for i, v in enumerate(doc["versions"])]
    events = [_entry(RegistryEvent, "events", i, e) for i, e in enumerate(doc["events"])]
    numbers = [v.version for v in versions]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"versions: a number given twice ({', '.join(map(str, numbers))})")
    champion = doc["champion"]
    if champion is not None and (isinstance(champion, bool) or not isinstance(champion, int)
                                 or champion not in numbers):
        raise ValueError(f"champion: {champion!r} is none of its versions ({', '.join(map(str, numbers)) or 'none'})")
    return RegistryDocument(doc["name"], champion, versions, events)


def _entry(cls, key: str, index: int, doc: Any):
    try:
        return cls.from_json(doc)
    except ValueError as err:
        raise ValueError(f"{key}[{index}]: {err}") from None


class FolderRegistry:
    def __init__(self, folder: str, name: str, storage_options: dict | None = None):
        parent, base = posixpath.split(folder.rstrip("/"))
        self._folder = RunFolder(parent or ".", base, storage_options)
        self.name = name
        self.location = f"{self._folder.uri}/{DOCUMENT} (model {name})"

    def _load(self) -> RegistryDocument:
        try:
            doc = self._folder.get_json_file(DOCUMENT)
        except StorageError as err:  # there, but not JSON
            raise RegistryCorrupt(f"{self.location}: not a registry document: {one_line(err)}") from err
        except OSError as err:
            raise RegistryUnavailable(f"{self.location}: cannot read it: {one_line(err)}") from err
        if doc is None:  # no file: no registry yet
            return RegistryDocument(self.name)
        try:
            parsed = parse_document(doc)
        except ValueError as err:
            raise RegistryCorrupt(f"{self.location}: not a registry document: {err}") from None
        if parsed.name != self.name:
            raise RegistryUnavailable(f"{self.location}: the document there registers model {parsed.name!r}, "
                                      f"not {self.name!r} (one folder holds one model: set registry.uri)")
        return parsed

    def _save(self, doc: RegistryDocument) -> None:
        """The commit point: the one write of the whole document."""
        try:
            self._folder.put_json_file(DOCUMENT, doc.to_json())
        except OSError as err:
            raise RegistryUnavailable(f"{self.location}: cannot write it (the registry is as it was): "
                                      f"{one_line(err)}") from err

    def versions(self) -> list[ModelVersion]:
        return self._load().versions

    def events(self) -> list[RegistryEvent]:
        return self._load().events

    def champion(self) -> ModelVersion | None:
        doc = self._load()
        if doc.champion is None:
            return None
        return version_of(doc.versions, doc.champion, self.location)

    def _move(self, doc: RegistryDocument, action: Action, version: int, champion: int | None, by: str,
              reason: str) -> None:
        doc.events.append(RegistryEvent(action, version, doc.champion, champion, by, reason))
        doc.champion = champion
        self._save(doc)

    def record(self, candidate: ModelVersion, by: str) -> ModelVersion:
        doc = self._load()
        number = 1 + max((v.version for v in doc.versions), default=0)
        registered = replace(candidate, version=number, registered_at=utc_now())
        doc.versions.append(registered)
        champion = number if candidate.decision == "promoted" else doc.champion
        self._move(doc, candidate.decision, number, champion, by, candidate.reason)
        return registered

    def set_champion(self, version: int, action: Action, by: str, reason: str) -> None:
        doc = self._load()
        version_of(doc.versions, version, self.location)
        self._move(doc, action, version, version, by, reason)

    def lock(self, on_wait: Callable[[str], None] = status_line) -> AbstractContextManager[None]:
        local = self._folder.uri if self._folder.is_local else None
        return lock.exclusive(lock.lock_path(self.location, local), self.location, on_wait)
