"""What the policy endpoint sampled, by token sequence: how a group an outside environment hands back (Atropos's
``ScoredData``: token ids and a mask, no versions) is tied to this run's samples.

An environment returns tokens, not the policy version that sampled them, and it could return tokens the policy never
sampled (a re-tokenised text, an edited answer, another model's). For each span of a sequence that the environment
marks as the policy's, the ledger says whether this endpoint sampled exactly those tokens after exactly that prefix,
with which version and which logprobs; the run trains only on spans it finds here, with its own logprobs. The
ledger lives in the driver's memory, bounded (oldest forgotten first): a span sampled before a crash, or longer ago
than ``max_entries`` samples, is not found, and its group is refused with that reason rather than trained on.
"""
from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class SampledSpan:
    """One answer the endpoint gave: where it starts in its sequence, what sampled it and its logprobs."""
    prompt_len: int
    version: int
    logprobs: array  # float32, as the rollout rows keep them
    finish_reason: str


def _key(ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


class SampledLedger:
    """``max_entries`` answers: an Atropos trainer needs the few iterations' worth that its staleness bound admits
    (groups x G per iteration); 50,000 answers of 64 tokens hold about 15 MB."""

    def __init__(self, max_entries: int = 50_000):
        self.max_entries = max_entries
        self._spans: OrderedDict[bytes, SampledSpan] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, prompt_ids: list[int], token_ids: list[int], logprobs: list[float], finish_reason: str,
               version: int) -> None:
        span = SampledSpan(len(prompt_ids), version, array("f", logprobs), finish_reason)
        key = _key(list(prompt_ids) + list(token_ids))
        with self._lock:
            self._spans[key] = span
            self._spans.move_to_end(key)
            while len(self._spans) > self.max_entries:
                self._spans.popitem(last=False)

    def find(self, sequence: list[int], start: int, end: int) -> SampledSpan | None:
        """The answer whose tokens are ``sequence[start:end]``, sampled after exactly ``sequence[:start]``."""
        with self._lock:
            span = self._spans.get(_key(sequence[:end]))
        return span if span is not None and span.prompt_len == start else None

    def __len__(self) -> int:
        return len(self._spans)
