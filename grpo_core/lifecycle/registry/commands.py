"""`grpo registry show | promote | rollback`: the registry for a person (the gate writes it on its own), and where
`grpo serve --model champion` finds the champion."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from contextlib import ExitStack
from typing import Any

from grpo_core.config import RegistryConfig
from grpo_core.lifecycle.registry import ModelRegistry, RegistryError, RegistryUnavailable, open_registry
from grpo_core.lifecycle.registry.records import one_line, status_line


def add_location_arguments(p: argparse.ArgumentParser) -> None:
    """Which registry: the one the runs under --root use (defaults as registry.* in a run's config)."""
    d = RegistryConfig()
    p.add_argument("--root", default="runs", help="storage root of the runs (default registry: ROOT/registry)")
    p.add_argument("--kind", choices=["mlflow", "folder"], default=d.kind, help="registry.kind")
    p.add_argument("--uri", default=None, help="registry.uri (an MLflow tracking URI or a folder)")
    p.add_argument("--name", default=d.name, help="registry.name: the registered model")
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (a folder registry on S3)")


def _storage_options(args: argparse.Namespace) -> dict | None:
    if not args.storage_options:
        return None
    try:
        options = json.loads(args.storage_options)
    except ValueError as err:
        raise RegistryError(f"--storage-options: not JSON ({err})") from None
    if not isinstance(options, dict):
        raise RegistryError(f"--storage-options: a JSON object of fsspec options, not {args.storage_options!r}")
    return options


def registry_of(args: argparse.Namespace) -> ModelRegistry:
    settings = RegistryConfig(kind=args.kind, uri=args.uri, name=args.name)
    return open_registry(settings, args.root, _storage_options(args))


def champion_policy(stack: ExitStack, args: argparse.Namespace) -> tuple[str, str]:
    """(a local HF folder of the champion's policy, where it came from): for `grpo serve --model champion`.
    RegistryError when there is no champion or its policy cannot be loaded (its run folder gone, say)."""
    from grpo_core.lifecycle.offline_eval import EvalError, resolve_policy

    registry = registry_of(args)
    champion = registry.champion()
    if champion is None:
        raise RegistryError(f"{registry.location} has no champion yet (a gated run promotes one; or `grpo registry "
                            f"promote VERSION`)")
    try:
        policy = resolve_policy(stack, run=champion.run, root=champion.root, storage_options=_storage_options(args))
    except (EvalError, OSError) as err:
        raise RegistryError(f"{registry.location}: the champion, version {champion.version} (run {champion.run} under "
                            f"{champion.root}), cannot be served: {one_line(err)} (promote or roll back to a version "
                            "whose run is there: `grpo registry rollback`)") from err
    return policy.folder, f"the champion, version {champion.version} (run {champion.run}, {policy.described})"


def _config_digest(config: Any) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def show(args: argparse.Namespace) -> dict[str, Any]:
    from grpo_core.lifecycle.lineage import walk

    registry = registry_of(args)
    versions = registry.versions()
    if args.lineage is not None:
        by_number = {v.version: v for v in versions}
        if args.lineage not in by_number:
            raise RegistryError(f"{registry.location} has no version {args.lineage} "
                                f"(versions: {', '.join(map(str, by_number)) or 'none'})")
        chain = walk(versions, args.lineage)
        for link in chain:
            if "version" in link:
                config = by_number[link["version"]].lineage.get("config")
                link["config_sha256"] = _config_digest(config)
                if args.with_config:
                    link["config"] = config
        return {"registry": registry.location, "version": args.lineage, "lineage": chain}
    champion = registry.champion()
    return {"registry": registry.location, "champion": champion.summary() if champion else None,
            "versions": [v.summary() for v in versions], "events": [e.to_json() for e in registry.events()]}


def _move(args: argparse.Namespace, action: str) -> dict[str, Any]:
    from grpo_core.lifecycle.promotion import user

    registry = registry_of(args)
    with registry.lock(on_wait=status_line):  # stdout is the command's JSON
        current = registry.champion()
        if action == "promote":
            target = args.version
        elif args.to is not None:
            target = args.to
        else:  # the champion before the current one, as the events record it
            if current is None:
                raise RegistryError(f"{registry.location} has no champion to roll back")
            moves = [e for e in registry.events() if e.champion_after == current.version
                     and e.champion_before not in (None, current.version)]
            if not moves:
                raise RegistryError(f"{registry.location}: version {current.version} has no earlier champion to "
                                    "roll back to (give --to VERSION)")
            target = moves[-1].champion_before
        registry.set_champion(target, action, by=f"person ({user()})", reason=args.reason)
        after = registry.champion()
    return {"registry": registry.location, "action": action, "champion_before": current.version if current else None,
            "champion": after.summary() if after else None}


def _run(fn, args: argparse.Namespace) -> int:
    try:
        out = fn(args)
    except (RegistryError, RegistryUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


def add_registry_commands(sub: Any) -> None:
    p = sub.add_parser("registry", help="the model registry: the champion, every gated version, lineage; promote or "
                                        "roll back by hand")
    rsub = p.add_subparsers(dest="registry_command", required=True)
    s = rsub.add_parser("show", help="the champion, the versions (run, metrics, decision, time) and the events, as "
                                     "JSON; --lineage VERSION walks its parents back to the first model")
    add_location_arguments(s)
    s.add_argument("--lineage", type=int, default=None, metavar="VERSION", help="the chain of models behind VERSION")
    s.add_argument("--with-config", action="store_true", help="with --lineage: each version's resolved config")
    s.set_defaults(func=lambda a: _run(show, a))
    s = rsub.add_parser("promote", help="make VERSION the champion (recorded as a person's promotion)")
    add_location_arguments(s)
    s.add_argument("version", type=int)
    s.add_argument("--reason", required=True, help="why, for the registry's history")
    s.set_defaults(func=lambda a: _run(lambda x: _move(x, "promote"), a))
    s = rsub.add_parser("rollback", help="make the previous champion (or --to VERSION) the champion again")
    add_location_arguments(s)
    s.add_argument("--to", type=int, default=None, metavar="VERSION")
    s.add_argument("--reason", required=True, help="why, for the registry's history")
    s.set_defaults(func=lambda a: _run(lambda x: _move(x, "rollback"), a))
