"""Checkpoint cost and resume start-up, on the tiny model and on the 24M-parameter reference shape.

For each shape the script

1. builds the learner exactly as the flow does (DeepSpeed ZeRO-2, fp32, AdamW) and takes one optimizer step so that
   the optimizer state exists;
2. takes a checkpoint as the policy actor does: the copy of the state to memory (what training waits for), then
   the background write, to a local folder and to a real S3 server (SeaweedFS on loopback); size of each part;
3. restores it into a fresh learner (from the local folder, and downloaded from S3) and checks the weights;
4. runs the flow for 2 iterations with a checkpoint after each, then resumes it with one more iteration and reads
   the resume start-up: flow call -> "resuming ..." line (engines started and state restored).

    .venv/bin/python benchmarks/checkpoint.py [--shapes tiny,24m] [--no-flow]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import iteration as bench_iteration  # noqa: E402  (benchmarks/iteration.py: model builder, env defaults)

TINY = REPO / "models/tiny"


def _learner(model_dir: Path, micro: int):
    from grpo_core.config import build_config
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    cfg = build_config({"model": {"path": str(model_dir)}, "data": {"train_path": "unused"},
                        "rollout": {"prompts_per_iteration": 4, "samples_per_prompt": 4},
                        "train": {"micro_batch_size": micro}})
    return Learner(LearnerSpec(model_path=str(model_dir), total_steps=10), cfg.algo, cfg.train,
                   micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)


def _batch(vocab: int, n: int = 16, length: int = 48):
    import torch

    from grpo_core.engine.train.batch import pack_batch

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (16,), generator=g).tolist() for _ in range(n)]
    responses = [torch.randint(3, vocab, (length - 16,), generator=g).tolist() for _ in range(n)]
    return pack_batch(prompts, responses, None, torch.randn(n, generator=g).tolist(), [True] * n, pad_id=0)


def measure_pieces(model_dir: Path, work: Path, s3: dict, repeats: int = 3) -> dict:
    import torch

    from grpo_core.run import checkpoint
    from grpo_core.run.checkpoint import CheckpointWriter
    from grpo_core.run.storage import RunStore

    learner = _learner(model_dir, micro=16)
    learner.train_step(_batch(learner.engine.module.config.vocab_size))
    out: dict = {"params": sum(p.numel() for p in learner.engine.module.parameters())}
    copies, local_writes, s3_writes = [], [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        snap = learner.snapshot(rank=0)
        snap.update(learner.hf_snapshot())
        copies.append(time.perf_counter() - t0)
        local = RunStore(str(work / "local"), f"r{r}")
        written = CheckpointWriter(local, checkpoint.checkpoint_path(0), snap).start().result(wait=True)
        local_writes.append(written["write_seconds"])
        out["bytes"] = written["bytes"]
        out["bytes_hf"] = written["files"]["model.safetensors"]["bytes"]
        out["bytes_learner"] = sum(f["bytes"] for n, f in written["files"].items() if n.startswith("learner/"))
        snap = learner.snapshot(rank=0)
        snap.update(learner.hf_snapshot())
        remote = RunStore(s3["root"] + f"/r{r}", "run", s3["options"])
        written_s3 = CheckpointWriter(remote, checkpoint.checkpoint_path(0), snap).start().result(wait=True)
        s3_writes.append(written_s3["write_seconds"])
        ref = checkpoint.commit(remote, 0, learner.version, written_s3["files"], keep_last=0)
        checkpoint.commit(local, 0, learner.version, written["files"], keep_last=0)
    out.update(copy_s=statistics.median(copies), write_local_s=statistics.median(local_writes),
               write_s3_s=statistics.median(s3_writes))

    fresh = _learner(model_dir, micro=16)
    t0 = time.perf_counter()
    fresh.load_state(str(work / "local" / "r0" / checkpoint.checkpoint_path(0)), rank=0,
                     policy_version=learner.version)
    out["restore_local_s"] = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = checkpoint.download(RunStore(s3["root"] + "/r0", "run", s3["options"]), ref, tmp)
        out["download_s3_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fresh.load_state(folder, rank=0, policy_version=learner.version)
        out["restore_after_download_s"] = time.perf_counter() - t0
    a = dict(learner.named_weights())
    out["restored_identical"] = all(torch.equal(a[k], t) for k, t in fresh.named_weights())
    return out


def measure_flow_resume(model_dir: Path, work: Path, shape: dict, kv_mb: int, max_prompt_tokens: int) -> dict:
    """2 iterations with a checkpoint after each, then a resume that runs the third."""
    import flows.grpo_train as gt

    lines: list[tuple[float, str]] = []

    def _print(*args, **kwargs):
        lines.append((time.perf_counter(), " ".join(str(a) for a in args)))

    config = {
        "run_name": "resume", "seed": 0, "iterations": 2,
        "model": {"path": str(model_dir)},
        "data": {"train_path": str(bench_iteration.TRAIN_PATH), "max_prompt_tokens": max_prompt_tokens},
        "rollout": {"prompts_per_iteration": shape["prompts"], "samples_per_prompt": shape["samples"],
                    "max_new_tokens": shape["new_tokens"], "kv_cache_mb": kv_mb},
        "eval": {"interval": 0}, "reward": {"num_workers": 1}, "train": {"micro_batch_size": shape["micro"]},
        "checkpoint": {"interval": 1}, "storage": {"root": str(work / "flow")},
    }
    gt.print = _print
    try:
        gt.grpo_train(config=config)
        first = gt.RunStore(str(work / "flow"), "resume").read_metrics().to_pylist()
        lines.clear()
        config["iterations"] = 3
        t0 = time.perf_counter()
        gt.grpo_train(config=config)
    finally:
        del gt.print
    resumed = [(t, text) for t, text in lines if text.startswith("resuming ")]
    ready = [(t, text) for t, text in lines if text.startswith("engines ready in ")]
    return {"call_to_resumed_s": resumed[0][0] - t0 if resumed else None,
            "call_to_engines_ready_s": ready[0][0] - t0 if ready else None,
            "resume_line": resumed[0][1] if resumed else None,
            "iteration_s": [r.get("time_total_s") for r in first],
            "checkpoint_call_s": [r.get("time_checkpoint_s") for r in first]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,24m")
    parser.add_argument("--no-flow", action="store_true", help="skip the flow-level resume measurement")
    args = parser.parse_args()

    from grpo_core.infra.s3server import start_s3_server

    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    server = start_s3_server(work / "s3", buckets=["bench"])
    s3 = {"root": "s3://bench/ckpt", "options": server.storage_options}
    results = {}
    try:
        for shape_name in args.shapes.split(","):
            if shape_name == "tiny":
                model_dir, shape = TINY, dict(prompts=32, samples=8, new_tokens=16, micro=64)
                if not (TINY / "config.json").exists():
                    raise SystemExit("models/tiny is missing: git checkout -- models/")
            else:
                shape = dict(bench_iteration.FULL)
                model_dir = work / "model-24m"
                bench_iteration.build_model(model_dir, shape, force_length=True)
            print(f"[{shape_name}] checkpoint pieces ...", flush=True)
            res = measure_pieces(model_dir, work / shape_name, s3)
            if not args.no_flow:
                print(f"[{shape_name}] flow: 2 iterations + resume ...", flush=True)
                prompts = bench_iteration.encode_prompts(model_dir, shape["prompts"])
                info = {"hidden": 64, "heads": 4, "layers": 2} if shape_name == "tiny" else \
                    {"hidden": shape["hidden"], "heads": shape["heads"], "layers": shape["layers"]}
                kv = bench_iteration.kv_cache_mb(info, shape["prompts"] * shape["samples"],
                                                 max(map(len, prompts)) + shape["new_tokens"] + 16)
                res["flow"] = measure_flow_resume(model_dir, work / shape_name, shape, kv,
                                                  96 if shape_name == "tiny" else 512)
            results[shape_name] = res
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'':<42}" + "".join(f"{name:>14}" for name in results))
    rows = [("parameters", lambda r: f"{r['params'] / 1e6:.2f}M"),
            ("checkpoint size (MiB)", lambda r: f"{r['bytes'] / 2**20:.1f}"),
            ("  policy, HF safetensors (MiB)", lambda r: f"{r['bytes_hf'] / 2**20:.1f}"),
            ("  learner: DeepSpeed + RNG (MiB)", lambda r: f"{r['bytes_learner'] / 2**20:.1f}"),
            ("copy to memory: training waits (s)", lambda r: f"{r['copy_s']:.3f}"),
            ("background write, local folder (s)", lambda r: f"{r['write_local_s']:.3f}"),
            ("background write, S3 on loopback (s)", lambda r: f"{r['write_s3_s']:.3f}"),
            ("restore learner from local (s)", lambda r: f"{r['restore_local_s']:.3f}"),
            ("download from S3 (s)", lambda r: f"{r['download_s3_s']:.3f}"),
            ("restored weights identical", lambda r: "yes" if r["restored_identical"] else "NO"),
            ("flow: call -> engines ready (s)", lambda r: _f(r.get("flow", {}).get("call_to_engines_ready_s"))),
            ("flow: call -> resumed (s)", lambda r: _f(r.get("flow", {}).get("call_to_resumed_s")))]
    for label, fn in rows:
        print(f"{label:<42}" + "".join(f"{fn(r):>14}" for r in results.values()))
    for name, r in results.items():
        if r.get("flow", {}).get("resume_line"):
            print(f"[{name}] {r['flow']['resume_line']}")


def _f(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    os.environ.setdefault("PREFECT_HOME", "/tmp/bench-prefect")
    main()
