"""A run's config from YAML and ``--set`` overrides (or a dict), run-name templates filled, the preset applied; and a
stored config read by the current schema (resume)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from grpo_core.config.run import GRPOConfig
from grpo_core.config.run_names import run_name_problem
from grpo_core.config.section import ConfigError

if TYPE_CHECKING:
    from datetime import datetime


# A run name may be a template: {date} and {time} (UTC) of the run's start -- for a scheduled flow run, its
# scheduled start, which stays the same when Prefect retries it, so a retry resumes the same run folder.
def expand_run_name(template: str, now: "datetime") -> str:
    """``"nightly-{date}"`` -> ``"nightly-20261123"``; a name without braces is returned as it is."""
    if "{" not in template:
        return template
    try:
        name = template.format(date=now.strftime("%Y%m%d"), time=now.strftime("%H%M%S"))
    except (KeyError, IndexError, ValueError, AttributeError) as err:
        raise ConfigError(f"run_name={template!r}: a template may use {{date}} and {{time}} only ({err!r})") from None
    problem = run_name_problem(name)
    if problem is not None:
        raise ConfigError(f"run_name={template!r} gives {name!r} once {{date}} and {{time}} are filled: {problem}")
    return name


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        node = node.setdefault(k, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {k!r} is not a section")
    node[keys[-1]] = value


# Fields whose value is always text: an override's value is taken as typed unless YAML reads it as a string (a
# run-name template such as ``{date}`` or ``{date}-x`` would otherwise read as a YAML mapping, or not parse).
TEXT_OVERRIDES = ("run_name",)


def _override_value(key: str, raw: str) -> Any:
    """The value of ``--set key=raw``: a YAML scalar or list, or the text itself for a text field."""
    if not raw.strip():
        return ""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        if key in TEXT_OVERRIDES:
            return raw
        raise ConfigError(f"--set {key}={raw}: the value is not valid YAML ({str(err).splitlines()[0]}); quote "
                          "it") from None
    return raw if key in TEXT_OVERRIDES and not isinstance(value, str) else value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`["rollout.temperature=0.7", ...]` -> nested dict; values parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        key, raw = pair.split("=", 1)
        _set_dotted(tree, key.strip(), _override_value(key.strip(), raw))
    return tree


def merge_trees(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_trees(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_preset(tree: dict[str, Any]) -> dict[str, Any]:
    """Fill algorithm (and related) defaults from `algo.preset`; explicit values in `tree` win."""
    from grpo_core.algo.presets import PRESETS

    name = (tree.get("algo") or {}).get("preset", "grpo")
    if name not in PRESETS:
        raise ConfigError(f"algo.preset={name!r} is unknown; choose one of {sorted(PRESETS)}")
    return merge_trees(PRESETS[name], tree)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}" + (f" (got {e['input']!r})" if "input" in e and loc != "(top level)"
                                               and not isinstance(e["input"], dict) else ""))
    return "\n".join(lines)


def build_config(tree: dict[str, Any], source: str = "<dict>", now: "datetime | None" = None) -> GRPOConfig:
    """Validate a config tree; a templated ``run_name`` is expanded with ``now`` (default: the current UTC time)."""
    if isinstance(tree.get("run_name"), str) and "{" in tree["run_name"]:
        from datetime import datetime, timezone

        tree = {**tree, "run_name": expand_run_name(tree["run_name"], now or datetime.now(timezone.utc))}
    try:
        return GRPOConfig.model_validate(apply_preset(tree))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


# What `grpo config --preset NAME` resolves when no file is given: the required paths are placeholders.
PLACEHOLDER_TREE: dict[str, Any] = {"model": {"path": "<model>"}, "data": {"train_path": "<train.jsonl>"}}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                preset: str | None = None, now: "datetime | None" = None) -> GRPOConfig:
    """Read a YAML config (None: placeholders for the required paths), apply `--set key=value` overrides and the
    preset, validate."""
    tree: dict[str, Any] = dict(PLACEHOLDER_TREE) if path is None else {}
    source = "<preset>" if path is None else str(path)
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        try:
            tree = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    if preset is not None:
        tree = merge_trees(tree, {"algo": {"preset": preset}})
    if overrides:
        tree = merge_trees(tree, parse_overrides(overrides))
        source += " with --set " + " ".join(overrides)
    return build_config(tree, source, now)


# The built-in models by the folder name the configs use, and how to get each: the tiny ones ship as files in


def upgrade_stored_config(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's config.json as the current schema reads it: fields added since it was written take their defaults
    (so a newer version of the code resumes an older run instead of calling each new field a change). A stored
    config the current schema refuses is returned as it is, and the comparison names what differs."""
    algo = stored.get("algo")
    if isinstance(algo, dict) and "offpolicy_band" not in algo and algo.get("tis_cap") is None:
        # before the off-policy kinds, algo.offpolicy only chose the mode of a correction that tis_cap turned on
        stored = {**stored, "algo": {**algo, "offpolicy": "none"}}
    try:
        return build_config(stored, "config.json").recorded()
    except ConfigError:
        return stored
