"""A conversation as SFT trains on it: its tokens as the policy's chat template writes them, with the loss on the
assistant turns only.

How the assistant turns are found: the template renders each prefix of the conversation, and a turn's tokens are
those between the prefix before it (with the assistant header, ``add_generation_prompt``) and the prefix ending
with it. That works for any template whose rendering of a prefix is the start of the rendering of the whole (the
ChatML family, Llama 3's, SmolLM2's), without ``{% generation %}`` markers in the template (TRL's
``assistant_only_loss`` needs them). A template that renders a turn differently once later turns follow (Qwen3's
drops earlier turns' reasoning) fails that check, and the row's error says so.

A row is laid out as the rollout rows of multi-turn episodes are: the prompt (everything before the first
assistant turn, up to its header) and the response (the rest), with a response mask that is 1 on the tokens the
model is taught to write (each assistant turn through its end-of-turn token) and 0 on the others' turns and on what
the template writes between turns; the learner reads such rows as it reads episodes.
"""
from __future__ import annotations

from typing import Any

from grpo_core.data.prompts import chat_messages
from grpo_core.data.readers import DataError


class ConversationTokenizer:
    """Chat rows (``messages`` with assistant turns) -> prompt and response tokens with the assistant-turn mask.

    ``end_ids``: the end-of-turn tokens the sampler stops at; an assistant turn is trained through the last of
    them in its span (what the template writes after it, e.g. a newline, is not the model's to write)."""

    def __init__(self, tokenizer, reward_type: str, system_prompt: str | None, max_tokens: int,
                 end_ids: set[int]):
        self.tokenizer = tokenizer
        self.reward_type = reward_type
        self.system_prompt = system_prompt
        self.max_tokens = max_tokens
        self.end_ids = set(end_ids)

    def _ids(self, messages: list[dict], generation_prompt: bool = False) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode(self, row: dict[str, Any], source: str) -> dict[str, Any]:
        where = f"{source}: row {row['prompt_id']}: field 'messages'"
        messages = chat_messages(row["messages"], self.reward_type, self.system_prompt)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            raise DataError(f"{where}: no assistant turn to train on")
        full = self._ids(messages)
        if len(full) > self.max_tokens:
            raise DataError(f"{where}: the conversation has {len(full)} tokens, more than sft.max_tokens="
                            f"{self.max_tokens}")
        prompt = self._starts(messages[:turns[0]], full, where, turns[0], generation_prompt=True)
        mask = [0] * (len(full) - len(prompt))
        for i in turns:
            start = len(prompt) if i == turns[0] else \
                len(self._starts(messages[:i], full, where, i, generation_prompt=True))
            end = len(self._starts(messages[:i + 1], full, where, i))
            span = full[start:end]
            if not span:
                raise DataError(f"{where}[{i}]: the assistant turn has no tokens of its own in the chat template's "
                                f"rendering")
            last_end = max((k for k, t in enumerate(span) if t in self.end_ids), default=len(span) - 1)
            for k in range(start, start + last_end + 1):
                mask[k - len(prompt)] = 1
        if not any(mask):
            raise DataError(f"{where}: the assistant turns hold no token to train on")
        columns = {k: v for k, v in row.items() if k != "prompt_id"}
        columns["prompt_text"] = self.tokenizer.decode(prompt)
        return {"prompt_id": int(row["prompt_id"]), "prompt_token_ids": prompt, "response_token_ids": full[len(prompt):],
                "response_mask": mask, "columns": columns}

    def _starts(self, messages: list[dict], full: list[int], where: str, turn: int,
                generation_prompt: bool = False) -> list[int]:
        """The tokens of a prefix of the conversation, checked to be the start of the whole conversation's."""
        ids = self._ids(messages, generation_prompt)
        if full[:len(ids)] != ids:
            raise DataError(
                f"{where}[{turn}]: the chat template renders the conversation before this assistant turn differently "
                f"once later turns follow, so the turn's tokens cannot be told apart (a template that rewrites "
                f"earlier turns, e.g. one that drops their reasoning, is not supported for SFT)")
        return ids


def end_of_turn_ids(model_path: str, tokenizer) -> set[int]:
    """The tokens that end a model's turn: the tokenizer's EOS and the generation config's (what vLLM stops at)."""
    from transformers import GenerationConfig

    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        eos = None
    ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if not ids:
        raise DataError(f"{model_path}: neither the tokenizer nor generation_config.json names an end-of-turn token")
    return ids
