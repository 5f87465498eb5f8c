"""MLflow's model registry: each gated policy a model version of one registered model, its decision and lineage in
the version's tags, and the registry's history, one event per change, in the registered model's tags (MLflow keeps
no history of an alias); the ``champion`` alias follows the history.

A SQLite store under ``storage.root`` by default (``registry/mlflow.db``; ``mlflow ui --backend-store-uri
sqlite:///...`` shows it), or a tracking server (``registry.uri: http://host:5000``). Over HTTP, MLflow's own
request timeout and retries are set from ``registry.timeout_s`` (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``) unless the environment sets them, so that a server that is down makes the
registry unavailable in seconds, not after MLflow's default minutes of back-off.

All or nothing, with one write as the commit point. MLflow has no transaction over several calls, so a change is
written in an order where exactly one write, the event tag (``grpo.event.NNNNNN`` on the registered model), commits
it: that one row says which version the change is about and the champion before and after it. The history is the
registry's truth: a version is listed once an event registers it (``promoted``/``refused``), the champion is the
``champion_after`` of the last event. So a record is (1) the version, with its record in its tags (``grpo.state``
``pending``: not listed, as nothing registers it yet); (2) its event: the commit point; (3) the alias moved and the
version tagged ``recorded``, both mirrors of the history for MLflow's own readers (its UI, ``models:/NAME@champion``).
A person's promotion or rollback is (1) its event, the commit point, (2) the alias. A fault at any step, the store
still answering, is undone in the reverse order (the event deleted first, which un-commits the change, then the alias
set back, then the version deleted) and the call raises `RegistryUnavailable`, the registry as it was. A store that
stops answering midway leaves the change committed whole (its event landed) or not at all, plus at most writes no
reader takes for the registry (a pending version, an alias ahead of or behind the history); the error says which it
may be, and the next change puts the alias back in line with the history before it writes.

A SQLite file that is not an MLflow registry (empty, corrupt, another database) is `RegistryCorrupt` naming it: only
an absent file is a new registry. A tag of ours that does not parse is `RegistryCorrupt` naming the tag.
"""
from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from grpo_core.lifecycle.registry import lock
from grpo_core.lifecycle.registry.records import (Action, ModelVersion, RegistryCorrupt, RegistryEvent, RegistryUnavailable,
                                        one_line, status_line, utc_now, version_of)

CHAMPION = "champion"
RECORD, STATE, EVENT = "grpo.record", "grpo.state", "grpo.event."
PENDING, RECORDED = "pending", "recorded"
REGISTERS = ("promoted", "refused")  # the events that register a version (a gate's); a person's move one
# MLflow's model-registry tables: a SQLite file without them is not a registry (an emptied mlflow.db has none).
REGISTRY_TABLES = ("registered_models", "model_versions", "registered_model_tags", "model_version_tags",
                   "registered_model_aliases")


