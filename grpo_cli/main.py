"""`grpo` entry point: ``grpo_cli.commands``'s commands plus `grpo train` and `grpo sft`, which run the grpo-train and
grpo-sft flows."""
from __future__ import annotations

import argparse
import sys

from grpo_cli import commands as core_cli


def _cmd_train(args: argparse.Namespace) -> int:
    """`grpo train`: the grpo-train flow (RL)."""
    return _run_flow_command(args, "grpo_train")


def _cmd_sft(args: argparse.Namespace) -> int:
    """`grpo sft`: the grpo-sft flow (supervised fine-tuning on conversations)."""
    return _run_flow_command(args, "grpo_sft")


def _run_flow_command(args: argparse.Namespace, flow_name: str) -> int:
    """Checks that need no engine first; then Prefect's API starts while the flows are imported (flows.prefect_api's
    EarlyApi), and ``flow_name`` of flows/grpo_train.py runs."""
    from flows.prefect_api import EarlyApi
    from grpo_core.lifecycle import lineage
    from grpo_core.config import RESUME_SAFE_FIELDS, check_model_folder, load_config, upgrade_stored_config
    from grpo_core.config import CHAMPION
    from grpo_core.run.storage import RunStore

    if args.verbose:
        args.set = [*args.set, "logging.verbose=true"]
    cfg = load_config(args.config, args.set)  # fail fast, before Prefect and Ray start
    check_model_folder(cfg)
    store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
    if store.read_config() is not None:  # a resume: refuse a changed config before anything starts
        store.check_config(cfg.recorded(), may_change=RESUME_SAFE_FIELDS, upgrade=upgrade_stored_config)
    elif cfg.model.init_from == CHAMPION:  # a new run reads the registry first: one line if it cannot be read
        lineage.resolve(CHAMPION, cfg.storage.root, cfg.storage.options, cfg.run_name, cfg.registry)
    api = EarlyApi().start()
    from flows import grpo_train as flows

    flow = getattr(flows, flow_name)
    api.wait()
    # A templated run_name ({date}, {time}) is expanded once, here: the flow gets the name itself.
    result = flow(config_path=args.config, overrides=[*args.set, f"run_name={cfg.run_name}"])
    return 0 if result else 1


def _cmd_sft_rl(args: argparse.Namespace) -> int:
    """`grpo sft-rl`: the grpo-sft-rl flow (SFT, then RL from its final policy, as two subflows)."""
    from grpo_core.config import check_model_folder, load_config

    for path, overrides in ((args.sft, args.set_sft), (args.rl, args.set_rl)):
        check_model_folder(load_config(path, overrides))  # fail fast, before Prefect and Ray start
    from flows.grpo_sft_rl import grpo_sft_rl

    result = grpo_sft_rl(sft_config_path=args.sft, rl_config_path=args.rl, sft_overrides=args.set_sft,
                         rl_overrides=args.set_rl)
    return 0 if result else 1


def _add_flow_commands(sub) -> None:
    for name, flow, what, command in (
            ("train", "grpo-train", "RL", _cmd_train),
            ("sft", "grpo-sft", "supervised fine-tuning on conversations: a config with sft set", _cmd_sft)):
        _add_flow_command(sub, name, flow, what, command)
    p = sub.add_parser("sft-rl", help="run the grpo-sft-rl flow locally: SFT, then RL from its final policy (two "
                                      "subflows of one flow run)")
    p.add_argument("--sft", required=True, help="the SFT stage's YAML config (sft set, data.format: chat)")
    p.add_argument("--rl", required=True, help="the RL stage's YAML config (its model.init_from becomes the SFT run)")
    for stage in ("sft", "rl"):
        p.add_argument(f"--set-{stage}", action="append", default=[], metavar="KEY=VALUE",
                       help=f"override a field of the {stage.upper()} config (repeatable)")
    p.set_defaults(func=_cmd_sft_rl)


def _add_flow_command(sub, name: str, flow: str, what: str, command) -> None:
    p = sub.add_parser(name, help=f"run the {flow} flow locally ({what}; Prefect ephemeral API, local Ray)")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rollout.temperature=0.7 (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show the libraries' log lines (vLLM, DeepSpeed, Ray) on the terminal too; without it they "
                        "go to logs/ in the run folder (sets logging.verbose)")
    p.set_defaults(func=command)


def build_parser() -> argparse.ArgumentParser:
    return core_cli.build_parser(_add_flow_commands)


def main(argv: list[str] | None = None) -> int:
    return core_cli.main(argv, parser=build_parser())


if __name__ == "__main__":
    sys.exit(main())
