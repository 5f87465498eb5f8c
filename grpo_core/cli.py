"""`grpo` command line: train, model, config, score."""
from __future__ import annotations

import argparse
import json
import os
import sys


def _offline_defaults() -> None:
    # Nothing is ever fetched from a model hub; caches default to the project's ignored .cache folder.
    cache = os.path.join(os.getcwd(), ".cache")
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch_extensions")),
                       ("VLLM_CACHE_ROOT", os.path.join(cache, "vllm")), ("RAY_USAGE_STATS_ENABLED", "0"),
                       ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("TOKENIZERS_PARALLELISM", "false"),
                       ("VLLM_HOST_IP", "127.0.0.1"),
                       # The ephemeral Prefect API migrates its database on first start: slow on 2 busy cores.
                       ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")):
        os.environ.setdefault(key, value)
    if os.environ.get("PREFECT_HOME"):  # Prefect does not create missing parents, then its database fails to open
        os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)


def _cmd_train(args: argparse.Namespace) -> int:
    from grpo_core.config import load_config

    load_config(args.config, args.set)  # fail fast, before Prefect and Ray start
    from flows.grpo_train import grpo_train

    result = grpo_train(config_path=args.config, overrides=args.set)
    return 0 if result else 1


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from grpo_core.model.tiny import build_tiny

    metrics = build_tiny(args.out, train_path=args.train, seed=args.seed)
    print(json.dumps(metrics, indent=2, default=str))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from grpo_core.config import load_config

    cfg = load_config(args.config, args.set, preset=args.preset)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grpo", description="GRPO/DAPO RL from verifiable rewards")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="run the grpo-train flow locally (Prefect ephemeral API, local Ray)")
    p.add_argument("--config", required=True, help="YAML config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set rollout.temperature=0.7 (repeatable)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("model", help="build models")
    msub = p.add_subparsers(dest="model_command", required=True)
    t = msub.add_parser("tiny", help="build the CPU demo policy: a small Qwen2 + local tokenizer + format warm-up")
    t.add_argument("--out", required=True)
    t.add_argument("--train", default="data/arith/train.jsonl")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_cmd_model_tiny)

    p = sub.add_parser("config", help="print a resolved config (a file, a preset, or both)")
    p.add_argument("--config", help="YAML config file")
    p.add_argument("--preset", choices=["grpo", "dapo", "dr_grpo", "gspo", "rloo"])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=_cmd_config)

    p = sub.add_parser("score", help="score a file of responses offline")
    from grpo_core.rewards.score_file import add_score_arguments, run_score

    add_score_arguments(p)
    p.set_defaults(func=run_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    _offline_defaults()
    args = build_parser().parse_args(argv)
    from grpo_core.config import ConfigError
    from grpo_core.data.readers import DataError

    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
