"""The engines' floors for ``benchmarks/peers.py --workload smollm2``: what the flow's work costs done standalone,
measured in the same call, and the weight sync by each transport.

* generation: plain in-process vLLM on the prompts of the run's first iteration (as the flow rendered them: system
  prompt, worked example, chat template), the same sampling (n = samples per prompt, temperature 1, max new tokens, EOS
  allowed), fp32, with the engine settings the project's sampler uses (prefix caching, so that a prompt's samples
  share its prefill, with the CPU block size; no chunked prefill): the floor is vLLM at its best here, not vLLM's
  defaults; then the requests the flow's sampler makes of its first iteration (the same seeds, with logprobs), which
  give that iteration's very tokens;
* a train step: plain torch (HF model, AdamW, the flow's micro-batch, one optimizer step) over as many sequences of
  prompt + the flow's mean response length;
* the CPU's GEMM peak: a 2048 x 2048 fp32 ``torch.mm`` with the engines' threads;
* weight sync: short split-placement runs of the same config by broadcast and by files (the main run's placement,
  colocate, syncs in-process), the median ``time_sync_s`` of iterations 1...

Each standalone measure runs in a process of its own with the threads the flow's actor gets.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import benchmarks.iteration as bi
from grpo_core.engine.roles.sampler import sampling_seed
from grpo_core.engine.rollout.sampler import CPU_PREFIX_BLOCK


def rendered_prompts(cfg) -> list[list[int]]:
    """The token ids of the run's first ``prompts_per_iteration`` train prompts, as the flow encodes them."""
    from transformers import AutoTokenizer

    from grpo_core.data.readers import read_prompts
    from grpo_core.pipeline.prompts import PromptTokenizer

    d = cfg.data
    tok = AutoTokenizer.from_pretrained(_model_dir(cfg))
    enc = PromptTokenizer(tok, cfg.reward.type, d.system_prompt, d.max_prompt_tokens,
                          [t.model_dump() for t in d.few_shot])
    path = str(bi.REPO / d.train_path)
    rows = read_prompts(path).rows[:cfg.rollout.prompts_per_iteration]
    return [enc.encode(r, path)["prompt_token_ids"] for r in rows]


def _model_dir(cfg) -> str:
    return str((bi.REPO / cfg.model.path).resolve())


def run_floors(cfg, response_mean: float, work: Path, repeats: int = 2,
               prompts: list[list[int]] | None = None) -> dict:
    """Standalone generation, train step and GEMM peak for ``cfg`` (``response_mean``: the flow's mean response
    length, the standalone train step's response length). ``prompts``: the flow's first iteration's, group by
    group (default: the train set's first rows, rendered as the flow renders them)."""
    from transformers import AutoConfig

    seeds = [sampling_seed(cfg.seed, 0, group) for group in range(len(prompts))] if prompts else None
    prompts = prompts or rendered_prompts(cfg)
    ro = cfg.rollout
    longest = max(map(len, prompts)) + ro.max_new_tokens
    model_cfg = AutoConfig.from_pretrained(_model_dir(cfg))
    base = {"model_dir": _model_dir(cfg), "prompts": prompts, "samples": ro.samples_per_prompt,
            "new_tokens": ro.max_new_tokens, "kv_mb": ro.kv_cache_mb, "max_model_len": longest + 16,
            "micro": cfg.micro_batch_size, "pad_id": model_cfg.pad_token_id or model_cfg.eos_token_id or 0,
            "repeats": repeats, "ignore_eos": False,
            "seeds": seeds,
            "engine": {"enable_prefix_caching": True, "block_size": CPU_PREFIX_BLOCK, "enable_chunked_prefill": False,
                       "max_num_batched_tokens": max(8192, longest + 16)}}
    (work / "floor-gen.json").write_text(json.dumps(base))
    train = dict(base, new_tokens=max(1, round(response_mean)))
    (work / "floor-train.json").write_text(json.dumps(train))
    out = {"prompt_tokens_mean": statistics.mean(map(len, prompts))}
    print("peers: standalone vLLM generation ...", flush=True)
    out["gen"] = bi.run_baseline("vllm", work / "floor-gen.json", work / "floor-gen-out.json")
    print("peers: standalone torch train step ...", flush=True)
    out["train"] = bi.run_baseline("train", work / "floor-train.json", work / "floor-train-out.json")
    print("peers: GEMM peak ...", flush=True)
    (work / "floor-gemm.json").write_text(json.dumps({"repeats": 5, "gemm_size": 2048}))
    out["gemm"] = bi.run_baseline("gemm", work / "floor-gemm.json", work / "floor-gemm-out.json")
    out["train_tokens"] = len(prompts) * ro.samples_per_prompt * (out["prompt_tokens_mean"] + train["new_tokens"])
    out["params"] = model_params(_model_dir(cfg))
    return out


def model_params(model_dir: str) -> int:
    """Parameters in the model's safetensors (a tied output layer counted once: it is the embedding)."""
    from safetensors import safe_open

    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(path), "pt") as fh:
            for name in fh.keys():
                n = 1
                for d in fh.get_slice(name).get_shape():
                    n *= d
                total += n
    return total



def sync_runs(config_path: str, overrides: list[str], work: Path, run_ours, iterations: int = 3) -> dict:
    """``time_sync_s`` (median of iterations 1..) of split-placement runs of the config by broadcast and by files."""
    out = {}
    for transport in ("broadcast", "files"):
        print(f"peers: sync by {transport} (split placement, {iterations} iterations) ...", flush=True)
        run = run_ours(config_path, [*overrides, f"iterations={iterations}", "eval.interval=0",
                                     "cluster.placement=split", f"weights.transport={transport}",
                                     "checkpoint.interval=0"], work / f"sync-{transport}")
        rows = [r for r in run.get("metrics", []) if r.get("time_sync_s") is not None and r["iteration"] >= 1]
        out[transport] = {"sync_s": statistics.median(r["time_sync_s"] for r in rows) if rows else None,
                          "iteration_s": statistics.median(r["time_total_s"] for r in rows) if rows else None,
                          "error": run.get("error")}
    return out
