"""What one SDPA call costs beyond its arithmetic: the figure behind ``segment_attention.CALL_COSTS``.

A packed row's attention is one SDPA call per group or per sequence (``grpo_core/engine/train/segment_attention.py``); the
choice weighs the (query, key) pairs each layout computes against the calls it makes. This prints, on the device
given, forward + backward of masked SDPA calls shaped as a response over its prompt + itself:

* the time of a small call (``--small`` queries over ``--prompt`` + as many keys): almost all fixed cost;
* the time per pair x attention width (heads x head dim) of a large call (``--large`` queries);
* their ratio: the fixed cost of a call in pair x width units, what ``CALL_COSTS`` holds per device type.

    .venv/bin/python benchmarks/segment_attention.py [--device cuda] [--heads 9 --head-dim 64]

Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def call_seconds(torch, heads: int, head_dim: int, prompt: int, n: int, device: str, dtype, repeats: int) -> float:
    """Median seconds of forward + backward of one masked SDPA call: n queries over prompt + n keys."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, heads, prompt + n, head_dim, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, heads, prompt + n, head_dim, device=device, dtype=dtype, requires_grad=True)
    mask = torch.ones(n, prompt + n, dtype=torch.bool, device=device).tril(diagonal=prompt)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for i in range(repeats + 3):
        sync()
        started = time.perf_counter()
        sdpa(q, k, v, attn_mask=mask).sum().backward()
        sync()
        if i >= 3:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--heads", type=int, default=9, help="SmolLM2-135M's 9 heads of 64")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--small", type=int, default=8)
    parser.add_argument("--large", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    import torch

    dtype = getattr(torch, args.dtype)
    width = args.heads * args.head_dim
    small = call_seconds(torch, args.heads, args.head_dim, args.prompt, args.small, args.device, dtype, args.repeats)
    large = call_seconds(torch, args.heads, args.head_dim, args.prompt, args.large, args.device, dtype,
                         max(3, args.repeats // 5))
    per_unit = large / (args.large * (args.prompt + args.large) * width)
    print(f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}), "
          f"{args.dtype}, {args.heads} heads x {args.head_dim}, torch {torch.__version__}")
    print(f"small call ({args.small} x {args.prompt + args.small}): {small * 1e6:.0f} us forward + backward")
    print(f"large call ({args.large} x {args.prompt + args.large}): {large * 1e3:.2f} ms, "
          f"{per_unit * 1e12:.3f} ps per pair x width unit")
    print(f"a call's fixed cost = {small / per_unit:.3g} pair x width units (CALL_COSTS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
