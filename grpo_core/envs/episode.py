"""One multi-turn episode as data, and the chat-template rendering of environment messages into token ids.

Token in / token out: the sequence of an episode is the prompt's ids, then each assistant turn's sampled ids exactly as
the sampler returned them, then each environment answer rendered by the chat template as a continuation. Nothing is
decoded and encoded again, so the sampler's logprobs, the learner's logprobs and the loss all see the sampled tokens.
The environment's tokens are in the sequence (the policy conditions on them) but masked out of the loss.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_core.envs.base import ToolCall

# why an episode ended (``episode_end``)
ANSWERED, MAX_TURNS, LENGTH, BUDGET, ENV_ERROR, ENV_TIMEOUT = (
    "answered", "max_turns", "length", "budget", "env_error", "env_timeout")
TRUNCATED_ENDS = (MAX_TURNS, LENGTH, BUDGET)  # the episode was cut before the policy answered


@dataclass
class TurnRecord:
    """A span of the episode's response tokens: an assistant turn (policy tokens) or an environment answer."""

    role: str               # "assistant", or the environment's ("tool", "user", ...) for its messages
    start: int              # [start, end) in the response token ids
    end: int
    text: str
    finish_reason: str | None = None  # assistant turns: vLLM's ("stop", "length")
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class Episode:
    """Everything after the prompt. Has a ``Sample``'s fields (token_ids, logprobs, text, finish_reason), so rollout
    rows are built alike, plus the loss mask and the turn records.

    token_ids / logprobs / mask: per response token; logprobs are the sampler's for policy tokens and 0.0 for the
    environment's, mask 1 for policy tokens and 0 for the environment's. text: the last assistant turn (what the
    scorer scores). finish_reason: "length" when the episode was cut by a token budget, else "stop".
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "stop"
    end: str | None = None
    reward: float | None = None
    error: str | None = None

    def add(self, role: str, ids: list[int], logprobs: list[float] | None, text: str,
            finish_reason: str | None = None, tool_calls: list[ToolCall] | None = None) -> TurnRecord:
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        policy = logprobs is not None
        self.logprobs.extend(logprobs if policy else [0.0] * len(ids))
        self.mask.extend([1 if policy else 0] * len(ids))
        record = TurnRecord(role, start, len(self.token_ids), text, finish_reason, list(tool_calls or ()))
        self.turns.append(record)
        return record

    @property
    def num_turns(self) -> int:
        """Assistant turns."""
        return sum(t.role == "assistant" for t in self.turns)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for t in self.turns for c in t.tool_calls]

    def turns_json(self) -> str:
        return json.dumps([asdict(t) for t in self.turns], ensure_ascii=False)


class ChatContinuation:
    """Renders environment messages as token ids that continue an episode after an assistant turn.

    The chat template is applied to a fixed two-turn conversation with and without the new messages; the difference
    is what the template writes for them (with the generation prompt of the next assistant turn). What the template
    writes after the assistant's end-of-turn token (Qwen/SmolLM2: a newline) is put in front. The template must not
    rewrite earlier turns when messages are added (it is checked here, once)."""

    _BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token
        self.end_of_turn_id = tokenizer.eos_token_id
        if self.end_of_turn is None or getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template and an eos token "
                             "(the assistant's end of turn)")
        self._base_text = tokenizer.apply_chat_template(self._BASE, tokenize=False)
        cut = self._base_text.rfind(self.end_of_turn)
        if cut < 0:
            raise ValueError(f"the chat template does not close an assistant turn with the eos token "
                             f"{self.end_of_turn!r}: {self._base_text!r}")
        self._after_turn = self._base_text[cut + len(self.end_of_turn):]

    def render(self, messages: list[dict[str, Any]], turn_closed: bool) -> list[int]:
        """Token ids of ``messages`` and the next assistant turn's header. ``turn_closed``: the policy's turn ended
        with the end-of-turn token (else it is written first, as an environment token)."""
        text = self.tokenizer.apply_chat_template(self._BASE + list(messages), tokenize=False,
                                                  add_generation_prompt=True)
        if not text.startswith(self._base_text):
            raise ValueError("the chat template rewrites earlier turns when messages are added; multi-turn rollouts "
                             "need a template that only appends")
        delta = ("" if turn_closed else self.end_of_turn) + self._after_turn + text[len(self._base_text):]
        return self.tokenizer.encode(delta, add_special_tokens=False)
