"""The run's ``config.json``: written once, compared on every resume.

Why: a resumed run must train on the config it was started with. A different value is an error that names each
field with its stored and new value, except for the fields the caller declares safe to change (those are written
and reported), and an older run's config is first brought to the current schema so newer code can resume it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from grpo_core.run.storage.errors import ConfigConflict
from grpo_core.run.storage.files import RunFolder, _json_bytes

CONFIG = "config.json"


def _lookup_dotted(tree: Any, dotted: str) -> str:
    node = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return "(absent)"
        node = node[key]
    return json.dumps(node)


def _dict_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like values."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                keys.append(path)
            else:
                keys.extend(_dict_diff(old[k], new[k], path))
        return keys
    return [] if old == new else [prefix or "<root>"]


class RunConfigFile(RunFolder):
    """The config a run was started with, and the check that a resume keeps it."""

    def read_config(self) -> dict | None:
        return self.get_json_file(CONFIG)

    def check_config(self, config: dict, may_change: Iterable[str] = (),
                     upgrade: Callable[[dict], dict] | None = None) -> list[str]:
        """Compare ``config`` with config.json (see ``write_config``) without writing anything: returns the
        allowed changes as ``["key: old -> new", ...]``, raises ConfigConflict for any other difference.
        ``upgrade`` brings the stored config to the current schema first (fields added since it was written, at
        their defaults), so that a newer version of the code can resume an older run."""
        path = self._path(CONFIG)
        normalized = json.loads(_json_bytes(config, self._url(path)))
        existing = self.read_config()
        if existing is None:
            return []
        if upgrade is not None:
            existing = upgrade(existing)
        allowed = tuple(may_change)

        def covered(key: str) -> bool:
            return any(key == a or key.startswith(a + ".") for a in allowed)

        def describe(key: str) -> str:
            return f"{key}: {_lookup_dotted(existing, key)} -> {_lookup_dotted(normalized, key)}"

        differing = _dict_diff(existing, normalized)
        conflicts = [describe(k) for k in differing if not covered(k)]
        if conflicts:
            raise ConfigConflict(
                f"{self._url(path)} holds the config this run was started with, and these fields differ: "
                + "; ".join(conflicts) + ". Start a new run (another run_name) to change them."
            )
        return [describe(k) for k in differing]

    def write_config(self, config: dict, may_change: Iterable[str] = (),
                     upgrade: Callable[[dict], dict] | None = None) -> list[str]:
        """Write config.json. On an existing run the same config is a no-op; differences only in fields listed in
        ``may_change`` (dotted keys; a section name covers the section) are written and returned as
        ``["key: old -> new", ...]``; any other difference raises ConfigConflict naming each field with its
        stored and new value."""
        path = self._path(CONFIG)
        data = _json_bytes(config, self._url(path))
        if self.read_config() is None:
            self._write_atomic(path, data)
            return []
        changes = self.check_config(config, may_change, upgrade)
        if changes:
            self._write_atomic(path, data)
        return changes
