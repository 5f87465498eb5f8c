"""Which prompts an iteration samples, tokenised with the policy's chat template.

The order is a pure function of (seed, iteration, round): epoch-wise permutations of the train split, consumed
``prompts_per_iteration`` at a time. A resumed run therefore draws exactly the prompts an uninterrupted run would,
with no cursor to save. With ``data.sampler: difficulty_pool`` the same order is walked by a ``DifficultyPool``
that passes over prompts recently all right or all wrong; its state (a cursor) is in every checkpoint.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from grpo_core.data.prompts import chat_messages
from grpo_core.data.readers import DataError, PromptSet
from grpo_core.pipeline.difficulty_pool import DifficultyPool, GroupOutcome

# Columns that travel with each rollout row besides the tokens: all but the id (a fixed column). The prompt is carried
# as tokens, as the rendered text (``prompt_text``) and as the dataset's own ``messages`` (what model rewards score,
# without the run's system prompt or worked examples).
_NOT_CARRIED = ("prompt_id",)


class PromptTokenizer:
    """Chat template + tokenisation, with the length check that names the offending row."""

    def __init__(self, tokenizer, reward_type: str, system_prompt: str | None, max_prompt_tokens: int,
                 few_shot: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.reward_type = reward_type
        self.system_prompt = system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        self.few_shot = few_shot or []

    def encode(self, row: dict[str, Any], source: str) -> dict[str, Any]:
        messages = chat_messages(row["messages"], self.reward_type, self.system_prompt, self.few_shot)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > self.max_prompt_tokens:
            raise DataError(f"{source}: row {row['prompt_id']}: field 'messages': the prompt has {len(ids)} tokens, "
                            f"more than data.max_prompt_tokens={self.max_prompt_tokens}")
        columns = {k: v for k, v in row.items() if k not in _NOT_CARRIED}
        columns["prompt_text"] = text
        return {"prompt_id": int(row["prompt_id"]), "prompt_token_ids": ids, "columns": columns}


class PromptStream:
    """The train prompts each iteration samples. ``pool_skips`` (easy, hard) turns the difficulty pool on; it reads
    an iteration's results through ``outcomes``."""

    def __init__(self, prompts: PromptSet, encoder: PromptTokenizer, *, batch_size: int, seed: int,
                 shuffle: bool = True, rounds_per_iteration: int = 1, pool_skips: tuple[int, int] | None = None,
                 outcomes: Callable[[int], list[GroupOutcome]] | None = None):
        if not prompts.rows:
            raise DataError(f"{prompts.source}: no usable prompts")
        self.prompts = prompts
        self.encoder = encoder
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.rounds_per_iteration = rounds_per_iteration
        self._encoded: dict[int, dict[str, Any]] = {}
        self._perms: dict[int, np.ndarray] = {}
        self.pool: DifficultyPool | None = None
        if pool_skips is not None:
            if outcomes is None:
                raise ValueError("the difficulty pool needs the iterations' outcomes")
            self.pool = DifficultyPool(len(prompts.rows), self._order, batch_size * rounds_per_iteration,
                                       [int(r["prompt_id"]) for r in prompts.rows], outcomes, *pool_skips)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            n = len(self.prompts.rows)
            self._perms[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                                  else np.arange(n))
        return self._perms[epoch]

    def indices(self, iteration: int, round_: int = 0) -> list[int]:
        """Positions in the train set of the prompts of (iteration, resampling round)."""
        if self.pool is not None:
            return self.pool.selection(iteration)[round_ * self.batch_size: (round_ + 1) * self.batch_size]
        n = len(self.prompts.rows)
        start = (iteration * self.rounds_per_iteration + round_) * self.batch_size
        return [int(self._order(pos // n)[pos % n]) for pos in range(start, start + self.batch_size)]

    def batch(self, iteration: int, round_: int = 0) -> list[dict[str, Any]]:
        """The prompts of (iteration, resampling round), tokenised."""
        out = []
        for idx in self.indices(iteration, round_):
            if idx not in self._encoded:
                self._encoded[idx] = self.encoder.encode(self.prompts.rows[idx], self.prompts.source)
            out.append(self._encoded[idx])
        return out

    def all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every prompt in file order (evaluation)."""
        rows = self.prompts.rows[:limit] if limit else self.prompts.rows
        return [self.encoder.encode(r, self.prompts.source) for r in rows]
