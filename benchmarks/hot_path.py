"""CPU seconds of the two engine hot paths on the tiny task's shape, in process time on one thread (other jobs on the
machine blur wall times far more than CPU times):

* learner: one ``Learner.train_step`` on 256 sequences (32 groups of 8 sharing a 40-token prompt, 6-7 response
  tokens), with and without ``train.pack_prompts``, DeepSpeed ZeRO-2 and ZeRO-0;
* sampler: vLLM generation of 4 prompts x 4 samples x 32 tokens on the quick reference shape without logprobs, with
  vLLM's default per-token logprob objects, and with the sampler's flat, undetokenized logprobs.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hot_path.py [--part learner|sampler|both] [--repeats 6]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
for _k, _v in {"HF_HUB_OFFLINE": "1", "TORCH_EXTENSIONS_DIR": str(REPO / ".cache/torch_extensions"),
               "DS_BUILD_OPS": "0", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}.items():
    os.environ.setdefault(_k, _v)


def grouped_batch(groups: int = 32, samples: int = 8, prompt_len: int = 40, vocab: int = 393, seed: int = 0):
    import torch

    from grpo_core.engine.train.batch import pack_batch

    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(groups):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        for j in range(samples):
            prompts.append(prompt)
            responses.append(torch.randint(3, vocab, (7 - j % 2,), generator=g).tolist())
    n = len(prompts)
    return pack_batch(prompts, responses, [[-1.0] * len(r) for r in responses], torch.randn(n, generator=g).tolist(),
                      [True] * n, pad_id=0)


def learner_case(model: str, stage: int, pack: bool, repeats: int) -> dict:
    from grpo_core.config import AlgoConfig, TrainConfig
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    train = TrainConfig(lr=1e-3, lr_schedule="cosine", micro_batch_size=64, zero_stage=stage, grad_clip=1.0)
    learner = Learner(LearnerSpec(model_path=model, total_steps=80, max_new_tokens=16, pack_prompts=pack),
                      AlgoConfig(), train, micro_batch_size=64, grad_accum_steps=4)
    batch = grouped_batch()
    learner.train_step(batch)  # warm-up
    times = []
    for _ in range(repeats):
        started = time.process_time()
        learner.train_step(batch)
        times.append(time.process_time() - started)
    return {"zero_stage": stage, "pack_prompts": pack, "cpu_s": statistics.median(times), "all": times}


def sampler_case(repeats: int) -> dict:
    import benchmarks.iteration as bi

    shape = dict(bi.QUICK)
    folder = Path(tempfile.mkdtemp(prefix="hot-path-"))
    bi.build_model(folder, shape, force_length=True)
    prompts = bi.encode_prompts(folder, shape["prompts"])
    from vllm import LLM, SamplingParams, TokensPrompt

    from grpo_core.engine.rollout.sampler import _FAST_LOGPROBS

    llm = LLM(model=str(folder), enforce_eager=True, distributed_executor_backend="uni", dtype="float32",
              kv_cache_memory_bytes=64 * 2**20, max_model_len=640, seed=0, logprobs_mode="processed_logprobs",
              enable_prefix_caching=False, enable_chunked_prefill=False, max_num_batched_tokens=8192)
    tokenizer = llm.get_tokenizer()
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def run(decode: bool, **extra) -> float:
        params = [SamplingParams(n=shape["samples"], max_tokens=shape["new_tokens"], temperature=1.0, seed=i, **extra)
                  for i in range(len(prompts))]
        started = time.process_time()
        outs = llm.generate(inputs, params, use_tqdm=False)
        if decode:  # what the sampler does after a generation without detokenization
            tokenizer.batch_decode([list(c.token_ids) for o in outs for c in o.outputs], skip_special_tokens=True)
        return time.process_time() - started

    variants = {"no logprobs": (False, {}), "logprobs=0, vLLM objects": (False, {"logprobs": 0}),
                "logprobs=0, the sampler's flat path": (True, dict(_FAST_LOGPROBS))}
    run(False)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):  # interleaved, so that drifting load hits every variant alike
        for name, (decode, extra) in variants.items():
            times[name].append(run(decode, **extra))
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["learner", "sampler", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--model", default=str(REPO / "models/tiny"))
    parser.add_argument("--_case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._case:  # one learner per process: DeepSpeed engines of different stages do not share a process well
        stage, pack = args._case.split(",")
        print(json.dumps(learner_case(args.model, int(stage), pack == "1", args.repeats)))
        return
    print(f"threads: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}; load avg {os.getloadavg()[0]:.2f} at start")
    if args.part in ("learner", "both"):
        for stage, pack in ((2, 0), (2, 1), (0, 1)):
            out = subprocess.run([sys.executable, __file__, "--_case", f"{stage},{pack}", "--repeats",
                                  str(args.repeats), "--model", args.model], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"learner ZeRO-{stage} pack={pack} failed:\n{out.stderr[-2000:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"learner train_step, 256 sequences, ZeRO-{stage}, pack_prompts={bool(pack)!s:<5}: "
                  f"{r['cpu_s']:.3f} CPU s (median of {args.repeats})")
    if args.part in ("sampler", "both"):
        for name, seconds in sampler_case(args.repeats).items():
            print(f"sampler generate 4 x 4 x 32 tokens, {name:<36}: {seconds:.3f} CPU s")


if __name__ == "__main__":
    main()
