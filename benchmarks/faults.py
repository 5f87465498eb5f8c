"""Kill a training run at random moments, resume it each time, and check it ends exactly as an uninterrupted run.

The script

1. runs the built-in tiny task uninterrupted (`grpo train`, configs/tiny.yaml, shortened) as the reference, keeping
   all its checkpoints;
2. starts the same run under another name and, ``--kills`` times in turn, SIGKILLs the flow's whole process tree
   (the CLI, Ray's head and workers, the policy actor, the scorer pool) at a random moment, then starts it again,
   which resumes from the latest committed checkpoint;
3. lets the last start run to the end and compares: each checkpoint a resume started from against the reference's
   checkpoint of the same iteration (policy weights and DeepSpeed optimizer state), and the final weights and
   learning metrics against the reference's;
4. prints one row per kill: when, at which iteration and stage (from the run folder), what the next start resumed
   from, whether that checkpoint is identical to the uninterrupted run's; then the final verdict.

All runs share one Prefect server started for the benchmark on a free loopback port.

    .venv/bin/python benchmarks/faults.py [--kills 5] [--iterations 16] [--seed 0] [--keep]
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGES = ("rollouts.parquet", "scored.parquet", "train.json")
LEARNING = ("iteration", "policy_version", "reward_mean", "loss", "grad_norm", "lr", "eval_accuracy")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=open(home / "server.log", "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"Prefect server did not start; see {home / 'server.log'}")


def cli(args: list[str], api_url: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PREFECT_API_URL=api_url, PREFECT_LOGGING_LEVEL="WARNING", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "grpo_cli.commands", *args], cwd=REPO, env=env,
                            stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True)


def kill_tree(proc: subprocess.Popen) -> int:
    tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(tree, timeout=30)
    return len(tree)


def where(store, iterations: int) -> str:
    """The iteration and stage the run was in, read from its folder: the first iteration without train.json and
    the stages its manifest lists."""
    for it in range(iterations):
        listed = [name for name in STAGES if store.entry(it, name) is not None]
        if len(listed) < len(STAGES):
            doing = {0: "rollout", 1: "score", 2: "train/sync"}[len(listed)]
            return f"iteration {it}, {doing}"
    return "after the last iteration"


def _iterating(store, attempt: int) -> bool:
    """This start (the attempt-th) has recorded an iteration (a metrics row of its attempt)."""
    try:
        return attempt in store.read_metrics().to_pydict().get("run_attempt", [])
    except OSError:
        return False


def same_state(a_dir: Path, b_dir: Path) -> bool:
    """Policy weights and DeepSpeed optimizer state of two checkpoint folders are bit-identical."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(a_dir / "model.safetensors")), load_file(str(b_dir / "model.safetensors"))
    if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
        return False
    for f in sorted((a_dir / "learner").glob("*optim_states.pt")):
        x = torch.load(f, weights_only=False)["optimizer_state_dict"]
        y = torch.load(b_dir / "learner" / f.name, weights_only=False)["optimizer_state_dict"]
        if not _equal(x, y):
            return False
    return True


