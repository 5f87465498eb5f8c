"""float32 against bfloat16 on a real run: the same config trained once per dtype, one after the other on this machine,
and a table of what each cost and learned.

    .venv/bin/python benchmarks/dtype.py [--config configs/smollm2-arith.yaml] [--root runs/dtype]
        [--variant NAME=KEY=VALUE[,KEY=VALUE...] ...] [--set KEY=VALUE ...]

Default variants: ``bfloat16`` (model.dtype=bfloat16 with token TIS, ``algo.tis_cap=2``: the correction of the
training/inference mismatch that bf16 engines bring) and ``float32`` (model.dtype=float32). Each runs ``grpo train``
in a process of its own (``--set`` applies to every variant) and is read back from its metrics.parquet: medians over iterations 1.. (iteration 0 warms the engines) of each stage's seconds, rollout tokens
per second, the held-out accuracy at each evaluation, the post-sync check (tensors matched by digest, the logprob
gap) and the learner's per-batch mismatch (``mismatch_*``). Nothing is timed while another heavy job runs: give it
a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_VARIANTS = {"bfloat16": ["model.dtype=bfloat16", "algo.tis_cap=2.0"],
                    "float32": ["model.dtype=float32"]}
STAGES = ("time_rollout_s", "time_score_s", "time_train_s", "time_sync_s", "time_sync_check_s", "time_eval_s",
          "time_total_s")


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _max(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return max(values) if values else None


def run_variant(name: str, settings: list[str], args) -> dict:
    run_name = f"dtype-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [str(REPO / ".venv/bin/grpo"), "train", "--config", args.config, "--set", f"run_name={run_name}",
           "--set", f"storage.root={args.root}"]
    for item in [*settings, *args.set]:
        cmd += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{name}: `{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return summarize(name, settings, args.root, run_name, wall)


def summarize(name: str, settings: list[str], root: str, run_name: str, wall: float | None) -> dict:
    """One run's figures from its metrics.parquet (the final evaluation is a row without training figures)."""
    from grpo_core.run.storage import RunStore

    rows = RunStore(root, run_name).read_metrics().to_pylist()
    trained = [r for r in rows if r.get("rollout_tokens") is not None]
    steady = [r for r in trained if r["iteration"] >= 1] or trained
    tokens = sum(r["rollout_tokens"] for r in steady)
    rollout_s = sum(r["time_rollout_s"] for r in steady)
    return {
        "variant": name, "settings": settings, "run": run_name, "wall_s": wall, "iterations": len(trained),
        **{f"median_{k}": _median(steady, k) for k in STAGES},
        "rollout_tokens_per_s": tokens / rollout_s if rollout_s else None,
        "eval_accuracy": {r["iteration"]: r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None},
        "reward_mean_first4": statistics.mean(r["reward_mean"] for r in trained[:4]),
        "reward_mean_last4": statistics.mean(r["reward_mean"] for r in trained[-4:]),
        "sync_tensors_checked": _max(rows, "sync_tensors_checked"),
        "sync_logprob_max_diff": _max(rows, "sync_logprob_max_diff"),
        "sync_logprob_p99_diff": _max(rows, "sync_logprob_p99_diff"),
        "sync_logprob_mean_diff": _max(rows, "sync_logprob_mean_diff"),
        "sync_logprob_k3": _max(rows, "sync_logprob_k3"),
        "mismatch_abs_logp_max": _max(rows, "mismatch_abs_logp_max"),
        "mismatch_abs_logp_mean": _median(rows, "mismatch_abs_logp_mean"),
        "mismatch_k3": _median(rows, "mismatch_k3"),
        "offpolicy_capped_frac": _median(rows, "offpolicy_capped_frac"),
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e3 else f"{v:.3f}"
    return str(v)


def report(results: list[dict]) -> None:
    keys = [k for k in results[0] if k not in ("variant", "settings", "run", "eval_accuracy", "config")]
    print(f"\n{platform.processor() or platform.machine()}; config {results[0].get('config')}")
    print("| figure | " + " | ".join(r["variant"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for key in keys:
        print(f"| {key} | " + " | ".join(_fmt(r.get(key)) for r in results) + " |")
    its = sorted({i for r in results for i in r["eval_accuracy"]})
    for i in its:
        print(f"| eval_accuracy @ {i} | " + " | ".join(_fmt(r["eval_accuracy"].get(i)) for r in results) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smollm2-arith.yaml")
    parser.add_argument("--root", default="runs/dtype")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=KEY=VALUE[,KEY=VALUE...]; replaces the default float32 and bfloat16 variants")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every variant")
    parser.add_argument("--reuse", action="append", default=[],
                        help="NAME=RUN: report a run already in --root as variant NAME instead of training it")
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()
    variants = DEFAULT_VARIANTS
    if args.variant:
        variants = {v.split("=", 1)[0]: v.split("=", 1)[1].split(",") for v in args.variant}
    reused = dict(r.split("=", 1) for r in args.reuse)
    results = []
    for name, settings in variants.items():
        result = (summarize(name, settings, args.root, reused[name], None) if name in reused
                  else run_variant(name, settings, args))
        result["config"] = args.config
        results.append(result)
        print(json.dumps(result), flush=True)
    report(results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
