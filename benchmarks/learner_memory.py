"""Peak memory and time of the learner's logprob forward + backward on a real vocabulary: the output layer's logits
materialised for the whole micro-batch against the learner's chunked output layer (grpo_core/engine/train/output_head.py).

Each variant runs in a fresh process (peak RSS is per process): load the model (SmolLM2-135M-Instruct by default,
built by `make model-smollm2`), build one micro-batch of ``--rows`` rows of ``--prompt-len`` prompt tokens and
``--response-len`` response tokens, then ``--steps`` times forward -> per-token logprobs (and the entropy metric)
-> a policy-gradient-shaped loss -> backward. Printed per variant: the resident memory after loading, the peak during
the steps (``ru_maxrss``) and their difference (what the step itself needs: activations, logits, gradients), and
the median step time.

  * ``full``: ``model(ids).logits`` ([rows, length, vocabulary]), logprobs and entropy by log-softmax over all of it
    in float32 (``token_logprobs`` + ``entropy_from_logits``): what a learner without chunking does;
  * ``chunked``: the decoder's hidden states at the response positions only, through ``output_logprobs`` in
    chunks of ``train.logits_chunk_mb`` (the learner's path, ``Learner._forward_logprobs``);
  * ``chunked+ckpt``: the same with ``train.gradient_checkpointing`` (transformers' non-reentrant checkpointing of
    each decoder layer): the decoder's activations, the rest of the step's memory, recomputed in backward.

    .venv/bin/python benchmarks/learner_memory.py [--model .cache/models/smollm2] [--rows 8 --response-len 200]

Run it on a quiet machine (nothing else on the cores): the times are compared within one call.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = ("full", "chunked", "chunked+ckpt")


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _one(args: argparse.Namespace) -> dict:
    """One variant, in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_core.algo import entropy_from_logits
    from grpo_core.engine.train.batch import pack_batch, token_logprobs
    from grpo_core.engine.train.output_head import chunk_tokens_for, output_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = False
    if args.variant == "chunked+ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, vocab, (args.prompt_len,), generator=g).tolist()] * args.rows
    responses = [torch.randint(100, vocab, (args.response_len,), generator=g).tolist() for _ in range(args.rows)]
    batch = pack_batch(prompts, responses, None, torch.randn(args.rows, generator=g).tolist(), [True] * args.rows,
                       pad_id=0)
    mask = batch.loss_mask
    adv = batch.advantages[:, None]
    loaded = _rss_mib()

    def step() -> None:
        if args.variant == "full":
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            logp = token_logprobs(logits, batch.input_ids)
            with torch.no_grad():
                entropy = entropy_from_logits(logits[:, :-1].float())
            loss = -(logp * adv * mask).sum() / mask.sum()
        else:
            hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                         use_cache=False).last_hidden_state
            rows, cols = batch.response_mask.nonzero(as_tuple=True)
            head = model.get_output_embeddings().weight
            logp, entropy = output_logprobs(hidden[rows, cols], head, batch.input_ids[rows, cols + 1],
                                            entropy="metric",
                                            chunk_tokens=chunk_tokens_for(vocab, args.logits_chunk_mb))
            loss = -(logp * batch.advantages[rows]).sum() / mask.sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        del loss, logp, entropy

    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": args.variant, "rows": args.rows, "length": args.prompt_len + args.response_len,
            "vocab": vocab, "loaded_mib": round(loaded), "peak_mib": round(peak), "step_mib": round(peak - loaded),
            "step_s": round(statistics.median(times), 2), "logits_mib_whole_batch":
            round(args.rows * (args.prompt_len + args.response_len) * vocab * 4 / 2**20)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=".cache/models/smollm2")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=80)
    p.add_argument("--response-len", type=int, default=200)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--logits-chunk-mb", type=float, default=128.0)
    p.add_argument("--variant", choices=VARIANTS, default=None, help="run one variant in this process")
    args = p.parse_args()
    if args.variant is not None:
        print(json.dumps(_one(args)))
        return
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise SystemExit(f"{args.model}: no model folder (build it with `make model-smollm2`)")
    results = []
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--variant", variant, *sys.argv[1:]], capture_output=True,
                             text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    full, chunked, ckpt = results
    print(f"{args.rows} rows x {full['length']} tokens, vocabulary {full['vocab']} (float32 logits of the whole "
          f"micro-batch: {full['logits_mib_whole_batch']} MiB): step memory full {full['step_mib']} -> chunked "
          f"{chunked['step_mib']} MiB ({chunked['step_mib'] / max(1, full['step_mib']):.2f}x) -> with gradient "
          f"checkpointing {ckpt['step_mib']} MiB ({ckpt['step_mib'] / max(1, full['step_mib']):.2f}x); step "
          f"{full['step_s']} -> {chunked['step_s']} -> {ckpt['step_s']} s")


if __name__ == "__main__":
    main()
