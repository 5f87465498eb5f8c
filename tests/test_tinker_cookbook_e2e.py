"""tinker-cookbook's own recipes, unmodified (from .venv-tinker, `make envs`), against a `grpo tinker serve` process
on the tiny model: the math_rl recipe (env=arithmetic) runs its steps to the end, every step's metrics written, and the
chat_sl recipe on the cookbook's conversations file lowers its training NLL. The long demo on SmolLM2 is
`make run-tinker`."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import REPO
from tests.tinker_server import start_service

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
TINKER_PYTHON = REPO / ".venv-tinker" / "bin" / "python"


def _recipe(module: str, args: list[str], env: dict, log) -> None:
    out = subprocess.run([str(TINKER_PYTHON), "-m", module, *args], env=env, cwd=log.parent, stdout=open(log, "w"),
                         stderr=subprocess.STDOUT, timeout=600)
    assert out.returncode == 0, log.read_text()[-4000:]


def _metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_the_cookbooks_rl_and_supervised_recipes_run_unmodified_against_the_service(tiny_model, tmp_path):
    assert TINKER_PYTHON.exists(), "tinker-cookbook's venv is missing: `make envs` builds .venv-tinker (make test-e2e does)"
    root = tmp_path / "service"
    proc = start_service(tiny_model, root)
    try:
        info = json.loads((root / "service.json").read_text())
        env = {**os.environ, "TINKER_API_KEY": info["api_key"], "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1"}
        common = [f"base_url={info['url']}", f"model_name={info['base_model']}", "renderer_name=qwen3_instruct",
                  "lora_rank=8", "behavior_if_log_dir_exists=delete"]
        _recipe("tinker_cookbook.recipes.math_rl.train",
                common + ["env=arithmetic", "loss_fn=importance_sampling", "group_size=4", "groups_per_batch=4",
                          "max_tokens=8", "learning_rate=1e-4", "max_steps=2", "save_every=2", "eval_every=0",
                          f"log_path={tmp_path / 'rl'}"], env, tmp_path / "rl.log")
        conversations = subprocess.run(
            [str(TINKER_PYTHON), "-c", "import os, tinker_cookbook; print(os.path.join(os.path.dirname("
             "tinker_cookbook.__file__), 'example_data', 'conversations.jsonl'))"],
            capture_output=True, text=True, check=True).stdout.strip()
        _recipe("tinker_cookbook.recipes.chat_sl.train",
                common + [f"dataset={conversations}", "batch_size=8", "max_length=256", "learning_rate=1e-3",
                          "max_steps=4", "save_every=0", f"log_path={tmp_path / 'sl'}"], env, tmp_path / "sl.log")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    rl = [r for r in _metrics(tmp_path / "rl") if "env/all/correct" in r]
    assert [int(r["step"]) for r in rl] == [1, 2]
    assert all(r["env/all/total_episodes"] == 16 for r in rl)
    nll = [r["train_mean_nll"] for r in _metrics(tmp_path / "sl") if "train_mean_nll" in r]
    assert len(nll) == 4 and nll[-1] < nll[0], nll
    # the service recorded what it was asked: every forward_backward and optim_step of both recipes
    ops = [json.loads(line)["op"] for f in root.glob("*/requests.jsonl") for line in f.read_text().splitlines()]
    assert ops.count("optim_step") == 2 + 4
