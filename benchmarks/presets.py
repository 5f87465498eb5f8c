"""Compare algorithm presets on the built-in task: iterations and time until greedy eval accuracy reaches a target.

Runs `grpo train --config configs/tiny.yaml --set algo.preset=NAME` once per preset (each in its own process, as a
user would), then reads each run's metrics.parquet. Prints a markdown table. Not a test: figures depend on the
machine and on what else runs on it.

    .venv/bin/python benchmarks/presets.py [--presets grpo,dapo,dr_grpo] [--target 0.8] [--set key=value ...]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]


def run_preset(name: str, root: str, model: str, extra: list[str]) -> float:
    cmd = [str(REPO / ".venv/bin/grpo"), "train", "--config", str(REPO / "configs/tiny.yaml"),
           "--set", f"algo.preset={name}", "--set", f"run_name=preset-{name}", "--set", f"storage.root={root}",
           "--set", f"model.path={model}"]
    for pair in extra:
        cmd += ["--set", pair]
    started = time.perf_counter()
    log = Path(root) / f"{name}.log"
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode:
        sys.exit(f"preset {name} failed (exit {proc.returncode}); log: {log}")
    return time.perf_counter() - started


def summarise(name: str, root: str, target: float, wall: float) -> dict:
    rows = pq.read_table(Path(root) / f"preset-{name}" / "metrics.parquet").to_pylist()
    elapsed, reached, reached_s = 0.0, None, None
    for r in rows:
        elapsed += (r.get("time_total_s") or 0.0) + (r.get("time_eval_s") or 0.0 if r.get("time_total_s") is None
                                                     else 0.0)
        acc = r.get("eval_accuracy")
        if reached is None and acc is not None and acc >= target:
            reached, reached_s = r["iteration"], elapsed
    evals = [r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None]
    trained = [r for r in rows if r.get("reward_mean") is not None]
    return {"preset": name, "first_eval": evals[0], "last_eval": evals[-1], "best_eval": max(evals),
            "reached_iteration": reached, "reached_s": reached_s, "iterations": len(trained),
            "s_per_iteration": sum(r["time_total_s"] for r in trained) / len(trained),
            "rounds_per_iteration": sum(r.get("rollout_rounds") or 1 for r in trained) / len(trained),
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="grpo,dapo,dr_grpo")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--model", default=str(REPO / "models/tiny"))
    parser.add_argument("--root", default=None, help="run folder root (default: a temp dir)")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides for every preset")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"no model at {args.model}: restore models/tiny (git checkout -- models/) or build one with "
                 f"grpo model tiny --out {args.model}")
    root = args.root or tempfile.mkdtemp(prefix="grpo-presets-")
    results = []
    for name in args.presets.split(","):
        wall = run_preset(name, root, args.model, args.set)
        results.append(summarise(name, root, args.target, wall))
        print(f"{name}: done in {wall:.0f}s", flush=True)
    print(f"\ncommand: {' '.join(sys.argv)}   cores: {os.cpu_count()}   runs: {root}\n")
    print(f"| preset | eval acc first -> last (best) | first iteration with eval >= {args.target} | "
          f"training time to it (s) | s / iteration | rollout rounds / iteration | wall time of the run (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        reached = "not reached" if r["reached_iteration"] is None else str(r["reached_iteration"])
        reached_s = "-" if r["reached_s"] is None else f"{r['reached_s']:.0f}"
        print(f"| {r['preset']} | {r['first_eval']:.3f} -> {r['last_eval']:.3f} ({r['best_eval']:.3f}) | {reached} "
              f"| {reached_s} | {r['s_per_iteration']:.2f} | {r['rounds_per_iteration']:.2f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
