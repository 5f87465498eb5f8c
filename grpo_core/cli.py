"""`grpo` command line: train, model, config, score, runs."""
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
    from grpo_core.config import RESUME_SAFE_FIELDS, load_config
    from grpo_core.storage import RunStore

    cfg = load_config(args.config, args.set)  # fail fast, before Prefect and Ray start
    store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
    if store.read_config() is not None:  # a resume: refuse a changed config before anything starts
        store.check_config(cfg.model_dump(mode="json"), may_change=RESUME_SAFE_FIELDS)
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


def _fmt_time(ts: float | None) -> str:
    import datetime

    return "-" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cmd_runs_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from grpo_core.runs import list_runs

    runs = list_runs(args.root, json.loads(args.storage_options) if args.storage_options else None)
    if not runs:
        print(f"no runs under {args.root}")
        return 0
    table = Table("run", "status", "iteration", "eval acc", "latest checkpoint", "attempt", "updated")
    for r in runs:
        done = "-" if r.iteration is None else f"{r.iteration + 1}/{r.iterations}"
        table.add_row(r.name, r.status, done, "-" if r.eval_accuracy is None else f"{r.eval_accuracy:.3f}",
                      r.latest_checkpoint or "-", "-" if r.attempt is None else str(r.attempt),
                      _fmt_time(r.updated_at))
    Console().print(table)
    return 0


def _cmd_scale(args: argparse.Namespace) -> int:
    from grpo_core.runs import request_samplers
    from grpo_core.storage import RunStore

    store = RunStore(args.root, args.run, json.loads(args.storage_options) if args.storage_options else None)
    cfg = store.read_config()
    if cfg is None:
        print(f"error: no run {args.run!r} under {args.root} (no config.json)", file=sys.stderr)
        return 2
    if cfg["cluster"]["placement"] != "split":
        print(f"error: run {args.run} uses cluster.placement={cfg['cluster']['placement']}; only split placement "
              "scales its samplers", file=sys.stderr)
        return 2
    request_samplers(store, args.samplers)
    print(f"asked run {args.run} for {args.samplers} sampler(s); the flow applies it before its next iteration")
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from grpo_core import checkpoint
    from grpo_core.report import metrics_table
    from grpo_core.runs import read_status, summarize
    from grpo_core.storage import RunStore

    store = RunStore(args.root, args.run, json.loads(args.storage_options) if args.storage_options else None)
    if store.read_config() is None:
        print(f"error: no run {args.run!r} under {args.root} (no config.json)", file=sys.stderr)
        return 2
    s = summarize(store)
    status = read_status(store)
    console = Console()
    console.print(f"[bold]{s.name}[/bold]  {store.uri}")
    console.print(f"status: {s.status} (attempt {s.attempt}, updated {_fmt_time(s.updated_at)})"
                  + (f"; error: {s.error}" if s.error else ""))
    done = "none" if s.iteration is None else f"{s.iteration + 1} of {s.iterations}"
    console.print(f"iterations done: {done}; last eval accuracy: "
                  + ("-" if s.eval_accuracy is None else f"{s.eval_accuracy:.3f}"))
    refs = checkpoint.complete_checkpoints(store)
    console.print("checkpoints: " + (", ".join(f"{r.name} (policy version {r.policy_version})" for r in refs)
                                     if refs else "none"))
    if s.latest_checkpoint:
        console.print(f"resume: grpo train with run_name={s.name} continues from {s.latest_checkpoint}")
    if status is not None and status.actors:
        console.print("actors: " + "; ".join(f"{a.get('role')} pid {a.get('pid')} on {a.get('host')}"
                                            for a in status.actors))
    metrics = store.read_metrics()
    if metrics.num_rows:
        cols = [c for c in ("iteration", "reward_mean", "eval_accuracy", "loss", "policy_version", "run_attempt",
                            "time_total_s") if c in metrics.column_names]
        console.print(metrics_table(metrics, cols, last=args.last))
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

    p = sub.add_parser("runs", help="the runs under a storage root: status, progress, checkpoints")
    rsub = p.add_subparsers(dest="runs_command", required=True)
    for name, help_text, func in (("list", "one line per run", _cmd_runs_list),
                                  ("show", "one run in detail", _cmd_runs_show)):
        r = rsub.add_parser(name, help=help_text)
        if name == "show":
            r.add_argument("run", help="run name (its folder under --root)")
            r.add_argument("--last", type=int, default=10, help="metrics rows to show")
        r.add_argument("--root", default="runs", help="storage root (a folder or s3://bucket/prefix)")
        r.add_argument("--storage-options", default=None, help="fsspec options as JSON (S3 endpoint, keys)")
        r.set_defaults(func=func)

    p = sub.add_parser("scale", help="change the number of sampler actors of a running flow (split placement)")
    p.add_argument("run", help="run name (its folder under --root)")
    p.add_argument("--samplers", type=int, required=True, help="sampler actors from the next iteration on")
    p.add_argument("--root", default="runs", help="storage root (a folder or s3://bucket/prefix)")
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (S3 endpoint, keys)")
    p.set_defaults(func=_cmd_scale)

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
    from grpo_core.storage import ConfigConflict

    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError, ConfigConflict) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
