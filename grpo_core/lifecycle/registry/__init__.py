"""The model registry: the champion policy, every version a gate registered (promoted or refused) with its lineage,
and who moved the champion when. One interface (`ModelRegistry`), two kinds: MLflow's model registry (default) and a
folder holding one JSON document; `open_registry` is the one place that chooses."""
from __future__ import annotations

import os
import posixpath

from grpo_core.config import REGISTRY_FOLDER, RegistryConfig
from grpo_core.lifecycle.registry.records import (ModelRegistry, ModelVersion, RegistryCorrupt, RegistryError, RegistryEvent,
                                        RegistryUnavailable, version_of)

__all__ = ["ModelRegistry", "ModelVersion", "RegistryCorrupt", "RegistryError", "RegistryEvent", "RegistryUnavailable",
           "open_registry", "registry_uri", "version_of"]

MLFLOW_DB = "mlflow.db"


def registry_uri(settings: RegistryConfig, root: str) -> str:
    """Where the registry of ``settings`` lives for runs under ``root``: registry.uri, else ``root/registry``
    (MLflow: the SQLite file ``root/registry/mlflow.db``)."""
    if settings.uri is not None:
        return settings.uri
    folder = posixpath.join(root.rstrip("/"), REGISTRY_FOLDER)
    if settings.kind == "mlflow":
        local = folder.removeprefix("file://")
        return f"sqlite:///{os.path.abspath(os.path.join(local, MLFLOW_DB))}"
    return folder


def open_registry(settings: RegistryConfig, root: str, storage_options: dict | None = None) -> ModelRegistry:
    """The registry ``settings`` name (RegistryUnavailable: it cannot be opened; RegistryCorrupt: what is there is
    not a registry, which is never taken for an empty one)."""
    uri = registry_uri(settings, root)
    if settings.kind == "mlflow":
        from grpo_core.lifecycle.registry.mlflow_registry import MLflowRegistry

        return MLflowRegistry(uri, settings.name, settings.timeout_s)
    from grpo_core.lifecycle.registry.folder import FolderRegistry

    return FolderRegistry(uri, settings.name, storage_options)
