"""The score stage's part in on-policy distillation: the teacher's logprob of every sampled token, and from it the
per-token advantage the learner trains on (``grpo_core.algo.distill.distillation_advantages``).

Two columns join the scored rows, one value per response token like ``sampler_logprobs``: ``teacher_logprobs`` and
``token_advantage`` (0 on tokens an environment wrote). The row's ``advantage`` stays the reward's (GRPO's), kept
for the record and mixed in by ``distill.reward_weight``. The student's logprobs are the sampler's, recorded when it
sampled: the policy the tokens came from. With ``distill.top_k`` = K two more columns, K values per response token:
``teacher_top_ids`` and ``teacher_top_logprobs`` (the learner's top-K forward KL term reads them).
"""
from __future__ import annotations

import pyarrow as pa
import torch

from grpo_core.algo.distill import distillation_advantages
from grpo_core.data.schemas import (
    RESPONSE_MASK, TEACHER_LOGPROBS, TEACHER_TOP_IDS, TEACHER_TOP_LOGPROBS, TOKEN_ADVANTAGE)
from grpo_core.rewards.scorer import prompt_messages
from grpo_core.rewards.teacher import Teacher, TeacherInput


def teacher_inputs(table: pa.Table, prompt_key: str) -> list[TeacherInput]:
    """What the teacher sees of each row: the student's prompt tokens, the dataset's messages and the response."""
    prompts = table.column("prompt_token_ids").to_pylist()
    responses = table.column("response_token_ids").to_pylist()
    raw = table.column(prompt_key).to_pylist() if prompt_key in table.column_names else [None] * table.num_rows
    # rows from outside sources may carry no dataset prompt: () (only a teacher with its own context reads it)
    return [TeacherInput(tuple(p), () if m is None else prompt_messages(m, prompt_key, "the distillation teacher"),
                         tuple(r)) for p, m, r in zip(prompts, raw, responses)]


def _padded(rows: list[list[float]], width: int, dtype=torch.float64) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out


def with_teacher_signal(table: pa.Table, teacher: Teacher, *, reward_weight: float = 0.0,
                        prompt_key: str = "messages") -> tuple[pa.Table, dict[str, float]]:
    """``table`` (scored rows: ``advantage`` set) with ``teacher_logprobs`` and ``token_advantage`` appended (and the
    teacher's top K when it gave them), and the metrics ``reverse_kl``, ``teacher_logprob_mean`` and
    ``teacher_agreement`` over the policy's sampled tokens (with the top K, ``teacher_top_k_mass``: the teacher's
    probability mass in its top K, the share of its distribution the KL term sees)."""
    if table.num_rows == 0:
        return table, {}
    inputs = teacher_inputs(table, prompt_key)
    scores = teacher.score(inputs)
    if len(scores) != len(inputs):
        raise RuntimeError(f"the teacher gave {len(scores)} answers for {len(inputs)} rows")
    lengths = [len(r.response_token_ids) for r in inputs]
    top_k = any(s.top_k_ids for s in scores)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        if len(s.logprobs) != n:
            raise RuntimeError(f"row {i}: the teacher gave {len(s.logprobs)} logprobs for {n} response tokens")
        if top_k and not (len(s.top_k_ids) == len(s.top_k_logprobs) == n):
            raise RuntimeError(f"row {i}: the teacher gave {len(s.top_k_ids)} top-k id lists and "
                               f"{len(s.top_k_logprobs)} logprob lists for {n} response tokens")
    width = max(max(lengths), 1)
    student = _padded(table.column("sampler_logprobs").to_pylist(), width)
    teacher_lp = _padded([list(s.logprobs) for s in scores], width)
    sampled = _padded([list(r.response_token_ids) for r in inputs], width, torch.long)
    top = _padded([list(s.top_ids) for s in scores], width, torch.long)
    lengths_t = torch.tensor(lengths)
    mask = (torch.arange(width)[None, :] < lengths_t[:, None]).double()
    if RESPONSE_MASK in table.column_names:  # multi-turn: what an environment wrote is not the student's
        mask = mask * _padded(table.column(RESPONSE_MASK).to_pylist(), width)
    reward_adv = torch.tensor(table.column("advantage").to_pylist(), dtype=torch.float64)
    advantages, metrics = distillation_advantages(student, teacher_lp, mask, reward_advantages=reward_adv,
                                                  reward_weight=reward_weight, teacher_top_ids=top,
                                                  sampled_ids=sampled)
    out = table.append_column(pa.field(TEACHER_LOGPROBS, pa.list_(pa.float32()), nullable=False),
                              pa.array([list(s.logprobs) for s in scores], pa.list_(pa.float32())))
    out = out.append_column(pa.field(TOKEN_ADVANTAGE, pa.list_(pa.float32()), nullable=False),
                            pa.array([advantages[i, :n].tolist() for i, n in enumerate(lengths)],
                                     pa.list_(pa.float32())))
    if top_k:
        ids_type, lp_type = pa.list_(pa.list_(pa.int32())), pa.list_(pa.list_(pa.float32()))
        out = out.append_column(pa.field(TEACHER_TOP_IDS, ids_type, nullable=False),
                                pa.array([[list(t) for t in s.top_k_ids] for s in scores], ids_type))
        out = out.append_column(pa.field(TEACHER_TOP_LOGPROBS, lp_type, nullable=False),
                                pa.array([[list(t) for t in s.top_k_logprobs] for s in scores], lp_type))
        mass = _padded([torch.tensor(s.top_k_logprobs, dtype=torch.float64).exp().sum(-1).tolist()
                        if s.top_k_logprobs else [] for s in scores], width)
        metrics["teacher_top_k_mass"] = float((mass * mask).sum() / mask.sum().clamp(min=1))
    return out, metrics