def _store_errors() -> tuple[type[BaseException], ...]:
    """What the store raises when it cannot be reached or written (all of them: unavailable)."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    return MlflowException, requests.exceptions.RequestException, sqlalchemy.exc.SQLAlchemyError, OSError


def check_sqlite_store(path: str, location: str) -> None:
    """An existing ``path`` must be an MLflow registry: MLflow would take an emptied or foreign SQLite file for a
    new database and make an empty registry of it, and a gate would then promote anything. Absent: a new one."""
    if not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise RegistryCorrupt(f"{location}: {path} is not a file")
    if os.path.getsize(path) == 0:
        raise RegistryCorrupt(f"{location}: {path} is empty (0 bytes), not an MLflow registry: restore it, or remove "
                              "it to start a new registry")
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as err:
        raise RegistryCorrupt(f"{location}: {path} is not an MLflow registry ({one_line(err)}): restore it, or "
                              "remove it to start a new registry") from None
    missing = [t for t in REGISTRY_TABLES if t not in tables]
    if missing:
        raise RegistryCorrupt(f"{location}: {path} is a SQLite file but not an MLflow registry (no table "
                              f"{', '.join(missing)}): restore it, or remove it to start a new registry")


@dataclass(frozen=True)
class History:
    """The registered model's events (the registry's truth), in order, and the keys they are stored under."""

    events: list[RegistryEvent]
    indices: list[int]    # each event's number in its tag key
    alias: int | None     # where MLflow's champion alias points now (a mirror: behind or ahead after a lost store)

    @property
    def champion(self) -> int | None:
        return self.events[-1].champion_after if self.events else None

    @property
    def registered(self) -> set[int]:
        return {e.version for e in self.events if e.action in REGISTERS}

    @property
    def next_key(self) -> str:
        return f"{EVENT}{1 + max(self.indices, default=0):06d}"


class MLflowRegistry:
    def __init__(self, uri: str, name: str, timeout_s: float):
        try:
            from mlflow import MlflowClient
        except ModuleNotFoundError as err:
            raise RegistryUnavailable("registry.kind=mlflow needs mlflow (mlflow-skinny is in the lock): "
                                      "`pip install mlflow-skinny`, or registry.kind=folder") from err
        if uri.startswith(("http://", "https://")):
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(max(1, timeout_s))))
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        self.uri, self.name = uri, name
        self.location = f"MLflow registry {uri} (model {name})"
        self._local = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None
        if self._local is not None:
            check_sqlite_store(self._local, self.location)
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self._local)), exist_ok=True)
            except OSError as err:
                raise RegistryUnavailable(f"{self.location}: cannot make its folder: {one_line(err)}") from err
        self._client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        self._errors = _store_errors()

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._errors as err:
            raise RegistryUnavailable(f"{self.location}: {what} failed: {one_line(err)}") from err

    def _corrupt(self, where: str, err: Exception) -> RegistryCorrupt:
        return RegistryCorrupt(f"{self.location}: {where} is not ours to read: {err} (repair or delete it in MLflow)")

    def _model(self):
        """The registered model, created on first use."""
        from mlflow.exceptions import MlflowException

        try:
            return self._client.get_registered_model(self.name)
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        return self._client.create_registered_model(
            self.name, description="policies trained by grpo-flow; the champion alias is the one to serve")

    def _history(self) -> History:
        model = self._call("reading the model", self._model)
        tagged = []
        for key, value in model.tags.items():
            if not key.startswith(EVENT):
                continue
            try:
                index = int(key[len(EVENT):])
                tagged.append((index, RegistryEvent.from_json(json.loads(value))))
            except ValueError as err:  # json.JSONDecodeError is one
                raise self._corrupt(f"the registered model's tag {key}", err) from None
        tagged.sort(key=lambda pair: pair[0])
        aliases = model.aliases if isinstance(model.aliases, dict) else {}
        alias = aliases.get(CHAMPION)
        return History([e for _, e in tagged], [i for i, _ in tagged], int(alias) if alias is not None else None)

    def _parsed(self, mv) -> ModelVersion:
        where = f"version {mv.version}'s tag {RECORD}"
        if RECORD not in mv.tags:
            raise self._corrupt(where, ValueError("it is missing"))
        try:
            return ModelVersion.from_json({**json.loads(mv.tags[RECORD]), "version": int(mv.version)})
        except ValueError as err:
            raise self._corrupt(where, err) from None

    def _versions(self, history: History) -> list[ModelVersion]:
        """The versions the history registers; any other (a record never committed) is not the registry's."""
        stored = self._call("listing versions", self._client.search_model_versions, f"name='{self.name}'")
        by_number = {int(mv.version): mv for mv in stored}
        lost = [(i, e.version) for i, e in zip(history.indices, history.events)
                if e.action in REGISTERS and e.version not in by_number]
        if lost:
            tags = ", ".join(f"{EVENT}{i:06d} (version {v})" for i, v in lost)
            raise RegistryCorrupt(f"{self.location}: the registered model's tag(s) {tags} register a version the "
                                  "store does not hold (deleted in MLflow?): restore it, or delete the tag")
        return [self._parsed(by_number[n]) for n in sorted(history.registered)]

    def versions(self) -> list[ModelVersion]:
        return self._versions(self._history())

    def events(self) -> list[RegistryEvent]:
        return self._history().events

    def champion(self) -> ModelVersion | None:
        number = self._history().champion
        if number is None:
            return None
        return self._parsed(self._call(f"reading the champion, version {number}", self._client.get_model_version,
                                       self.name, str(number)))

    def _point_alias(self, number: int | None) -> None:
        if number is None:
            self._client.delete_registered_model_alias(self.name, CHAMPION)
        else:
            self._client.set_registered_model_alias(self.name, CHAMPION, str(number))

    def _align_alias(self, history: History) -> None:
        """The alias back in line with the history, where a store lost midway left it ahead or behind."""
        if history.alias != history.champion:
            self._call("putting the champion alias back in line with the history", self._point_alias,
                       history.champion)

    def record(self, candidate: ModelVersion, by: str) -> ModelVersion:
        history = self._history()
        self._align_alias(history)
        before = history.champion
        registered_at = utc_now()
        doc = {k: v for k, v in replace(candidate, registered_at=registered_at).to_json().items() if k != "version"}
        mv = self._call("registering the version", self._client.create_model_version, self.name,
                        source=candidate.policy, tags={RECORD: json.dumps(doc), STATE: PENDING},
                        description=candidate.reason)
        number = int(mv.version)
        after = number if candidate.decision == "promoted" else before
        event = RegistryEvent(candidate.decision, number, before, after, by, candidate.reason)
        key = history.next_key
        self._commit(key, event, before, created=number, mirrors=[
            lambda: self._point_alias(after) if after != before else None,
            lambda: self._client.set_model_version_tag(self.name, str(number), STATE, RECORDED)])
        return replace(candidate, version=number, registered_at=registered_at)

    def set_champion(self, version: int, action: Action, by: str, reason: str) -> None:
        history = self._history()
        version_of(self._versions(history), version, self.location)
        self._align_alias(history)
        before = history.champion
        self._commit(history.next_key, RegistryEvent(action, version, before, version, by, reason), before,
                     created=None, mirrors=[lambda: self._point_alias(version) if version != before else None])

    def _commit(self, key: str, event: RegistryEvent, before: int | None, created: int | None,
                mirrors: list[Callable[[], None]]) -> None:
        """Write ``event`` under ``key`` (the commit point), then the ``mirrors``; on a fault, undo (`_undo`)."""
        step = "committing its event"
        try:
            self._client.set_registered_model_tag(self.name, key, json.dumps(event.to_json()))
            step = "updating the champion alias and the version's state after its event"
            for mirror in mirrors:
                mirror()
        except self._errors as err:
            what = f"version {event.version}'s {event.action}"
            raise RegistryUnavailable(f"{self.location}: {what}: {step} failed ({one_line(err)}); "
                                      f"{self._undo(key, before, created)}") from err

    def _undo(self, key: str, before: int | None, created: int | None) -> str:
        """Undo a change whose commit or mirrors failed, un-committing it first; what became of it, in words."""
        try:
            self._client.delete_registered_model_tag(self.name, key)
        except self._errors as err:
            return (f"the store stopped answering before the change could be undone ({one_line(err)}): it may have "
                    "been committed; `grpo registry show` says which")
        try:
            self._point_alias(before)
            if created is not None:
                self._client.delete_model_version(self.name, str(created))
        except self._errors as err:  # un-committed already: what is left is no reader's registry
            return (f"undone: the registry is as it was (left behind, read by no one: a pending version or the alias "
                    f"ahead, which the next change puts back in line; {one_line(err)})")
        return "undone: the registry is as it was"

    def lock(self, on_wait: Callable[[str], None] = status_line) -> AbstractContextManager[None]:
        local = os.path.dirname(os.path.abspath(self._local)) if self._local is not None else None
        return lock.exclusive(lock.lock_path(self.location, local), self.location, on_wait)
