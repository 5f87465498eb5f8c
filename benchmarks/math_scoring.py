"""Math scoring throughput: responses per second through Scorer(reward_type="boxed") on N worker processes.

The batch looks like a GRPO iteration: prompts with G samples each, a mix of right, wrong and unboxed answers,
integer, fraction and LaTeX golds. Pool start-up is measured separately (it is paid once per run, not per call).

    .venv/bin/python benchmarks/math_scoring.py [--workers 2] [--prompts 64] [--samples 16] [--repeats 3]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from grpo_core.rewards.scorer import Scorer

GOLDS = ["7", "\\frac{1}{2}", "42", "3\\sqrt{2}", "0.25", "x^2 + 1", "\\{1, 2\\}", "-5"]
RIGHT = ["7", "0.5", "42", "\\sqrt{18}", "\\frac{1}{4}", "1 + x^2", "\\{2, 1\\}", "-5"]


def make_batch(prompts: int, samples: int, seed: int = 0) -> tuple[list[str], list[dict]]:
    """A GRPO-like batch; the seed also varies the wording, so no two batches share a completion string."""
    rng = random.Random(seed)
    completions, rows = [], []
    for prompt in range(prompts):
        kind = prompt % len(GOLDS)
        for _ in range(samples):
            roll = rng.random()
            if roll < 0.4:
                answer = f"\\boxed{{{RIGHT[kind]}}}"
            elif roll < 0.8:
                answer = f"\\boxed{{{rng.randint(-100, 100)}}}"
            else:
                answer = "I am not sure."
            completions.append(f"Step by step (batch {seed}, problem {prompt}): ... So the answer is {answer}.")
            rows.append({"gt_answer": GOLDS[kind]})
    return completions, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    batches = [make_batch(args.prompts, args.samples, seed) for seed in range(args.repeats)]  # no cache reuse
    started = time.perf_counter()
    with Scorer(reward_type="boxed", num_workers=args.workers, timeout_s=5.0) as scorer:
        startup = time.perf_counter() - started
        rates = []
        for completions, rows in batches:
            begin = time.perf_counter()
            results = scorer.score(completions, rows)
            rates.append(len(completions) / (time.perf_counter() - begin))
        mean_reward = sum(r.reward for r in results if r.reward is not None) / len(results)
        errors = sum(r.reward is None for r in results)
    print(f"workers={args.workers} batch={len(completions)} startup={startup:.2f}s "
          f"rates={[round(r) for r in rates]} median={statistics.median(rates):.0f} responses/s "
          f"mean_reward={mean_reward:.3f} errors={errors}")


if __name__ == "__main__":
    main()
