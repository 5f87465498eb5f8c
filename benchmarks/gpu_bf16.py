"""GPU: float32 against bfloat16 for the learner's work on SmolLM2-135M's architecture, and what the sync check's
digest costs on a GPU.

No vLLM and no weights needed (the device machines have torch + transformers only): the model is SmolLM2-135M's
config with random weights, which is enough for speed (the kernels do not look at the values). Per dtype, on the
shape of `configs/smollm2-arith.yaml`'s update (64 rows of 256 tokens, micro-batches of 8): one update (forward +
backward of every micro-batch, then AdamW; bf16 keeps float32 master weights and optimizer state as DeepSpeed's
BF16 optimizer does) and one no-grad logprob pass (the old/reference logprobs), in tokens per second. Then the
digest (``grpo_core.engine.weights_digest``) of the state dict on the GPU, SmolLM2-135M in both dtypes and a 1.5B-parameter
shape (Qwen2-1.5B's) in bf16, and a check that a tensor digests the same on the GPU and on the CPU.

    python benchmarks/gpu_bf16.py [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_core.engine.weights_digest import WeightsDigest, tensor_digest  # noqa: E402

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
               max_position_embeddings=8192, rms_norm_eps=1e-5)
QWEN2_1_5B_SHAPE = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                        num_key_value_heads=2, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                        max_position_embeddings=8192, rms_norm_eps=1e-6)
ROWS, SEQ, MICRO = 64, 256, 8


def _model(shape: dict, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**shape)
    return LlamaForCausalLM(cfg).to("cuda", dtype)


def _timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _logprobs(model, ids):
    logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def learner_figures(dtype: torch.dtype, micro: int = MICRO) -> dict:
    model = _model(SMOLLM2, dtype)
    ids = torch.randint(0, SMOLLM2["vocab_size"], (ROWS, SEQ), device="cuda")
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()] \
        if dtype != torch.float32 else list(model.parameters())
    opt = torch.optim.AdamW(masters, lr=1e-6, foreach=True)

    def update():
        for lo in range(0, ROWS, micro):
            loss = -_logprobs(model, ids[lo:lo + micro]).mean() / (ROWS // micro)
            loss.backward()
        if dtype != torch.float32:
            params = list(model.parameters())
            for m, p in zip(masters, params):
                m.grad = p.grad.float()
                p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dtype != torch.float32:
            with torch.no_grad():
                torch._foreach_copy_(params, masters)

    def score():
        with torch.no_grad():
            for lo in range(0, ROWS, MICRO * 2):
                _logprobs(model, ids[lo:lo + MICRO * 2])

    update_s, score_s = _timed(update), _timed(score)
    if micro != MICRO:
        return {"micro_batch": micro, "update_s": update_s, "update_tokens_per_s": ROWS * SEQ / update_s}
    named = list(model.state_dict().items())
    digest_s = _timed(lambda: WeightsDigest.of(named, tied=True), repeats=3, warmup=1)
    mib = sum(t.numel() * t.element_size() for n, t in named if n != "lm_head.weight") / 2**20
    return {"update_s": update_s, "update_tokens_per_s": ROWS * SEQ / update_s, "score_s": score_s,
            "score_tokens_per_s": ROWS * SEQ / score_s, "digest_s": digest_s, "state_mib": mib,
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def big_digest() -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        shapes = [(n, p.shape) for n, p in LlamaForCausalLM(LlamaConfig(**QWEN2_1_5B_SHAPE)).state_dict().items()]
    named = [(n, torch.randn(s, device="cuda", dtype=torch.bfloat16)) for n, s in shapes]
    out = {"params": sum(t.numel() for _, t in named), "gib": sum(t.numel() * 2 for _, t in named) / 2**30}
    for threads in (4, 16):
        out[f"digest_s_threads{threads}"] = _timed(lambda: WeightsDigest.of(named, threads=threads), 3, 1)
    return out


def device_independent() -> bool:
    t = torch.randn(1000, 77, dtype=torch.bfloat16)
    return tensor_digest(t) == tensor_digest(t.cuda()) and tensor_digest(t.float()) == tensor_digest(t.float().cuda())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the figures as JSON here")
    args = parser.parse_args()
    figures = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "tf32": torch.backends.cuda.matmul.allow_tf32,
               "shape": {"rows": ROWS, "tokens_per_row": SEQ, "micro_batch": MICRO},
               "same_digest_gpu_and_cpu": device_independent()}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        torch.cuda.reset_peak_memory_stats()
        figures[name] = learner_figures(dtype)
        torch.cuda.empty_cache()
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        figures[f"{name}_micro32"] = learner_figures(dtype, micro=32)
        torch.cuda.empty_cache()
    figures["bf16_speedup_update_micro32"] = figures["float32_micro32"]["update_s"] / figures["bfloat16_micro32"]["update_s"]
    figures["bf16_speedup_update"] = figures["float32"]["update_s"] / figures["bfloat16"]["update_s"]
    figures["bf16_speedup_score"] = figures["float32"]["score_s"] / figures["bfloat16"]["score_s"]
    figures["qwen2_1_5b_shape_bf16"] = big_digest()
    print(json.dumps(figures, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
