"""Packing scored rollouts into padded tensors for the learner.

Every per-token tensor lives in "shifted" space: column j holds the prediction of token j+1 from the logits at
position j, so logprobs, old logprobs, sampler logprobs and the response mask line up without re-indexing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    input_ids: torch.Tensor        # [B, L] prompt + response, right-padded with pad_id
    attention_mask: torch.Tensor   # [B, L]
    response_mask: torch.Tensor    # [B, L-1] 1.0 where column j predicts a response token
    sampler_logprobs: torch.Tensor  # [B, L-1] the sampler's logprob of that token (0 elsewhere)
    advantages: torch.Tensor       # [B]
    row_mask: torch.Tensor         # [B] 1.0 for rows that count in the loss (kept, not filtered)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: slice | torch.Tensor) -> "TokenBatch":
        return TokenBatch(*(t[idx] for t in (self.input_ids, self.attention_mask, self.response_mask,
                                              self.sampler_logprobs, self.advantages, self.row_mask)))

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, L-1]: response tokens of rows that count."""
        return self.response_mask * self.row_mask[:, None]


def pack_batch(prompts: list[list[int]], responses: list[list[int]], sampler_logprobs: list[list[float]] | None,
               advantages: list[float], row_mask: list[bool], pad_id: int) -> TokenBatch:
    """Right-pad ``prompt + response`` per row. Rows keep their order."""
    n = len(prompts)
    if not (len(responses) == len(advantages) == len(row_mask) == n):
        raise ValueError("pack_batch: prompts, responses, advantages and row_mask must have the same length")
    length = max(len(p) + len(r) for p, r in zip(prompts, responses))
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    resp_mask = torch.zeros((n, length - 1), dtype=torch.float32)
    samp = torch.zeros((n, length - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        seq = list(p) + list(r)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        start, end = len(p) - 1, len(p) - 1 + len(r)  # shifted columns predicting response tokens
        resp_mask[i, start:end] = 1.0
        if sampler_logprobs is not None:
            lp = sampler_logprobs[i]
            if len(lp) != len(r):
                raise ValueError(f"row {i}: {len(lp)} sampler logprobs for {len(r)} response tokens")
            samp[i, start:end] = torch.tensor(lp, dtype=torch.float32)
    return TokenBatch(input_ids, attention, resp_mask, samp, torch.tensor(advantages, dtype=torch.float32),
                      torch.tensor([1.0 if k else 0.0 for k in row_mask], dtype=torch.float32))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [B, L, V], input_ids [B, L] -> [B, L-1] log p(input_ids[:, j+1] | prefix), in float32.

    Computed as gathered logit minus logsumexp so no [B, L, V] log-softmax tensor is kept for backward."""
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
