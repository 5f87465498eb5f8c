"""Algorithm comparisons that take whole training runs: off-policy corrections in async RL, and the difficulty pool.

Each variant is one `grpo train` of a shipped config with `--set` overrides, run one after another in this process's
environment (run folders under --root, named after the variant; a finished run is read back, not redone). Printed:
one line per variant as it ends, then a table of greedy held-out accuracy (first, last, best), the first
iteration at or above --target, the rollout tokens sampled until then, and the mean masked fraction and sampler
mismatch. Learning curves are deterministic for a seed (async included), so load on the machine changes the wall
time only.

    .venv/bin/python benchmarks/curation.py offpolicy [--iterations 80] [--kinds tis,icepop,...]
    .venv/bin/python benchmarks/curation.py pool [--config configs/tiny.yaml] [--iterations 80] [--train-rows N]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_core.algo.offpolicy import KINDS  # noqa: E402
from grpo_core.run.storage import RunStore  # noqa: E402


def variants(study: str, args) -> list[tuple[str, str, list[str]]]:
    """(name, config, overrides) of each run."""
    if study == "offpolicy":
        config = "configs/tiny-async.yaml"
        out = [("sync-reference", config, ["rollout.max_staleness=0", "algo.offpolicy=none"])]
        return out + [(f"async-{k}", config, [f"algo.offpolicy={k}"]) for k in args.kinds.split(",")]
    data = []
    if args.train_rows:  # a subset of the train file, so that a short run makes several passes over it
        source = REPO / "data/arith/train.jsonl"
        subset = Path(args.root) / f"train-{args.train_rows}.jsonl"
        subset.parent.mkdir(parents=True, exist_ok=True)
        subset.write_text("".join(source.read_text().splitlines(keepends=True)[: args.train_rows]))
        data = [f"data.train_path={subset}"]
    return [("pool-epoch", args.config, data + ["data.sampler=epoch"]),
            ("pool-difficulty", args.config, data + ["data.sampler=difficulty_pool"]),
            ("pool-difficulty-easy-only", args.config, data + ["data.sampler=difficulty_pool",
                                                               "data.pool_hard_skips=0"])]


def run_name(name: str, args) -> str:
    return f"bench-{args.study}{args.tag}-{name}"


def run(name: str, config: str, overrides: list[str], args) -> float:
    sets = [f"run_name={run_name(name, args)}", f"storage.root={args.root}", f"iterations={args.iterations}",
            f"seed={args.seed}", *overrides, *args.set]
    cmd = [str(REPO / ".venv/bin/grpo"), "train", "--config", config] + [a for s in sets for a in ("--set", s)]
    log = Path(args.root) / f"{run_name(name, args)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.call(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    if rc != 0:
        print(f"{name}: exit {rc}, see {log}")
    return time.perf_counter() - started


def figures(name: str, args) -> dict:
    rows = RunStore(args.root, run_name(name, args)).read_metrics().to_pylist()
    evals = [(r["iteration"], r["eval_accuracy"]) for r in rows if r.get("eval_accuracy") is not None]
    first = next((it for it, acc in evals if acc >= args.target), None)
    tokens = sum(r.get("rollout_tokens") or 0 for r in rows if first is None or r["iteration"] < first)
    trained = [r for r in rows if r.get("loss") is not None]

    def mean(key):
        vals = [r[key] for r in trained if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {"name": name, "iterations": len(trained), "first": evals[0][1] if evals else None,
            "last": evals[-1][1] if evals else None, "best": max((a for _, a in evals), default=None),
            "reached": first, "tokens": tokens if first is not None else None,
            "masked": mean("offpolicy_masked_frac"), "mismatch": mean("mismatch_abs_logp_mean"),
            "skipped": sum(r.get("pool_skipped") or 0 for r in trained)}


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("study", choices=("offpolicy", "pool"))
    p.add_argument("--iterations", type=int, default=80)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=",".join([k for k in KINDS if k != "none"] + ["none"]))
    p.add_argument("--config", default="configs/tiny.yaml", help="pool: the config every variant runs")
    p.add_argument("--train-rows", type=int, default=0,
                   help="pool: train on the first N rows of data/arith/train.jsonl (0: the config's train set)")
    p.add_argument("--target", type=float, default=0.8, help="the eval accuracy whose first crossing is reported")
    p.add_argument("--root", default=str(REPO / "runs"))
    p.add_argument("--set", action="append", default=[], help="more overrides for every variant")
    p.add_argument("--tag", default="", help="added to the run names (a study with other --set values)")
    p.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    p.add_argument("--report-only", action="store_true", help="read the run folders, run nothing")
    args = p.parse_args()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    results = []
    chosen = [v for v in variants(args.study, args) if not args.only or v[0] in args.only.split(",")]
    for name, config, overrides in chosen:
        seconds = None if args.report_only else run(name, config, overrides, args)
        r = figures(name, args)
        r["seconds"] = seconds
        results.append(r)
        print(f"{name}: eval {fmt(r['first'])} -> {fmt(r['last'])} (best {fmt(r['best'])}), first >= "
              f"{args.target} at {r['reached']}, {fmt(seconds, '.0f')} s", flush=True)
    print(f"\n| run | iterations | eval first -> last | best | first eval >= {args.target} at | rollout tokens "
          "until then | masked frac | mismatch |logp| | prompts passed over |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['name']} | {r['iterations']} | {fmt(r['first'])} -> {fmt(r['last'])} | {fmt(r['best'])} | "
              f"{r['reached'] if r['reached'] is not None else '-'} | {fmt(r['tokens'], ',')} | "
              f"{fmt(r['masked'], '.4f')} | {fmt(r['mismatch'], '.4f')} | {r['skipped']} |")


if __name__ == "__main__":
    main()
