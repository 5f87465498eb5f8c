"""`make run-retrain`: three nightly retraining rounds of the tiny policy, each gated against the registry's champion.

In a fresh storage root (with its own model registry, MLflow's, under ROOT/registry):
  night 1  starts from model.path on the first day's data file           -> the first champion
  night 2  starts from the champion with a learning rate that collapses the policy -> refused
  night 3  starts from the champion on the first two days' data files    -> promoted
Every night is `grpo train` with the nightly deployment's settings (model.init_from=champion, a glob of data files,
the gate); the demo then prints `grpo registry show` and the lineage of the champion, and exits non-zero if the
three decisions are not the ones above.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

NIGHTS = (
    ("night-1", "the first day's data", ["iterations=4"]),
    ("night-2", "a learning rate of 0.3: collapses the policy", ["iterations=3", "train.lr=0.3"]),
    ("night-3", "a new day's data file has arrived", ["iterations=8"]),
)
EXPECTED = ["promoted", "refused", "promoted"]


def _grpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "grpo"), *args], text=True,
                          capture_output=True)


def _write_day(data: str, day: int, rows: list[str]) -> str:
    path = os.path.join(data, f"day-{day}.jsonl")
    with open(path, "w") as handle:
        handle.writelines(rows)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a new storage root for the three runs and their registry")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--train", default="data/arith/train.jsonl", help="split into two days' files")
    args = parser.parse_args()
    if os.path.exists(args.root):
        parser.error(f"--root {args.root} exists: the demo starts from an empty registry")
    data = os.path.join(args.root, "data")
    os.makedirs(data)
    with open(args.train) as handle:
        rows = handle.readlines()
    half = len(rows) // 2
    _write_day(data, 1, rows[:half])
    common = [f"storage.root={args.root}", "model.init_from=champion", f"data.train_path={data}/day-*.jsonl",
              "gate.margin=0.02", "eval.interval=0", "checkpoint.interval=0"]
    decisions = []
    for name, what, overrides in NIGHTS:
        if name == "night-3":
            _write_day(data, 2, rows[half:])
        print(f"== {name}: {what}", flush=True)
        started = time.perf_counter()
        sets = [x for o in [*common, f"run_name={name}", *overrides] for x in ("--set", o)]
        done = _grpo("train", "--config", args.config, *sets)
        if done.returncode != 0:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
            print(f"{name}: grpo train failed (exit {done.returncode}); its logs are in {args.root}/{name}/logs")
            return 1
        with open(os.path.join(args.root, name, "gate.json")) as handle:
            gate = json.load(handle)
        with open(os.path.join(args.root, name, "init_from.json")) as handle:
            start = json.load(handle)
        started_from = f"registry version {start['registry_version']}" if start.get("registry_version") \
            else "model.path"
        decisions.append(gate["outcome"])
        print(f"   from {started_from}; {time.perf_counter() - started:.0f}s; gate: {gate['reason']}"
              + (f" -> version {gate['version']}" if gate.get("version") else ""), flush=True)
    shown = _grpo("registry", "show", "--root", args.root)
    registry = json.loads(shown.stdout)
    print("== grpo registry show --root", args.root)
    for v in registry["versions"]:
        print(f"   version {v['version']}: run {v['run']}, {v['decision']}, accuracy {v['metrics']['accuracy']:.4f}, "
              f"registered {v['registered_at']}")
    champion = registry["champion"]
    print(f"   champion: version {champion['version']} (run {champion['run']})")
    walked = json.loads(_grpo("registry", "show", "--root", args.root, "--lineage", str(champion["version"])).stdout)
    print(f"== grpo registry show --root {args.root} --lineage {champion['version']}")
    for link in walked["lineage"]:
        if "version" in link:
            files = ", ".join(f"{os.path.basename(d['path'])} ({d['size']} B, sha256 {d['sha256'][:12]})"
                              for d in link["data"])
            code = (link["code"] or {}).get("commit") or "not a git checkout"
            print(f"   version {link['version']} (run {link['run']}): data {files}; code {code[:12]}")
        else:
            print(f"   <- {link.get('model') or link.get('run')} (the first model)")
    if decisions != EXPECTED or [v["decision"] for v in registry["versions"]] != EXPECTED:
        print(f"unexpected decisions: {decisions} (expected {EXPECTED})")
        return 1
    print("three nights: promoted, refused, promoted; the registry agrees")
    return 0


if __name__ == "__main__":
    sys.exit(main())
