"""An Atropos scored group (one element of ``GET /batch``'s ``batch``) as rollout rows, or the reason it is refused.

Atropos's ``ScoredData`` carries, per sequence, the whole token sequence (``tokens``), ``masks`` (the token id where
the policy sampled it, -100 elsewhere: the prompt, an environment's turns), a score, and optionally the sampler's
logprobs (``inference_logprobs``, 1.0 on masked positions), per-token ``advantages``, ``ref_logprobs`` and free-form
``overrides``. A row here is the sequence split where the policy's first token is: ``prompt_token_ids`` before it,
``response_token_ids`` from it on, ``response_mask`` 1 on the policy's tokens and 0 on the environment's, ``reward``
the score. Every policy span must be an answer this run's endpoint sampled after exactly that prefix (the ledger):
the row takes that answer's policy version (the oldest over its spans) and its logprobs. What cannot be trained on
as it is, is refused with the sequence and the field: lengths that disagree, a sequence longer than the context the
trainer registered (``max_sequence_len``), a mask that is not the token or -100, no policy token, a score that is not
a finite number or is beyond ``max_abs_score`` (the endpoint's reward bound, ``MAX_ABS_REWARD``: refused, not
clipped), a group of another size, a token outside the vocabulary, tokens this run did not sample, sent logprobs that
are not finite numbers or disagree with the sampled ones, per-token advantages (this run computes GRPO's advantages
from the group's scores; a group that brings its own is refused, not silently recomputed), overrides nested deeper
than the endpoint's door reads JSON (``check_values``).
``ref_logprobs`` and ``messages`` are not used (the run computes its own reference and decodes the tokens);
``overrides`` and ``group_overrides`` are kept as JSON columns.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa

from grpo_core.data.schemas import RESPONSE_MASK, rollouts_table
from grpo_core.outside.endpoint.ledger import SampledLedger, SampledSpan
from grpo_core.outside.endpoint.requests import MAX_ABS_REWARD, RequestError, check_values, shown_value
from grpo_core.outside.source import GroupRefused
from grpo_core.pipeline.inbox import OUTSIDE_SAMPLER

MASKED = -100
LOGPROB_TOLERANCE = 1e-3  # sent inference_logprobs vs the sampled ones (JSON floats round-trip exactly; slack)


@dataclass(frozen=True)
class GroupLimits:
    group_size: int  # rollout.samples_per_prompt
    vocab_size: int  # the policy's embedding rows
    max_abs_score: float = MAX_ABS_REWARD  # |score| at most
    max_sequence_len: int | None = None  # tokens per sequence at most (the registration's max_token_len)


def _finite_number(value: Any) -> bool:
    """A JSON number a float can hold exactly enough: not a bool, a finite float, an int of at most 2**53."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= 2**53
    return isinstance(value, float) and math.isfinite(value)


def _int_list(value: Any, seq: int, name: str) -> list[int]:
    if not isinstance(value, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in value):
        raise GroupRefused(seq, name, "must be a list of integers")
    return value


def _per_sequence(group: dict, name: str, size: int) -> list | None:
    """An optional per-sequence field: None when absent (None, [] or all None, as atroposlib sends it)."""
    value = group.get(name)
    if value is None or value == [] or (isinstance(value, list) and all(v is None for v in value)):
        return None
    if not isinstance(value, list) or len(value) != size:
        raise GroupRefused(None, name, f"has {len(value) if isinstance(value, list) else type(value).__name__} "
                                       f"entries for {size} sequences")
    return value


