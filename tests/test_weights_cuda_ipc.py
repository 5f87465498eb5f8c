"""cuda_ipc: learner and sampler in separate Ray actors sharing one GPU; weights move through vLLM's IPC engine.

Needs a CUDA device and a CUDA build of vLLM; skips cleanly without them (CI and the CPU development machine have
neither; the lent GPU machines have no vLLM). The mechanism itself (vLLM's packed IPC producer/consumer, between
two processes on one GPU) is measured by benchmarks/gpu_ipc_sync.py, which needs torch only.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from grpo_core.run.storage import RunStore
from tests.conftest import tiny_config


def _cuda_vllm() -> str | None:
    """Why this test cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed"
    from vllm.platforms import current_platform

    return None if current_platform.is_cuda() else f"vLLM is a {current_platform.device_name} build, not CUDA"


pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(_cuda_vllm() is not None, reason=f"cuda_ipc: {_cuda_vllm()}")]


def test_split_on_one_gpu_syncs_through_cuda_ipc(tiny_model, tmp_path, prefect_harness):
    from flows.grpo_train import grpo_train

    cfg = tiny_config(tiny_model, str(tmp_path), iterations=3, eval__interval=0, rollout__temperature=0.7,
                      rollout__gpu_memory_utilization=0.3, cluster__placement="split",
                      cluster__sampler_resources={"num_cpus": 0.5, "num_gpus": 0.5},
                      cluster__learner_resources={"num_cpus": 0.5, "num_gpus": 0.5}, weights__transport="cuda_ipc")
    grpo_train(config=cfg)
    rows = RunStore(str(tmp_path), "test").read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["sync_logprob_max_diff"] < 1e-3, r  # the tiny model in fp32 on GPU: TF32 matmuls differ a little
