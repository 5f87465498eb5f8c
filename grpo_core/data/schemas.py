"""Arrow schemas of the stage outputs (see DESIGN.md, "One iteration, as data").

The fixed columns are typed here; dataset columns (gt_answer, test_cases, ...) follow them with inferred types.
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa

ROLLOUT_FIELDS = [
    pa.field("iteration", pa.int64(), nullable=False),
    pa.field("prompt_id", pa.int64(), nullable=False),      # row index of the prompt in its dataset file
    pa.field("group_id", pa.int64(), nullable=False),       # index of the group (prompt) within the iteration
    pa.field("sample_idx", pa.int32(), nullable=False),     # 0..G-1 within the group
    pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("response_token_ids", pa.list_(pa.int32()), nullable=False),
    pa.field("sampler_logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("response_text", pa.string(), nullable=False),
    pa.field("finish_reason", pa.string(), nullable=False),
    pa.field("truncated", pa.bool_(), nullable=False),      # stopped by max_new_tokens, not by EOS
    pa.field("response_length", pa.int32(), nullable=False),
    pa.field("policy_version", pa.int64(), nullable=False),  # learner step of the weights that sampled it
    pa.field("sampler_id", pa.int32(), nullable=False),      # which sampler engine drew it
]
ROLLOUT_SCHEMA = pa.schema(ROLLOUT_FIELDS)

SCORE_FIELDS = [
    pa.field("reward", pa.float64(), nullable=True),         # null when the row could not be scored
    pa.field("reward_error", pa.string(), nullable=True),
    pa.field("shaped_reward", pa.float64(), nullable=False),  # what advantages were computed from (see scoring)
    pa.field("advantage", pa.float32(), nullable=False),
    pa.field("kept", pa.bool_(), nullable=False),             # counts in the loss (not filtered)
]


# On-policy distillation (``distill`` in the config) adds two columns to the scored rows, one value per response
# token: the teacher's logprob of it and the per-token advantage the learner then trains on instead of ``advantage``
# (``grpo_core.pipeline.distillation``).
TEACHER_LOGPROBS = "teacher_logprobs"
TOKEN_ADVANTAGE = "token_advantage"
# With distill.top_k = K, two more, K values per response token (most likely first): the teacher's K most likely
# tokens at that position and their logprobs (the learner's top-K forward KL term).
TEACHER_TOP_IDS = "teacher_top_ids"
TEACHER_TOP_LOGPROBS = "teacher_top_logprobs"


# Multi-turn episodes (``env`` in the config) add these columns after the fixed ones. ``response_token_ids`` then
# holds every token after the prompt, the environment's included; ``response_mask`` says which the policy sampled
# (1) and which an environment wrote (0; their ``sampler_logprobs`` are 0.0). ``response_text`` is the last assistant
# turn (what the scorer scores); ``episode_turns`` the whole episode as JSON (each turn's role, token span, text and
# finish reason, and the tool calls with their inputs, outputs and errors).
RESPONSE_MASK = "response_mask"
EPISODE_FIELDS = [
    pa.field(RESPONSE_MASK, pa.list_(pa.int8()), nullable=False),
    pa.field("num_turns", pa.int32(), nullable=False),         # assistant turns
    pa.field("tool_calls", pa.int32(), nullable=False),
    pa.field("tool_errors", pa.int32(), nullable=False),       # calls that failed, timed out or printed too much
    pa.field("episode_end", pa.string(), nullable=False),      # answered, max_turns, length, budget, env_error, ...
    pa.field("episode_error", pa.string(), nullable=True),     # what the environment raised (env_error/env_timeout)
    pa.field("env_reward", pa.float64(), nullable=True),       # the environment's own reward, if it gave one
    pa.field("episode_turns", pa.string(), nullable=False),
]


def episode_columns(table: pa.Table, groups: list[list[Any]]) -> pa.Table:
    """``table`` (rows of ``groups``' episodes, in order) with the episode columns inserted after the fixed ones."""
    episodes = [e for group in groups for e in group]
    if len(episodes) != table.num_rows:
        raise ValueError(f"{len(episodes)} episodes for {table.num_rows} rollout rows")
    values = {
        RESPONSE_MASK: [e.mask for e in episodes],
        "num_turns": [e.num_turns for e in episodes],
        "tool_calls": [len(e.tool_calls) for e in episodes],
        "tool_errors": [sum(c.error is not None for c in e.tool_calls) for e in episodes],
        "episode_end": [e.end or "" for e in episodes],
        "episode_error": [e.error for e in episodes],
        "env_reward": [e.reward for e in episodes],
        "episode_turns": [e.turns_json() for e in episodes],
    }
    for f in EPISODE_FIELDS:
        if f.name in table.column_names:
            raise ValueError(f"dataset column {f.name!r} collides with an episode column; rename it in the data")
    at = len(ROLLOUT_FIELDS)
    for offset, f in enumerate(EPISODE_FIELDS):
        table = table.add_column(at + offset, f, pa.array(values[f.name], type=f.type))
    return table


def rollouts_table(rows: list[dict[str, Any]], dataset_columns: list[dict[str, Any]]) -> pa.Table:
    """Typed fixed columns, then the dataset columns of each row's prompt (prefixed names never collide)."""
    return _with_dataset_columns(pa.Table.from_pylist(rows, schema=ROLLOUT_SCHEMA), dataset_columns, "a rollout")


def _with_dataset_columns(fixed: pa.Table, dataset_columns: list[dict[str, Any]], what: str) -> pa.Table:
    """``fixed`` with each row's dataset columns appended after its own (a name of its own is refused)."""
    if not dataset_columns or not dataset_columns[0]:
        return fixed
    extra = pa.Table.from_pylist(dataset_columns)
    for name in extra.column_names:
        if name in fixed.schema.names:
            raise ValueError(f"dataset column {name!r} collides with {what} column; rename it in the data")
        fixed = fixed.append_column(name, extra.column(name))
    return fixed


def sample_rows(iteration: int, prompts: list[dict[str, Any]], groups: list[list[Any]], group_offset: int,
                version: int | None, sampler_id: int | None) -> pa.Table:
    """Rollout rows of sampled responses (``groups[i]``: the samples of ``prompts[i]``, each with ``token_ids``,
    ``logprobs``, ``text``, ``finish_reason``), then each prompt's dataset columns; grouped, in sample order."""
    rows, columns = [], []
    for gi, (prompt, samples) in enumerate(zip(prompts, groups)):
        for si, s in enumerate(samples):
            rows.append({
                "iteration": iteration, "prompt_id": prompt["prompt_id"], "group_id": group_offset + gi,
                "sample_idx": si, "prompt_token_ids": prompt["prompt_token_ids"],
                "response_token_ids": s.token_ids, "sampler_logprobs": s.logprobs, "response_text": s.text,
                "finish_reason": s.finish_reason, "truncated": s.finish_reason == "length",
                "response_length": len(s.token_ids), "policy_version": version, "sampler_id": sampler_id})
            columns.append(prompt.get("columns", {}))
    return rollouts_table(rows, columns)


# An SFT run's batch (``scored.parquet``, nothing sampled): the rollout and score columns with the conversation as
# prompt + response, its assistant turns in ``response_mask``; ``sampler_logprobs``, ``reward`` and the text of the
# response are null (no sampler, no reward), ``advantage`` is 1 (the learner's objective is the likelihood).
CONVERSATION_SCHEMA = pa.schema(
    [f.with_nullable(True) if f.name in ("sampler_logprobs", "response_text") else f
     for f in ROLLOUT_FIELDS + SCORE_FIELDS] + [pa.field(RESPONSE_MASK, pa.list_(pa.int8()), nullable=False)])


def conversation_rows(iteration: int, conversations: list[dict[str, Any]], version: int) -> pa.Table:
    """An SFT batch (``CONVERSATION_SCHEMA``, then each conversation's dataset columns) from conversations encoded
    by ``grpo_core.data.chat.ConversationTokenizer``, one group each, in order."""
    rows = [{"iteration": iteration, "prompt_id": c["prompt_id"], "group_id": i, "sample_idx": 0,
             "prompt_token_ids": c["prompt_token_ids"], "response_token_ids": c["response_token_ids"],
             "sampler_logprobs": None, "response_text": None, "finish_reason": "data", "truncated": False,
             "response_length": len(c["response_token_ids"]), "policy_version": version, "sampler_id": 0,
             "reward": None, "reward_error": None, "shaped_reward": 0.0, "advantage": 1.0, "kept": True,
             RESPONSE_MASK: c["response_mask"]} for i, c in enumerate(conversations)]
    return _with_dataset_columns(pa.Table.from_pylist(rows, schema=CONVERSATION_SCHEMA),
                                 [c.get("columns", {}) for c in conversations], "a batch")


def check_schema(table: pa.Table, fields: list[pa.Field], what: str) -> None:
    """Raise naming the first missing or mistyped column."""
    for f in fields:
        if f.name not in table.column_names:
            raise ValueError(f"{what}: column {f.name!r} is missing")
        if table.schema.field(f.name).type != f.type:
            raise ValueError(f"{what}: column {f.name!r} has type {table.schema.field(f.name).type}, "
                             f"expected {f.type}")
