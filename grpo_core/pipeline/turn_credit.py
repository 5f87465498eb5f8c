"""Turn-level credit in the score stage (``algo.turn_credit: step_groups``): each multi-turn episode's turns, the
state each was taken from, and the per-token advantage the learner trains on instead of the row's one
(``grpo_core.algo.turn_credit`` computes; this reads the scored rows and writes the column).

A turn is a run of the policy's tokens in ``response_mask`` (the environment's tokens between turns are 0); the state
a turn was taken from is every token before it, the prompt's included, so two episodes share a state exactly when
they made the same calls and got the same outputs so far.
"""
from __future__ import annotations

import pyarrow as pa
import torch

from grpo_core.algo.turn_credit import step_group_advantages, turn_returns
from grpo_core.data.schemas import RESPONSE_MASK, TOKEN_ADVANTAGE


def turn_spans(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s in a response mask: the policy's turns."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def with_turn_credit(table: pa.Table, group_size: int, weight: float, gamma: float) -> tuple[pa.Table, dict]:
    """``table`` (scored rows in groups of ``group_size``, with ``advantage`` and ``shaped_reward``) plus
    ``token_advantage``: every policy token of turn k gets its episode's advantage + ``weight`` x turn k's step
    advantage; the environment's tokens 0 (out of the loss anyway). Rows without a response mask are one turn."""
    responses = table.column("response_token_ids").to_pylist()
    prompts = table.column("prompt_token_ids").to_pylist()
    masks = table.column(RESPONSE_MASK).to_pylist() if RESPONSE_MASK in table.column_names else \
        [None] * table.num_rows
    spans = [turn_spans(m if m is not None else [1] * len(r)) for m, r in zip(masks, responses)]
    width = max((len(s) for s in spans), default=0)
    states: dict[tuple, int] = {}
    ids = torch.full((table.num_rows, width), -1, dtype=torch.long)
    for row, (prompt, response, turns) in enumerate(zip(prompts, responses, spans)):
        for k, (start, _) in enumerate(turns):
            ids[row, k] = states.setdefault((tuple(prompt), tuple(response[:start])), len(states))
    rewards = torch.tensor(table.column("shaped_reward").to_pylist(), dtype=torch.float64)
    returns = turn_returns(rewards, torch.tensor([len(s) for s in spans]), gamma)
    step, metrics = step_group_advantages(ids, returns, group_size)
    episode = table.column("advantage").to_pylist()
    tokens = []
    for row, (response, turns) in enumerate(zip(responses, spans)):
        values = [0.0] * len(response)
        for k, (start, end) in enumerate(turns):
            values[start:end] = [episode[row] + weight * float(step[row, k])] * (end - start)
        tokens.append(values)
    grouped = step[ids >= 0]
    metrics["step_adv_abs_mean"] = float(grouped.abs().mean()) if grouped.numel() else 0.0
    column = pa.array(tokens, pa.list_(pa.float32()))
    return table.append_column(pa.field(TOKEN_ADVANTAGE, column.type, nullable=False), column), metrics