def _equal(x, y) -> bool:
    import torch

    if torch.is_tensor(x):
        return torch.is_tensor(y) and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(_equal(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    if hasattr(x, "__dict__") and type(x).__eq__ is object.__eq__:  # e.g. DeepSpeed's loss scaler: by value
        return type(x) is type(y) and _equal(vars(x), vars(y))
    return x == y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--checkpoint-interval", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--config", default="configs/tiny.yaml")
    parser.add_argument("--keep", action="store_true", help="keep the run folders")
    args = parser.parse_args()

    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import load_file

    from grpo_core.run import checkpoint
    from grpo_core.run.storage import RunStore

    work = Path(tempfile.mkdtemp(prefix="grpo-faults-"))
    root = work / "runs"
    model = REPO / "models/tiny"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "grpo_cli.commands", "model", "tiny", "--out", str(model)], check=True,
                       cwd=REPO)
    server, api = start_prefect_server(work)
    sets = ["--set", f"iterations={args.iterations}", "--set", f"checkpoint.interval={args.checkpoint_interval}",
            "--set", "checkpoint.keep_last=0", "--set", f"storage.root={root}", "--set", f"model.path={model}"]
    rows = []
    try:
        print(f"reference: uninterrupted run of {args.iterations} iterations ...", flush=True)
        t0 = time.monotonic()
        ref = cli(["train", "--config", args.config, *sets, "--set", "run_name=reference"], api, work / "ref.log")
        if ref.wait() != 0:
            print((work / "ref.log").read_text()[-3000:])
            return 1
        span = time.monotonic() - t0
        print(f"reference took {span:.1f}s", flush=True)

        rng = random.Random(args.seed)
        store = RunStore(str(root), "faulty")
        log = work / "faulty.log"
        train = ["train", "--config", args.config, *sets, "--set", "run_name=faulty"]
        per_iteration = statistics.median(r["time_total_s"] for r in RunStore(str(root), "reference")
                                          .read_metrics().to_pylist() if r.get("time_total_s"))
        for k in range(args.kills):
            proc = cli(train, api, log)
            # Kill at a random moment of this start's training: once it iterates (its status.json heartbeat is this
            # attempt's), within the time the remaining iterations take.
            while proc.poll() is None and not _iterating(store, attempt=k):
                time.sleep(0.01)
            status = store.get_json_file("status.json") or {}
            remaining = args.iterations - (status.get("iteration") or 0)
            delay = rng.uniform(0.0, remaining * per_iteration)
            started = time.monotonic()
            while time.monotonic() - started < delay and proc.poll() is None:
                time.sleep(0.01)
            if proc.poll() is not None:
                rows.append([k + 1, f"{delay:.1f}s", "finished before the kill", "-", "-"])
                break
            point = where(store, args.iterations)
            n = kill_tree(proc)
            latest = checkpoint.latest(store)
            rows.append([k + 1, f"{delay:.1f}s", f"{point} ({n} processes)", latest, None])
        final = cli(train, api, log)
        if final.wait() != 0:
            print(log.read_text()[-3000:])
            return 1
        text = log.read_text()
        resumed = re.findall(r"resuming faulty from (iter-\d+), policy version (\d+)", text)
        ref_store = RunStore(str(root), "reference")
        for row in rows:
            latest = row[3]
            if not isinstance(latest, checkpoint.CheckpointRef):
                continue
            same = same_state(root / "faulty" / latest.path, root / "reference" / latest.path)
            row[3] = f"{latest.name} (v{latest.policy_version})"
            row[4] = "yes" if same else "NO"
        a = load_file(str(root / "reference/final/model.safetensors"))
        b = load_file(str(root / "faulty/final/model.safetensors"))
        weights_same = a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
        metrics_same = [{c: r.get(c) for c in LEARNING} for r in pq.read_table(root / "faulty/metrics.parquet")
                        .to_pylist()] == [{c: r.get(c) for c in LEARNING} for r in
                                          ref_store.read_metrics().to_pylist()]
        print()
        print("| kill | after training began | kill point | resumed from | that checkpoint == uninterrupted run's |")
        print("| --- | --- | --- | --- | --- |")
        for row in rows:
            print("| " + " | ".join(str(c) for c in row) + " |")
        print()
        print(f"resume lines seen: {len(resumed)} ({', '.join(f'{n} v{v}' for n, v in resumed)})")
        print(f"final weights identical to the uninterrupted run: {'yes' if weights_same else 'NO'}")
        print(f"learning metrics identical (one row per iteration): {'yes' if metrics_same else 'NO'}")
        return 0 if weights_same and metrics_same and all(r[4] in ("yes", "-") for r in rows) else 1
    finally:
        kill_tree(server)
        if args.keep:
            print(f"run folders kept in {root}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
