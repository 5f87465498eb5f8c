"""The flow's version check: a sampler serving other weights than the learner's is re-synced before sampling; and
the post-sync check: a sampler that claims the learner's version with one weight off is caught, in float32 and
bfloat16."""
from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file, save_file

from grpo_core.config import build_config
from grpo_core.data.schemas import rollouts_table
from grpo_core.run.storage import RunStore
from tests.conftest import tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stale_or_corrupted_sampler_is_detected_and_resynced(tiny_model, tmp_path, prefect_harness, dtype):
    from grpo_core.cluster.engines import Engines, SyncCheckFailed
    from grpo_core.rewards.scorer import Scorer
    from grpo_core.run.status import RunStatus
    from tasks.context import RunContext
    from tasks.sync import check_rows, ensure_synced, sync

    cfg = build_config(tiny_config(tiny_model, str(tmp_path), rollout__prompts_per_iteration=1,
                                   train__micro_batch_size=4, model__dtype=dtype))
    engines = Engines(cfg)
    engines.start()
    try:
        ctx = RunContext(cfg=cfg, store=RunStore(str(tmp_path), cfg.run_name), engines=engines,
                         scorer=Scorer(num_workers=1), train_prompts=None, status=RunStatus())
        # One update with non-zero advantages so the learner's weights differ from the model on disk.
        prompt = list(range(3, 20))
        rows = [{"iteration": 0, "prompt_id": 0, "group_id": 0, "sample_idx": i, "prompt_token_ids": prompt,
                 "response_token_ids": [30 + i, 31, 2], "sampler_logprobs": [-1.0, -1.0, -1.0],
                 "response_text": "x", "finish_reason": "stop", "truncated": False, "response_length": 3,
                 "policy_version": 0, "sampler_id": 0} for i in range(4)]
        table = rollouts_table(rows, [{}] * 4)
        table = table.append_column("advantage", pa.array([1.0, -1.0, 1.0, -1.0], pa.float32()))
        table = table.append_column("kept", pa.array([True] * 4))
        ctx.store.put_table(0, "rollouts.parquet", rollouts_table(rows, [{}] * 4))
        ctx.store.put_table(0, "scored.parquet", table)
        engines.learners.train(0)
        checked = sync(ctx, check=(0, "rollouts.parquet"))
        assert (engines.samplers.versions(), engines.learners.version()) == ([1], 1)
        published = engines.learners.published_receipt()
        assert checked.tensors_checked == len(published.digest.tensors) > 0
        assert published.digest.tensors["model.norm.weight"].dtype == dtype  # digested as sent, in the run's dtype
        in_sync = engines.weights.check(check_rows(ctx, 0, "rollouts.parquet", 4)).gap.max_diff
        if dtype == "float32":
            assert in_sync < 1e-4

        # A corrupted sync: the sampler claims version 1 but one weight of the learner's is one ulp off. The
        # version check sees nothing to do; the digest check fails the run and names the tensor.
        final = load_file(engines.learners.save_final().folder + "/model.safetensors")
        name = next(n for n in sorted(final) if "layers.0" in n and final[n].ndim == 2)
        final[name].view(torch.int32 if dtype == "float32" else torch.int16).view(-1)[3] += 1
        corrupted = tmp_path / "corrupted"
        shutil.copytree(tiny_model, corrupted)
        save_file(final, str(corrupted / "model.safetensors"))
        engines.samplers.serve_checkpoint(str(corrupted), 1)
        assert ensure_synced(ctx, expected_learner_version=1) is None
        with pytest.raises(SyncCheckFailed, match=rf"sampler\(s\) \[0\] serve other weights than the learner "
                                                  rf"published: sampler 0: {name}: other bytes \(of "):
            engines.weights.check(check_rows(ctx, 0, "rollouts.parquet", 4))

        # The sampler comes back with the original weights (as a restarted sampler would) ...
        engines.samplers.serve_checkpoint(tiny_model, 0)
        # The post-sync check fails on it: the run would stop there, not train on.
        with pytest.raises(SyncCheckFailed, match=r"sampler 0: serves version 0, not 1; model\.embed_tokens\.weight: "):
            engines.weights.check(check_rows(ctx, 0, "rollouts.parquet", 4))
        # ... the version check notices and re-syncs, and the two agree again.
        assert ensure_synced(ctx, expected_learner_version=1) is not None
        assert (engines.samplers.versions(), engines.learners.version()) == ([1], 1)
        assert engines.weights.check(check_rows(ctx, 0, "rollouts.parquet", 4)).tensors == len(published.digest.tensors)
        assert ensure_synced(ctx, expected_learner_version=1) is None  # nothing to do when versions agree
        with pytest.raises(RuntimeError, match="lost its state"):
            ensure_synced(ctx, expected_learner_version=5)
        ctx.scorer.close()
    finally:
        engines.close()


def test_an_engine_whose_setup_fails_leaves_nothing_behind_and_its_error_is_the_one_raised(tiny_model, tmp_path,
                                                                                            prefect_harness):
    """vLLM refuses a context longer than the model's positions inside the actor's setup (the config check that
    refuses it first is not on this path): the start raises that error, not one from releasing a half-made fleet,
    and close() after it has nothing left to release (``_flows_leave_ray_clean`` checks that no actor or placement
    group is left)."""
    from grpo_core.cluster.engines import Engines

    cfg = build_config(tiny_config(tiny_model, str(tmp_path), data__max_prompt_tokens=300))  # + 16 > 256 positions
    engines = Engines(cfg)
    with pytest.raises(Exception, match="max_model_len"):
        engines.start()
    engines.close()
