"""MLflow's model registry: each gated policy a model version of one registered model, the champion its
``champion`` alias, the decision and lineage in the version's tags, the champion's history in the registered model's
tags (MLflow keeps no history of an alias).

A SQLite store under ``storage.root`` by default (``registry/mlflow.db``; ``mlflow ui --backend-store-uri
sqlite:///...`` shows it), or a tracking server (``registry.uri: http://host:5000``). Over HTTP, MLflow's own
request timeout and retries are set from ``registry.timeout_s`` (``MLFLOW_HTTP_REQUEST_TIMEOUT``,
``MLFLOW_HTTP_REQUEST_MAX_RETRIES``) unless the environment sets them, so that a server that is down makes the
registry unavailable in seconds, not after MLflow's default minutes of back-off.

A version is written in three steps (the version, tagged ``pending``; the alias; the tag ``recorded``); a version
whose third step never happened is not listed, and a failed step deletes the version when the store still answers.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace

from grpo_core.registry import lock
from grpo_core.registry.records import (Action, ModelVersion, RegistryEvent, RegistryUnavailable, utc_now,
                                        version_of)

CHAMPION = "champion"
RECORD, STATE, EVENT = "grpo.record", "grpo.state", "grpo.event."
PENDING, RECORDED = "pending", "recorded"


def _store_errors() -> tuple[type[BaseException], ...]:
    """What the store raises when it cannot be reached or written (all of them: unavailable)."""
    import requests
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    return MlflowException, requests.exceptions.RequestException, sqlalchemy.exc.SQLAlchemyError, OSError


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
        self._local = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None
        if self._local is not None:
            os.makedirs(os.path.dirname(os.path.abspath(self._local)), exist_ok=True)
        self.uri, self.name = uri, name
        self.location = f"MLflow registry {uri} (model {name})"
        self._client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        self._errors = _store_errors()

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except self._errors as err:
            raise RegistryUnavailable(f"{self.location}: {what} failed: {type(err).__name__}: {err}") from err

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

    @staticmethod
    def _parsed(mv) -> ModelVersion | None:
        """Our record of an MLflow model version; None for one written half by a gate that lost the store."""
        if mv.tags.get(STATE) != RECORDED:
            return None
        return ModelVersion.from_json({**json.loads(mv.tags[RECORD]), "version": int(mv.version)})

    def _versions(self) -> list[ModelVersion]:
        parsed = (self._parsed(mv) for mv in self._client.search_model_versions(f"name='{self.name}'"))
        return sorted((v for v in parsed if v is not None), key=lambda v: v.version)

    def versions(self) -> list[ModelVersion]:
        return self._call("listing versions", self._versions)

    def events(self) -> list[RegistryEvent]:
        model = self._call("reading the model", self._model)
        keys = sorted(k for k in model.tags if k.startswith(EVENT))
        return [RegistryEvent.from_json(json.loads(model.tags[k])) for k in keys]

    def _champion_number(self, model) -> int | None:
        number = model.aliases.get(CHAMPION) if isinstance(model.aliases, dict) else None
        return int(number) if number is not None else None

    def champion(self) -> ModelVersion | None:
        model = self._call("reading the model", self._model)
        number = self._champion_number(model)
        if number is None:
            return None
        return self._parsed(self._call("reading the champion", self._client.get_model_version, self.name,
                                       str(number)))

    def _add_event(self, model, event: RegistryEvent) -> None:
        index = 1 + sum(1 for k in model.tags if k.startswith(EVENT))
        self._client.set_registered_model_tag(self.name, f"{EVENT}{index:06d}", json.dumps(event.to_json()))

    def record(self, candidate: ModelVersion, by: str) -> ModelVersion:
        model = self._call("reading the model", self._model)
        before = self._champion_number(model)
        registered_at = utc_now()
        doc = {k: v for k, v in replace(candidate, registered_at=registered_at).to_json().items() if k != "version"}
        mv = self._call("registering the version", self._client.create_model_version, self.name,
                        source=candidate.policy, tags={RECORD: json.dumps(doc), STATE: PENDING},
                        description=candidate.reason)
        number = int(mv.version)
        after = number if candidate.decision == "promoted" else before
        try:
            if after != before:
                self._client.set_registered_model_alias(self.name, CHAMPION, number)
            self._add_event(model, RegistryEvent(candidate.decision, number, before, after, by, candidate.reason))
            self._client.set_model_version_tag(self.name, str(number), STATE, RECORDED)
        except self._errors as err:
            self._undo(number, before, after)
            raise RegistryUnavailable(f"{self.location}: recording version {number} failed (undone where the store "
                                      f"still answered): {type(err).__name__}: {err}") from err
        return replace(candidate, version=number, registered_at=registered_at)

    def _undo(self, number: int, before: int | None, after: int | None) -> None:
        try:
            if after != before:
                if before is None:
                    self._client.delete_registered_model_alias(self.name, CHAMPION)
                else:
                    self._client.set_registered_model_alias(self.name, CHAMPION, before)
            self._client.delete_model_version(self.name, str(number))
        except self._errors:
            pass  # the store is gone: the version stays "pending", which no reader lists

    def set_champion(self, version: int, action: Action, by: str, reason: str) -> None:
        model = self._call("reading the model", self._model)
        version_of(self.versions(), version, self.location)
        before = self._champion_number(model)
        self._call("moving the champion alias", self._client.set_registered_model_alias, self.name, CHAMPION,
                   version)
        self._call("recording the event", self._add_event, model,
                   RegistryEvent(action, version, before, version, by, reason))

    def lock(self, on_wait: Callable[[str], None] = print) -> AbstractContextManager[None]:
        local = os.path.dirname(os.path.abspath(self._local)) if self._local is not None else None
        return lock.exclusive(lock.lock_path(self.location, local), self.location, on_wait)

