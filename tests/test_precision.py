"""Precision: model.dtype auto, and the sync check's tolerance by dtype, enforced (a sampler serving other weights
than the learner trains fails the run) and measured on real engines in float32 and bfloat16."""
from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from grpo_core.cluster.engines import SyncCheckFailed, compare_sync
from grpo_core.config import build_config
from grpo_core.precision import SYNC_TOLERANCE
from tests.conftest import tiny_config


def test_the_sync_check_fails_beyond_the_tolerance_naming_the_sampler():
    sampled = [[[-1.0, -2.0]], [[-0.5, -3.0]]]  # two samplers, one sequence each
    learned = [[-1.0, -2.0004], [-0.5, -3.3]]
    with pytest.raises(SyncCheckFailed, match=r"sampler\(s\) \[1\] serve other weights .* up to 0\.3 .* beyond the "
                                              r"tolerance 0\.001 for float32 engines"):
        compare_sync([0, 1], sampled, learned, SYNC_TOLERANCE["float32"], "float32")
    out = compare_sync([0, 1], sampled, learned, SYNC_TOLERANCE["bfloat16"], "bfloat16")
    assert out["sync_logprob_max_diff"] == pytest.approx(0.3)
    assert out["sync_logprob_max_diff_sampler0"] == pytest.approx(4e-4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_after_a_sync_sampler_and_learner_agree_within_the_dtype_tolerance(tiny_model, tmp_path, dtype):
    """A colocated worker (vLLM + DeepSpeed in one process, as the actor holds them) in ``dtype``: after a train
    step and the in-process sync, vLLM's logprobs of the sampled tokens equal the learner's within the dtype's
    tolerance; bf16 kernels of two engines differ far beyond float32 noise, which is why the tolerance differs."""
    from grpo_core.engine_worker import EngineWorker
    from grpo_core.storage import RunStore
    from grpo_core.train.learner import ensure_process_group
    from tests.test_lora import _prompts, _sync_diff

    cfg = build_config(tiny_config(tiny_model, str(tmp_path), model__dtype=dtype, rollout__prompts_per_iteration=4,
                                   rollout__samples_per_prompt=4, train__lr=1e-3, train__micro_batch_size=16))
    RunStore(str(tmp_path), "test").write_config(cfg.model_dump(mode="json"))
    ensure_process_group()
    worker = EngineWorker(cfg, sampler_id=0, learner_rank=0)
    worker.setup("127.0.0.1", 0)
    assert worker.info()["dtype"] == dtype
    table, _ = worker.sample(0, _prompts(cfg, cfg.data.train_path, 4), 0)
    scored = table.append_column("advantage", pa.array(torch.randn(table.num_rows).tolist(), pa.float32()))
    worker.store.put_table(0, "scored.parquet", scored.append_column("kept", pa.array([True] * table.num_rows)))
    worker.train(0)
    worker.push_inprocess()
    diff = _sync_diff(worker, table, n=16)
    print(f"{dtype}: sync_logprob_max_diff {diff:.3g}")
    assert diff < SYNC_TOLERANCE[dtype]
    if dtype == "bfloat16":
        assert diff > SYNC_TOLERANCE["float32"]  # not float32 noise: the float32 tolerance would fail bf16 runs
