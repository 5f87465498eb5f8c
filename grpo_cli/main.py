"""`grpo` entry point: ``grpo_core.cli``'s commands plus `grpo train`, which runs the grpo-train flow."""
from __future__ import annotations

import argparse
import sys

from grpo_core import cli as core_cli


def _cmd_train(args: argparse.Namespace) -> int:
    from grpo_core.config import RESUME_SAFE_FIELDS, check_model_folder, load_config, upgrade_stored_config
    from grpo_core.storage import RunStore

    if args.verbose:
        args.set = [*args.set, "logging.verbose=true"]
    cfg = load_config(args.config, args.set)  # fail fast, before Prefect and Ray start
    check_model_folder(cfg)
    store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
    if store.read_config() is not None:  # a resume: refuse a changed config before anything starts
        store.check_config(cfg.recorded(), may_change=RESUME_SAFE_FIELDS, upgrade=upgrade_stored_config)
    from flows.grpo_train import grpo_train

    # A templated run_name ({date}, {time}) is expanded once, here: the flow gets the name itself.
    result = grpo_train(config_path=args.config, overrides=[*args.set, f"run_name={cfg.run_name}"])
    return 0 if result else 1


def _add_flow_commands(sub) -> None:
    p = sub.add_parser("train", help="run the grpo-train flow locally (Prefect ephemeral API, local Ray)")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rollout.temperature=0.7 (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the libraries' log lines (vLLM, DeepSpeed, Ray) on the terminal too; without it they "
                        "go to logs/ in the run folder (sets logging.verbose)")
    p.set_defaults(func=_cmd_train)


def build_parser() -> argparse.ArgumentParser:
    return core_cli.build_parser(_add_flow_commands)


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
