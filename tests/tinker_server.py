"""A `grpo tinker serve` process for the tests, on a folder of its own (its url and key in service.json)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def start_service(model: str, root: Path, *extra: str) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    (root / "service.json").unlink(missing_ok=True)
    env = {**os.environ, "GRPO_TINKER_API_KEY": "tml-test-key"}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_cli.commands", "tinker", "serve", "--model", model, "--root",
                             str(root), "--port", "0", "--max-lora-rank", "8", "--kv-cache-mb", "64", *extra],
                            env=env, stdout=open(root / "server.log", "ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while not (root / "service.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the tinker service did not start:\n{(root / 'server.log').read_text()[-3000:]}")
        time.sleep(0.2)
    return proc
