"""Which prompts an iteration samples, tokenised with the policy's chat template.

The order is a pure function of (seed, iteration, round): epoch-wise permutations of the train split, consumed
``prompts_per_iteration`` at a time. A resumed run therefore draws exactly the prompts an uninterrupted run would,
with no cursor to save.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from grpo_core.data.prompts import chat_messages
from grpo_core.data.readers import DataError, PromptSet

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
    def __init__(self, prompts: PromptSet, encoder: PromptTokenizer, *, batch_size: int, seed: int,
                 shuffle: bool = True, rounds_per_iteration: int = 1):
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

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            n = len(self.prompts.rows)
            self._perms[epoch] = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                                  else np.arange(n))
        return self._perms[epoch]

    def batch(self, iteration: int, round_: int = 0) -> list[dict[str, Any]]:
        """The prompts of (iteration, resampling round), tokenised."""
        n = len(self.prompts.rows)
        start = (iteration * self.rounds_per_iteration + round_) * self.batch_size
        out = []
        for pos in range(start, start + self.batch_size):
            idx = int(self._order(pos // n)[pos % n])
            if idx not in self._encoded:
                self._encoded[idx] = self.encoder.encode(self.prompts.rows[idx], self.prompts.source)
            out.append(self._encoded[idx])
        return out

    def all(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Every prompt in file order (evaluation)."""
        rows = self.prompts.rows[:limit] if limit else self.prompts.rows
        return [self.encoder.encode(r, self.prompts.source) for r in rows]
