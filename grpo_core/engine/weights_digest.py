"""What a sync check compares: a digest of the weights themselves, per tensor, on both sides of a transport.

A sampler serves the learner's weights exactly when it was handed the same tensors, byte for byte: the same names,
dtypes, shapes and bytes. So the learner digests what it publishes (its state dict in the dtype it sends, or the LoRA
adapter) and every sampler digests what its engine's loader was handed (inside the vLLM worker, for every transport:
``grpo_core.engine.rollout.worker_ext``), and the driver compares the two. Unlike a comparison of logprobs this has no
tolerance: float32 and bfloat16 are checked alike, a weight one ulp off is caught (its logprobs would not move),
and the error names the tensors that differ. What vLLM does with the tensors after its loader took them (repacking
for its kernels) is seen by the logprob comparison, which stays beside it as a measure of the mismatch.

A tensor's digest is the sha256 of its bytes as it lies in memory (read to the CPU first), hashed in threads
(hashlib releases the GIL): SmolLM2-135M's 513 MiB of float32 in 0.21-0.27 s on 2 Xeon cores, 0.11 s in bf16; on an
H100 0.23 s / 0.11 s, a 1.5B model's 3.3 GiB of bf16 in 1.2-1.7 s (docs/benchmarks.md).
"""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    import torch

# Names an engine drops on receipt: with tied embeddings the output layer IS the embedding (``Receipt`` callers pass
# the model's tie flag; both sides leave it out).
TIED_OUTPUT = "lm_head.weight"
# How many differing tensor names an error lists.
SHOWN = 5


@dataclass(frozen=True)
class TensorDigest:
    dtype: str  # torch's name without the prefix: float32, bfloat16
    shape: tuple[int, ...]
    sha256: str


def tensor_digest(tensor: "torch.Tensor") -> TensorDigest:
    """The digest of one tensor: its dtype, shape and the sha256 of its bytes (on the CPU, contiguous)."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
    return TensorDigest(dtype=str(tensor.dtype).removeprefix("torch."), shape=tuple(tensor.shape),
                        sha256=hashlib.sha256(memoryview(raw.numpy())).hexdigest())


@dataclass(frozen=True)
class WeightsDigest:
    """Per-tensor digests of a set of named tensors (a state dict, or a LoRA adapter)."""
    tensors: dict[str, TensorDigest]

    @classmethod
    def of(cls, named: Iterable[tuple[str, "torch.Tensor"]], *, tied: bool = False,
           threads: int = 4) -> "WeightsDigest":
        """Digest ``(name, tensor)`` pairs; ``tied``: leave out the output layer (it is the embedding)."""
        pairs = [(n, t) for n, t in named if not (tied and n == TIED_OUTPUT)]
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            digests = list(pool.map(lambda pair: tensor_digest(pair[1]), pairs))
        return cls({n: d for (n, _), d in zip(pairs, digests)})

    @classmethod
    def merge(cls, parts: Iterable["WeightsDigest"]) -> "WeightsDigest":
        """One digest of tensors received in several parts (buckets); a name received twice keeps its last bytes."""
        tensors: dict[str, TensorDigest] = {}
        for part in parts:
            tensors.update(part.tensors)
        return cls(tensors)

    def summary(self) -> str:
        """One short hex string for the whole set (logs, run records)."""
        h = hashlib.sha256()
        for name in sorted(self.tensors):
            d = self.tensors[name]
            h.update(f"{name}\0{d.dtype}\0{d.shape}\0{d.sha256}\n".encode())
        return h.hexdigest()[:16]

    def differences(self, other: "WeightsDigest") -> list[str]:
        """Each way ``other`` differs from this one, a line per tensor (sorted by name): missing, unexpected, or
        other dtype / shape / bytes."""
        out = []
        for name in sorted(set(self.tensors) | set(other.tensors)):
            mine, theirs = self.tensors.get(name), other.tensors.get(name)
            if theirs is None:
                out.append(f"{name}: not received")
            elif mine is None:
                out.append(f"{name}: received, not published")
            elif (mine.dtype, mine.shape) != (theirs.dtype, theirs.shape):
                out.append(f"{name}: {theirs.dtype} {list(theirs.shape)} instead of {mine.dtype} {list(mine.shape)}")
            elif mine.sha256 != theirs.sha256:
                out.append(f"{name}: other bytes")
        return out

    def to_json(self) -> str:
        return json.dumps({n: [d.dtype, list(d.shape), d.sha256] for n, d in self.tensors.items()})

    @classmethod
    def from_json(cls, text: str) -> "WeightsDigest":
        return cls({n: TensorDigest(dtype, tuple(shape), sha) for n, (dtype, shape, sha) in json.loads(text).items()})


def adapter_digest(folder: str) -> WeightsDigest:
    """The digest of a peft adapter folder's tensors (``adapter_model.safetensors``), as a sampler hands the folder
    to vLLM's LoRA loader (vLLM folds the scaling into its copies, so they are digested at the door)."""
    from safetensors.torch import load_file

    from grpo_core.lifecycle.model.adapter_files import ADAPTER_WEIGHTS

    return WeightsDigest.of(load_file(os.path.join(folder, ADAPTER_WEIGHTS)).items())


@dataclass(frozen=True)
class Receipt:
    """What one side holds: the policy version and the digest of its weights (``digest`` None: a sampler that has
    loaded nothing since it started, serving the model folder it was built from)."""
    version: int
    digest: WeightsDigest | None


def compare_receipts(published: Receipt, served: dict[int, Receipt]) -> dict[int, list[str]]:
    """Per sampler id, how what it serves differs from what the learner published (empty: nothing does). A
    sampler on another version, or with nothing loaded, differs by that alone."""
    out: dict[int, list[str]] = {}
    for sid, receipt in sorted(served.items()):
        problems = []
        if receipt.version != published.version:
            problems.append(f"serves version {receipt.version}, not {published.version}")
        if receipt.digest is None:
            problems.append("loaded no weights since it started")
        elif published.digest is not None:
            problems.extend(published.digest.differences(receipt.digest))
        out[sid] = problems
    return out


def describe(problems: dict[int, list[str]], total: int) -> str:
    """The samplers that differ, each with up to ``SHOWN`` of its differences, for an error message."""
    parts = []
    for sid, lines in sorted(problems.items()):
        if lines:
            more = f" (+{len(lines) - SHOWN} more)" if len(lines) > SHOWN else ""
            parts.append(f"sampler {sid}: " + "; ".join(lines[:SHOWN]) + more)
    return f"{' | '.join(parts)} (of {total} tensors published)"
