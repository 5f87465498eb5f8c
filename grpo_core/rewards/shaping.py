"""Cheap shaping rewards computed in the scorer's own process: format, cosine length scaling, repetition.

Why these: they are the common companions of the accuracy reward in R1-style training.
- ``format``: 1.0 when the completion is ``<think>...</think>`` followed by ``<answer>...</answer>`` (each tag exactly
  once, in that order, nothing but whitespace around), else 0.0 (open-r1's format reward, tolerant of whitespace).
- ``cosine``: "Demystifying Long Chain-of-Thought Reasoning in LLMs" (Yeo et al. 2025) as in open-r1. With
  ``progress = min(length / max_len, 1)`` and ``c = cos(pi * progress)``, a correct answer gets
  ``min_correct + 0.5 (max_correct - min_correct)(1 + c)`` (shorter is better: max_correct at length 0), a wrong one
  ``max_wrong + 0.5 (min_wrong - max_wrong)(1 + c)`` (longer is penalised less: min_wrong at length 0, max_wrong at
  max_len). Progress is clipped at 1 (open-r1 lets the cosine turn back up beyond max_len).
- ``repetition``: open-r1's n-gram penalty: ``(1 - distinct n-grams / n-grams) * max_penalty`` over lower-cased
  whitespace words; 0.0 for text shorter than n words.

DAPO's soft overlong punishment is not a reward here: it is ``algo.soft_overlong`` (``grpo_core.algo.filters``), one
tensor function applied to the group rewards, sized by ``algo.soft_overlong_cache_length``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)


@dataclass(frozen=True)
class CosineParams:
    min_value_wrong: float = -1.0
    max_value_wrong: float = -0.5
    min_value_correct: float = 0.5
    max_value_correct: float = 1.0
    max_len: int = 1000

    def __post_init__(self) -> None:
        if self.max_len <= 0:
            raise ValueError(f"cosine max_len must be positive, got {self.max_len}")


@dataclass(frozen=True)
class RepetitionParams:
    ngram_size: int = 3
    max_penalty: float = -1.0

    def __post_init__(self) -> None:
        if self.ngram_size < 1:
            raise ValueError(f"repetition ngram_size must be >= 1, got {self.ngram_size}")
        if self.max_penalty > 0:
            raise ValueError(f"repetition max_penalty must be <= 0 (it is a penalty), got {self.max_penalty}")


def format_reward(completion: str) -> float:
    """1.0 for exactly one ``<think>...</think><answer>...</answer>`` structure, else 0.0."""
    if any(completion.count(tag) != 1 for tag in _TAGS):
        return 0.0
    return 1.0 if _FORMAT.fullmatch(completion) else 0.0


def cosine_reward(is_correct: bool, length: int, params: CosineParams = CosineParams()) -> float:
    """Length-scaled correctness (see the module docstring)."""
    progress = min(max(length, 0) / params.max_len, 1.0)
    cosine = math.cos(progress * math.pi)
    if is_correct:
        low, high = params.min_value_correct, params.max_value_correct
    else:
        low, high = params.max_value_wrong, params.min_value_wrong
    return low + 0.5 * (high - low) * (1.0 + cosine)


def repetition_penalty(completion: str, params: RepetitionParams = RepetitionParams()) -> float:
    """Share of repeated word n-grams times ``max_penalty`` (<= 0)."""
    words = completion.lower().split()
    if len(words) < params.ngram_size:
        return 0.0
    ngrams = list(zip(*(words[offset:] for offset in range(params.ngram_size))))
    return (1.0 - len(set(ngrams)) / len(ngrams)) * params.max_penalty
