"""User reward plugins: ``package.module:function`` or ``path/to/file.py:function``.

The function is called as ``function(completions, **columns)`` where ``completions`` is a list of strings and each
dataset column arrives as a keyword list of the same length (``gt_answer=[...]``, ``test_cases=[...]``); it returns a
list with one float (or None: "does not apply to this completion") per completion. A wrong count, a non-number, or
a raised exception is an error naming the plugin. Plugins run inside the scorer's worker processes.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

PluginFunction = Callable[..., Sequence[float | None]]


class PluginError(ValueError):
    """A plugin could not be loaded, or returned something other than one float/None per completion."""


def is_plugin_spec(spec: str) -> bool:
    """Whether a reward name is a plugin spec (``module:function`` / ``file.py:function``) rather than a builtin."""
    return ":" in spec


def plugin_name(spec: str) -> str:
    """The component name of a plugin given inline: its function name."""
    return spec.rsplit(":", 1)[1]


def load_plugin(spec: str) -> PluginFunction:
    """Import the function a spec names. Raises PluginError saying what is missing."""
    if not is_plugin_spec(spec):
        raise PluginError(f"plugin {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    target, function_name = spec.rsplit(":", 1)
    if not target or not function_name:
        raise PluginError(f"plugin {spec!r}: expected 'module:function' or 'path/to/file.py:function'")
    if target.endswith(".py"):
        module = _module_from_file(spec, target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise PluginError(f"plugin {spec!r}: cannot import module {target!r}: {error}") from error
    function = getattr(module, function_name, None)
    if function is None:
        raise PluginError(f"plugin {spec!r}: module {target!r} has no attribute {function_name!r}")
    if not callable(function):
        raise PluginError(f"plugin {spec!r}: {function_name!r} is not callable")
    return function


def _module_from_file(spec: str, path: str) -> Any:
    if not os.path.isfile(path):
        raise PluginError(f"plugin {spec!r}: file {path!r} does not exist")
    module_name = "grpo_reward_plugin_" + os.path.splitext(os.path.basename(path))[0]
    module_spec = importlib.util.spec_from_file_location(module_name, os.path.abspath(path))
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"plugin {spec!r}: cannot load {path!r} as a python module")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the user's module failed at import: report it as this plugin's fault
        raise PluginError(f"plugin {spec!r}: importing {path!r} failed: {type(error).__name__}: {error}") from error
    return module


def call_plugin(name: str, function: PluginFunction, completions: list[str],
                columns: dict[str, list[Any]]) -> list[float | None]:
    """Call a plugin and check its answer: one finite float or None per completion. Raises PluginError."""
    values = function(completions, **columns)
    try:
        values = list(values)
    except TypeError as error:
        raise PluginError(f"plugin {name!r} returned {type(values).__name__}, expected a list") from error
    if len(values) != len(completions):
        raise PluginError(f"plugin {name!r} returned {len(values)} values for {len(completions)} completions")
    checked: list[float | None] = []
    for index, value in enumerate(values):
        if value is None:
            checked.append(None)
            continue
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise PluginError(f"plugin {name!r} returned {value!r} (type {type(value).__name__}) at position {index}")
        number = float(value)
        if not math.isfinite(number):
            raise PluginError(f"plugin {name!r} returned a non-finite value {number} at position {index}")
        checked.append(number)
    return checked
