"""Rollout throughput through a `grpo serve` server (HTTP) against the in-process sampler, on the reference workload.

Same model (the random ~24M-parameter fp32 Qwen2 of ``benchmarks/iteration.py``, built so it never emits EOS), same
prompts, same request: 8 prompts x 8 samples x 128 new tokens at temperature 1 with logprobs and a seed per prompt,
as a rollout asks for them. One after the other, never at once:

1. in-process: ``VLLMSampler`` (vLLM's ``LLM`` in this process, what a colocated or split sampler actor runs);
2. server: ``grpo serve`` started on a free loopback port, driven by ``ServerSampler`` (one request per prompt,
   concurrent, token ids and logprobs in the JSON).

Prints the median seconds per rollout over ``--repeats`` (after one warm-up each) and the ratio.

    .venv/bin/python benchmarks/server_rollout.py [--repeats 3] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.iteration import FULL, QUICK, build_model, encode_prompts, kv_cache_mb  # noqa: E402


def _timed_rollouts(sampler, prompts: list[list[int]], shape: dict, repeats: int) -> dict:
    def once() -> tuple[float, int]:
        started = time.perf_counter()
        groups = sampler.generate(prompts, n=shape["samples"], max_tokens=shape["new_tokens"], temperature=1.0,
                                  seeds=list(range(len(prompts))))
        return time.perf_counter() - started, sum(len(s.token_ids) for g in groups for s in g)

    warm, _ = once()
    runs = [once() for _ in range(repeats)]
    seconds = statistics.median(t for t, _ in runs)
    return {"warmup_s": warm, "rollout_s": seconds, "all_s": [t for t, _ in runs], "tokens": runs[0][1],
            "tokens_per_s": runs[0][1] / seconds}


def in_process(model_dir: str, prompts, shape: dict, kv_mb: int, repeats: int) -> dict:
    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler

    started = time.perf_counter()
    sampler = VLLMSampler(SamplerSpec(model_path=model_dir, kv_cache_mb=kv_mb,
                                      max_model_len=max(len(p) for p in prompts) + shape["new_tokens"] + 8))
    return {"start_s": time.perf_counter() - started, **_timed_rollouts(sampler, prompts, shape, repeats)}


def through_server(model_dir: str, prompts, shape: dict, kv_mb: int, repeats: int, log: Path) -> dict:
    from grpo_core.engine.rollout.server import ServerSampler

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "grpo_cli.commands", "serve", "--model", model_dir, "--port",
                             str(port), "--kv-cache-mb", str(kv_mb)], cwd=REPO, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sampler = ServerSampler(f"http://127.0.0.1:{port}", tag="bench", ready_timeout_s=600)
        ready = time.perf_counter() - started
        return {"start_s": ready, **_timed_rollouts(sampler, prompts, shape, repeats)}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a 1M-parameter model and 4 x 4 x 32 tokens")
    parser.add_argument("--_inprocess", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    if args._inprocess:  # child process: the in-process sampler, alone
        spec = json.loads(Path(args._inprocess).read_text())
        out = in_process(spec["model"], spec["prompts"], shape, spec["kv_mb"], args.repeats)
        Path(spec["out"]).write_text(json.dumps(out))
        return
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        model = Path(tmp) / "model"
        info = build_model(model, shape, force_length=True)
        prompts = encode_prompts(model, shape["prompts"])
        kv_mb = kv_cache_mb(info, shape["prompts"] * shape["samples"], 160 + shape["new_tokens"])
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"model": str(model), "prompts": prompts, "kv_mb": kv_mb,
                                    "out": str(Path(tmp) / "inproc.json")}))
        subprocess.run([sys.executable, __file__, "--_inprocess", str(spec), "--repeats", str(args.repeats)]
                       + (["--quick"] if args.quick else []), check=True, cwd=REPO)
        local = json.loads((Path(tmp) / "inproc.json").read_text())
        served = through_server(str(model), prompts, shape, kv_mb, args.repeats, Path(tmp) / "server.log")
    print(f"model: {info['params'] / 1e6:.2f}M parameters; {shape['prompts']} prompts x {shape['samples']} samples x "
          f"{shape['new_tokens']} new tokens, logprobs, seeded; medians of {args.repeats} after a warm-up")
    print(f"{'':12}{'start s':>9}{'rollout s':>11}{'tokens/s':>10}  all")
    for name, r in (("in-process", local), ("server", served)):
        print(f"{name:12}{r['start_s']:9.1f}{r['rollout_s']:11.2f}{r['tokens_per_s']:10.0f}  "
              + " ".join(f"{t:.2f}" for t in r["all_s"]))
    print(f"server / in-process rollout time: {served['rollout_s'] / local['rollout_s']:.2f}")


if __name__ == "__main__":
    main()