def policy_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of the policy's tokens (mask != -100)."""
    spans, start = [], None
    for i, m in enumerate(mask + [MASKED]):
        if m != MASKED and start is None:
            start = i
        elif m == MASKED and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _sequence_row(seq: int, tokens: list[int], mask: list[int], score: Any, sent_logprobs: list | None,
                  limits: GroupLimits, ledger: SampledLedger) -> tuple[dict[str, Any], list[int], float]:
    if limits.max_sequence_len is not None and len(tokens) > limits.max_sequence_len:
        raise GroupRefused(seq, "tokens", f"has {len(tokens)} tokens; the trainer registered sequences of at most "
                                          f"{limits.max_sequence_len} (max_token_len)")
    if len(mask) != len(tokens):
        raise GroupRefused(seq, "masks", f"has {len(mask)} entries for {len(tokens)} tokens")
    bad = next((i for i, t in enumerate(tokens) if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise GroupRefused(seq, "tokens", f"token {tokens[bad]} at position {bad} is outside the policy's "
                                          f"vocabulary (0..{limits.vocab_size - 1})")
    bad = next((i for i, (t, m) in enumerate(zip(tokens, mask)) if m not in (MASKED, t)), None)
    if bad is not None:
        raise GroupRefused(seq, "masks", f"position {bad} is {mask[bad]}: a mask entry is the token ({tokens[bad]}) "
                                         f"or {MASKED}")
    whole = isinstance(score, int) and not isinstance(score, bool)  # any size: compared exactly below
    if not whole and not _finite_number(score):
        raise GroupRefused(seq, "scores", f"is {shown_value(score)}, not a finite number")
    if not -limits.max_abs_score <= score <= limits.max_abs_score:  # exact for any int: compared before float()
        raise GroupRefused(seq, "scores", f"is {shown_value(score)}, outside [-{limits.max_abs_score:g}, "
                                          f"{limits.max_abs_score:g}] (refused, not clipped)")
    spans = policy_spans(mask)
    if not spans:
        raise GroupRefused(seq, "masks", "marks no token as the policy's: nothing to train on")
    found: list[SampledSpan] = []
    for start, end in spans:
        span = ledger.find(tokens, start, end)
        if span is None:
            raise GroupRefused(seq, "tokens", f"positions {start}..{end - 1} are not an answer this run's policy "
                                              "endpoint sampled after exactly the tokens before them (re-tokenised "
                                              "or edited text, another model's, or sampled before the run restarted)")
        found.append(span)
    first = spans[0][0]
    logprobs = [0.0] * (len(tokens) - first)
    for (start, end), span in zip(spans, found):
        logprobs[start - first: end - first] = span.logprobs
    if sent_logprobs is not None:
        if not isinstance(sent_logprobs, list) or len(sent_logprobs) != len(tokens):
            count = len(sent_logprobs) if isinstance(sent_logprobs, list) else 0
            raise GroupRefused(seq, "inference_logprobs", f"has {count} entries for {len(tokens)} tokens")
        for start, end in spans:
            for i in range(start, end):
                sent = sent_logprobs[i]
                if not _finite_number(sent) or abs(sent - logprobs[i - first]) > LOGPROB_TOLERANCE:
                    raise GroupRefused(seq, "inference_logprobs",
                                       f"position {i} is {shown_value(sent)}; the endpoint sampled that token with "
                                       f"logprob {logprobs[i - first]:.6f}")
    finish = found[-1].finish_reason
    row = {"prompt_id": -1, "sample_idx": seq, "prompt_token_ids": tokens[:first],
           "response_token_ids": tokens[first:], "sampler_logprobs": logprobs, "finish_reason": finish,
           "truncated": finish == "length", "response_length": len(tokens) - first,
           "policy_version": min(s.version for s in found), "sampler_id": OUTSIDE_SAMPLER}
    return row, [0 if m == MASKED else 1 for m in mask[first:]], float(score)


def group_rows(group: Any, limits: GroupLimits, ledger: SampledLedger,
               decode: Callable[[list[int]], str]) -> pa.Table:
    """The group's G rows (group_id 0, sample_idx 0..G-1, iteration 0: the inbox renumbers them when taken), with
    ``response_mask``, ``reward``, ``atropos_overrides`` and ``atropos_group_overrides``; raises GroupRefused."""
    if not isinstance(group, dict):
        raise GroupRefused(None, None, f"is a {type(group).__name__}, not a ScoredData object")
    try:  # no field of ScoredData is deep; a deep one could not even be written back as the refusal's JSON
        check_values(group, leaves=False)
    except RequestError as exc:
        raise GroupRefused(None, exc.param, str(exc)) from None
    tokens, masks, scores = group.get("tokens"), group.get("masks"), group.get("scores")
    for name, value in (("tokens", tokens), ("masks", masks), ("scores", scores)):
        if not isinstance(value, list):
            raise GroupRefused(None, name, "is missing or not a list")
    if len(tokens) != limits.group_size:
        raise GroupRefused(None, "tokens", f"the group has {len(tokens)} sequences; this run compares groups of "
                                           f"{limits.group_size} (rollout.samples_per_prompt = the environment's "
                                           "group_size)")
    for name, value in (("masks", masks), ("scores", scores)):
        if len(value) != len(tokens):
            raise GroupRefused(None, name, f"has {len(value)} entries for {len(tokens)} sequences")
    if _per_sequence(group, "advantages", len(tokens)) is not None:
        raise GroupRefused(None, "advantages", "per-token advantages are not taken: this run computes GRPO's "
                                               "advantages from the group's scores (send scores only)")
    sent = _per_sequence(group, "inference_logprobs", len(tokens))
    overrides = _per_sequence(group, "overrides", len(tokens))
    for name in ("overrides", "group_overrides"):
        try:
            check_values(group.get(name), root=name)
        except RequestError as exc:
            raise GroupRefused(None, name, str(exc)) from None
    rows, response_masks, rewards = [], [], []
    for seq in range(len(tokens)):
        row, mask, reward = _sequence_row(seq, _int_list(tokens[seq], seq, "tokens"),
                                          _int_list(masks[seq], seq, "masks"), scores[seq],
                                          None if sent is None else sent[seq], limits, ledger)
        row.update(iteration=0, group_id=0, response_text=decode(row["response_token_ids"]))
        rows.append(row)
        response_masks.append(mask)
        rewards.append(reward)
    table = rollouts_table(rows, [])
    extra = {RESPONSE_MASK: pa.array(response_masks, pa.list_(pa.int8())),
             "reward": pa.array(rewards, pa.float64()),
             "atropos_overrides": pa.array([json.dumps(o) for o in overrides] if overrides else [None] * len(rows),
                                           pa.string()),
             "atropos_group_overrides": pa.array([json.dumps(group.get("group_overrides"))] * len(rows), pa.string())}
    for name, values in extra.items():
        table = table.append_column(name, values)
    return table
