"""Runs of `grpo train` in a subprocess that tests kill and resume (the flow's whole process tree, SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
import yaml
from safetensors.torch import load_file

from grpo_core.run import checkpoint
from grpo_core.run.storage import RunStore
from tests.conftest import REPO
from tests.watchers import suspended


def api_env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value(), PYTHONUNBUFFERED="1",
               PREFECT_LOGGING_LEVEL="WARNING")
    env.pop("PREFECT_HOME", None)
    return env


def start_cli(config: dict, tmp: Path, log_name: str) -> tuple[subprocess.Popen, Path]:
    path = tmp / f"{log_name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp / f"{log_name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_cli.main", "train", "--config", str(path)], cwd=REPO,
                            env=api_env(), stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL the flow process and every process under it (Ray's head, workers and actors, the scorer pool).

    The flow process is stopped first, at once: it commits every stage, so nothing more is committed while the tree
    is listed (on a loaded machine that takes long enough for the next stage to finish)."""
    proc.send_signal(signal.SIGSTOP)
    tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, f"processes survived the kill: {alive}"
    return len(tree)


def wait_listed(store: RunStore, iteration: int, name: str, proc: subprocess.Popen, log: Path,
                 timeout: float = 400) -> None:
    """Until the iteration's manifest lists ``name`` (the stage is committed)."""
    deadline = time.monotonic() + timeout
    while store.entry(iteration, name) is None:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before the kill point:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {name} for iteration {iteration} in time:\n{log.read_text()}")
        time.sleep(0.005)


def stop_once_listed(store: RunStore, proc: subprocess.Popen, log: Path, iteration: int, name: str,
                     near: tuple[int, str]) -> None:
    """Leave the flow process SIGSTOPped at the first moment ``name`` of ``iteration`` is committed, before anything
    later can be: from ``near`` (a stage committed shortly before) on, the flow runs in steps of a few milliseconds,
    stopped between them while the run folder is read.

    Polling alone (and killing once the commit is seen) can miss the point: the next stage's commit comes tens of
    milliseconds later on the tiny task, and on a loaded machine the poller may not run for that long. Stopped, the
    flow commits nothing (every commit of the run folder is the flow process's); its actors may run on."""
    wait_listed(store, *near, proc, log)
    flow = psutil.Process(proc.pid)
    while True:
        suspended(flow)
        if store.entry(iteration, name) is not None:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before the stop point:\n{log.read_text()}")
        flow.resume()
        time.sleep(0.002)


def run_cli_to_end(config: dict, tmp: Path, log_name: str) -> str:
    proc, log = start_cli(config, tmp, log_name)
    rc = proc.wait(timeout=600)
    text = log.read_text()
    assert rc == 0, text
    return text


def wait_committed(store: RunStore, proc: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while checkpoint.latest(store) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no checkpoint was committed:\n{log.read_text()}")
        time.sleep(0.02)


def kill_once_listed(config: dict, tmp: Path, iteration: int, name: str) -> RunStore:
    """Start `grpo train` on ``config`` and SIGKILL its whole process tree as soon as ``name`` of ``iteration`` is
    committed. Returns the run's store."""
    store = RunStore(config["storage"]["root"], config["run_name"])
    proc, log = start_cli(config, tmp, "first")
    wait_listed(store, iteration, name, proc, log)
    kill_tree(proc)
    return store


def weights_differing(root: Path, run: str, ref_root: Path, ref_run: str) -> list[str]:
    """The tensors of ``run``'s final weights that are not bit-identical to ``ref_run``'s (same names asserted)."""
    a = load_file(str(ref_root / ref_run / "final" / "model.safetensors"))
    b = load_file(str(root / run / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def learning_rows(root: Path, run: str, columns: tuple[str, ...]) -> list[dict]:
    """The run's metrics rows, restricted to ``columns`` (what describes learning, not timings)."""
    return [{k: r.get(k) for k in columns} for r in RunStore(str(root), run).read_metrics().to_pylist()]
