"""``grpo tinker serve``: the training service on one base model, until SIGINT or SIGTERM.

Where it listens and its key go to ``<root>/service.json`` (0600 from its first byte): ``{"url", "api_key",
"base_model", "pid"}``; a client sets ``TINKER_API_KEY`` to the key and passes the url as ``base_url``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from grpo_core.config import METRIC_BACKENDS  # already imported by the parser's other commands

SERVICE_FILE = "service.json"


def add_tinker_commands(sub: Any) -> None:
    p = sub.add_parser("tinker", help="the Tinker-compatible training service (the tinker SDK and tinker-cookbook "
                                      "recipes drive the project's engines)")
    tsub = p.add_subparsers(dest="tinker_command", required=True)
    s = tsub.add_parser("serve", help="serve one base model for training clients (LoRA or full) and sampling")
    s.add_argument("--model", required=True, help="the base model's HF folder (clients send this path, or its "
                                                  "folder name, as base_model)")
    s.add_argument("--root", required=True, help="the run folder: checkpoints, sampler weights, request records")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8900, help="0: any free port (see <root>/service.json)")
    s.add_argument("--api-key", default=None, help="the key clients send (X-API-Key; must start with 'tml-'). "
                                                   "Default: $GRPO_TINKER_API_KEY, else a new random key")
    s.add_argument("--max-lora-rank", type=int, default=32, help="the largest LoRA rank a client may ask for")
    s.add_argument("--max-model-len", type=int, default=None, help="default: the model's own context")
    s.add_argument("--kv-cache-mb", type=int, default=256, help="CPU: the samplers' KV cache")
    s.add_argument("--sample-adapters", choices=["merged", "lora"], default="merged",
                   help="how samplers serve a LoRA client's snapshots: merged into the base weights (default: on CPU "
                        "vLLM's LoRA kernels cost about 1 s per request) or as vLLM LoRA adapters")
    s.add_argument("--metrics", default="tensorboard",
                   help="where each training client's steps are logged, one run per client: a comma-separated list of "
                        f"{', '.join(METRIC_BACKENDS)}, or none (default: tensorboard, in <root>/<model>/tensorboard/)")
    s.add_argument("--project", default="grpo-tinker", help="the W&B project / MLflow experiment of --metrics")
    s.set_defaults(func=_cmd_serve)


def _metric_sinks(text: str) -> tuple[str, ...]:
    """``--metrics`` as the backends of a run's ``logging.backends``."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names == ("none",):
        return ()
    if not names or set(names) - set(METRIC_BACKENDS):
        raise ValueError(f"--metrics {text!r}: choose from {', '.join(METRIC_BACKENDS)}, comma-separated, or none")
    missing = [n for n in names if n != "tensorboard" and importlib.util.find_spec(n) is None]
    if missing:
        raise ValueError(f"--metrics names {missing[0]}, which is not installed in this environment "
                         f"(`pip install {missing[0]}`, or leave it out)")
    return names


def _cmd_serve(args: argparse.Namespace) -> int:
    from grpo_core.run.storage.atomic_file import write_private
    from grpo_core.outside.tinker.server import TinkerApp, TinkerServer
    from grpo_core.outside.tinker.service import ServiceSettings, TinkerService

    key = args.api_key or os.environ.get("GRPO_TINKER_API_KEY") or f"tml-{secrets.token_urlsafe(24)}"
    if not key.startswith("tml-"):
        print("error: the API key must start with 'tml-' (the tinker SDK refuses any other)", file=sys.stderr)
        return 2
    if not Path(args.model, "config.json").is_file():
        print(f"error: --model {args.model}: not an HF model folder (no config.json)", file=sys.stderr)
        return 2
    try:
        sinks = _metric_sinks(args.metrics)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    root = Path(args.root)
    service = TinkerService(ServiceSettings(base_model=args.model, root=root, max_lora_rank=args.max_lora_rank,
                                            max_model_len=args.max_model_len, kv_cache_mb=args.kv_cache_mb,
                                            sample_adapters=args.sample_adapters, metric_sinks=sinks,
                                            project=args.project))
    server = TinkerServer(TinkerApp(service, key), host=args.host, port=args.port).start()
    write_private(root / SERVICE_FILE, json.dumps({"url": server.url, "api_key": key, "base_model":
                                                   service.base_folder, "pid": os.getpid()}).encode())
    print(f"tinker service on {server.url} (base model {service.base_folder}; key in {root / SERVICE_FILE})",
          flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0
