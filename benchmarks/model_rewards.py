"""Model rewards' throughput: rows scored per second by each kind, in this process (what one reward actor does).

Kinds and models: the classifier on the built-in reward model (models/tiny-rm) and on SmolLM2-135M with a
scalar head (its weights, a random head: throughput only); the vLLM judge on the tiny policy and on SmolLM2; the
remote judge against `grpo serve` of the tiny policy on a free loopback port. Rows are arithmetic questions with a
boxed answer; judges answer up to --max-tokens tokens. Load time is printed apart (paid once per run).

    .venv/bin/python benchmarks/model_rewards.py [--rows 256] [--threads 2] [--skip-smollm2]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from grpo_core.rewards.models import RewardInput  # noqa: E402


def rows(n: int) -> list[RewardInput]:
    return [RewardInput((("user", f"What is {i % 90 + 10} + {i % 9 + 1}?"),), f"\\boxed{{{i % 90 + i % 9 + 11}}}")
            for i in range(n)]


def timed(name: str, build, batch: list[RewardInput]) -> dict:
    started = time.perf_counter()
    reward = build()
    load = time.perf_counter() - started
    reward.score(batch[:8])  # warm-up
    started = time.perf_counter()
    verdicts = reward.score(batch)
    seconds = time.perf_counter() - started
    reward.close()
    unscored = sum(v.value is None for v in verdicts)
    out = {"kind": name, "rows": len(batch), "load_s": round(load, 2), "score_s": round(seconds, 2),
           "rows_per_s": round(len(batch) / seconds, 1), "unscored": unscored}
    print(json.dumps(out), flush=True)
    return out


def smollm2_classifier(tmp: Path) -> str:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source = REPO / ".cache/models/smollm2"
    tok = AutoTokenizer.from_pretrained(source)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, pad_token_id=tok.pad_token_id)
    model.save_pretrained(tmp / "smollm2-rm")
    tok.save_pretrained(tmp / "smollm2-rm")
    return str(tmp / "smollm2-rm")


def serve(model: str, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_cli.commands", "serve", "--model", model, "--port", str(port),
                             "--kv-cache-mb", "64"], cwd=REPO, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.5)
    raise RuntimeError(f"grpo serve did not start: {log.read_text()[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from grpo_core.rewards.models.classifier import ClassifierReward
    from grpo_core.rewards.models.judge import RemoteJudge, VLLMJudge

    batch = rows(args.rows)
    judge = dict(template="{question}\nProposed answer: {response}\nRate it from {low:g} to {high:g}.",
                 verdict="number", score_range=(0.0, 10000.0), max_tokens=args.max_tokens)
    tiny, tiny_rm = str(REPO / "models/tiny"), str(REPO / "models/tiny-rm")
    print(f"# {args.rows} rows, {args.threads} torch threads, judges answer up to {args.max_tokens} tokens")
    results = [timed("classifier tiny-rm", lambda: ClassifierReward(tiny_rm, batch_size=64), batch)]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_smollm2:
            path = smollm2_classifier(Path(tmp))
            results.append(timed("classifier smollm2-135m", lambda: ClassifierReward(path, batch_size=32), batch))
        results.append(timed("vllm judge tiny", lambda: VLLMJudge(tiny, **judge), batch))
        if not args.skip_smollm2:
            smol = str(REPO / ".cache/models/smollm2")
            results.append(timed("vllm judge smollm2-135m", lambda: VLLMJudge(smol, max_model_len=1024, **judge),
                                 batch))
        proc, url = serve(tiny, Path(tmp) / "serve.log")
        try:
            results.append(timed("remote judge tiny (grpo serve)", lambda: RemoteJudge(url, **judge), batch))
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()
    print("summary: " + "; ".join(f"{r['kind']} {r['rows_per_s']} rows/s" for r in results))


if __name__ == "__main__":
    main()
