"""Compare algorithm presets on the built-in task: iterations and time until greedy eval accuracy reaches a target.

Runs `grpo train --config configs/tiny.yaml --set algo.preset=NAME` once per preset (each in its own process, as a
user would), then reads each run's metrics.parquet. Prints a markdown table. Not a test: figures depend on the
machine and on what else runs on it.

    .venv/bin/python benchmarks/presets.py [--presets grpo,dapo,dr_grpo] [--target 0.8] [--set key=value ...]

A ``--variant LABEL=PRESET,key=value,...`` runs a preset with overrides of its own, beside the presets (PPO with
one answer per prompt against GRPO's groups at the same number of sampled answers; turn-level credit on the tool
task, from another config):

    .venv/bin/python benchmarks/presets.py --presets grpo --set iterations=60 \
        --variant ppo-g1=ppo,rollout.samples_per_prompt=1,rollout.prompts_per_iteration=256 --variant ppo-g8=ppo
    .venv/bin/python benchmarks/presets.py --config configs/tiny-tools.yaml --model models/tiny-tools --presets "" \
        --variant episode=grpo --variant step-groups=grpo,algo.turn_credit=step_groups
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


def parse_variant(text: str) -> tuple[str, str, list[str]]:
    """``LABEL=PRESET,key=value,...`` -> (label, preset, overrides)."""
    label, _, rest = text.partition("=")
    preset, *pairs = rest.split(",")
    if not label or not preset or any("=" not in p for p in pairs):
        sys.exit(f"--variant {text!r}: expected LABEL=PRESET,key=value,...")
    return label, preset, pairs


def run_preset(name: str, root: str, model: str, extra: list[str], preset: str | None = None,
               config: str = "configs/tiny.yaml") -> float:
    cmd = [str(REPO / ".venv/bin/grpo"), "train", "--config", str(REPO / config),
           "--set", f"algo.preset={preset or name}", "--set", f"run_name=preset-{name}",
           "--set", f"storage.root={root}", "--set", f"model.path={model}"]
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
            "sampled_tokens": sum(r.get("rollout_tokens") or 0 for r in trained), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="grpo,dapo,dr_grpo")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--config", default="configs/tiny.yaml", help="the config every run starts from")
    parser.add_argument("--model", default=str(REPO / "models/tiny"))
    parser.add_argument("--root", default=None, help="run folder root (default: a temp dir)")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides for every preset")
    parser.add_argument("--variant", action="append", default=[],
                        help="LABEL=PRESET,key=value,...: a preset with overrides of its own (after --set's)")
    args = parser.parse_args()
    if not (Path(args.model) / "config.json").exists():
        sys.exit(f"no model at {args.model}: restore models/tiny (git checkout -- models/) or build one with "
                 f"grpo model tiny --out {args.model}")
    root = args.root or tempfile.mkdtemp(prefix="grpo-presets-")
    Path(root).mkdir(parents=True, exist_ok=True)
    results = []
    runs = [(name, name, []) for name in args.presets.split(",") if name]
    runs += [parse_variant(v) for v in args.variant]
    for name, preset, own in runs:
        wall = run_preset(name, root, args.model, args.set + own, preset, args.config)
        results.append(summarise(name, root, args.target, wall))
        print(f"{name}: done in {wall:.0f}s", flush=True)
    print(f"\ncommand: {' '.join(sys.argv)}   cores: {os.cpu_count()}   runs: {root}\n")
    print(f"| preset | eval acc first -> last (best) | first iteration with eval >= {args.target} | "
          f"training time to it (s) | s / iteration | rollout rounds / iteration | sampled tokens | "
          f"wall time of the run (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        reached = "not reached" if r["reached_iteration"] is None else str(r["reached_iteration"])
        reached_s = "-" if r["reached_s"] is None else f"{r['reached_s']:.0f}"
        print(f"| {r['preset']} | {r['first_eval']:.3f} -> {r['last_eval']:.3f} ({r['best_eval']:.3f}) | {reached} "
              f"| {reached_s} | {r['s_per_iteration']:.2f} | {r['rounds_per_iteration']:.2f} | "
              f"{r['sampled_tokens']} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
