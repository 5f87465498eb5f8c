"""Every row of a run's data checked against its token limit when the run starts, before the first iteration.

Why: reading (``readers.read_prompts``) checks every row's fields at once, but a row's length in tokens is only
known once it is rendered with the chat template and tokenised, which the prompt stream does when a batch draws the
row. A prompt too long for ``data.max_prompt_tokens`` then failed the run at whatever iteration drew it, even with
``data.on_bad_row: skip``. Here each row is checked up front and ``on_bad_row`` applies: skip leaves it out and lists
it with the rows reading skipped (the run's ``skipped_rows.json`` and its log), error refuses to start, naming the
file, the row and the field.

Bounded time: a row is tokenised only when a cheap upper bound on its tokens exceeds the limit. The bound is the
tokens of the row's chat scaffold (the template, system prompt and worked examples, measured once per sequence of
roles with a one-character turn each) plus the UTF-8 bytes of the row's own turns plus some slack: a byte-level BPE
tokenizer (GPT-2's, Qwen's, Llama 3's, SmolLM's, the built-in models') writes at most one token per byte. Rows of
ordinary length cost a byte count; only rows near or over the limit are rendered and tokenised, with the encoder the
run samples from (``PromptTokenizer``, ``ConversationTokenizer``), whose own check decides. A tokenizer that writes
more tokens than bytes (a normaliser that expands text) could let a row through here; the encoder still refuses it
when a batch draws it, as before.
"""
from __future__ import annotations

from typing import Any, Protocol

from grpo_core.data.readers import ON_BAD_ROW, DataError, PromptSet

# What each turn of the scaffold probe holds (one token at least; its byte is counted again with the row's own).
SCAFFOLD_PROBE = "x"
# Tokens added to the bound: where a turn's text meets the template's, a tokenizer may split differently than in the
# probe.
SLACK_TOKENS = 16
SLACK_TOKENS_PER_TURN = 4


class RowEncoder(Protocol):
    """Renders and tokenises one normalised row; raises DataError naming the row when it breaks a rule (its token
    limit), with messages that start ``"{source}: row {prompt_id}: "``."""

    def encode(self, row: dict[str, Any], source: str) -> dict[str, Any]: ...


def check_lengths(prompts: PromptSet, encoder: RowEncoder, limit: int, on_bad_row: str) -> PromptSet:
    """``prompts`` without the rows ``encoder`` refuses (too many tokens for ``limit``, the encoder's own limit):
    with ``on_bad_row="skip"`` they join ``skipped`` as ``(row number, reason)``; with ``"error"`` the first one
    raises DataError naming its file, row and field. No usable row left is an error too."""
    if on_bad_row not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row must be one of {ON_BAD_ROW}, got {on_bad_row!r}")
    scaffolds: dict[tuple[str, ...], int | None] = {}
    kept, refs, skipped = [], [], list(prompts.skipped)
    for index, row in enumerate(prompts.rows):
        problem = _problem(row, prompts.source, encoder, limit, scaffolds)
        ref = prompts.ref(index)
        if problem is None:
            kept.append(row)
            refs.append(ref)
        elif on_bad_row == "skip":
            skipped.append((ref.number, problem if ref.file == prompts.source else f"{ref.file}: {problem}"))
        else:
            raise DataError(f"{ref.file}: {ref.label}: {problem} (data.on_bad_row=skip leaves such rows out)")
    if not kept:
        raise DataError(f"{prompts.source}: no usable rows ({len(skipped)} bad rows skipped)")
    return PromptSet(rows=kept, skipped=skipped, source=prompts.source, refs=refs if prompts.refs else [])


def token_bound(row: dict[str, Any], scaffold: int) -> int:
    """An upper bound on the row's tokens for a byte-level tokenizer: ``scaffold`` (``scaffold_tokens`` of its
    roles), its turns' bytes, and the slack."""
    turns = row["messages"]
    return (scaffold + sum(len(turn["content"].encode("utf-8")) for turn in turns)
            + SLACK_TOKENS + SLACK_TOKENS_PER_TURN * len(turns))


def _problem(row: dict[str, Any], source: str, encoder: RowEncoder, limit: int,
             scaffolds: dict[tuple[str, ...], int | None]) -> str | None:
    """Why the encoder refuses the row (its message without the source and row it starts with), or None."""
    scaffold = scaffold_tokens(tuple(turn["role"] for turn in row["messages"]), source, encoder, scaffolds)
    if scaffold is not None and token_bound(row, scaffold) <= limit:
        return None
    try:
        encoder.encode(row, source)
    except DataError as err:
        return str(err).removeprefix(f"{source}: row {row['prompt_id']}: ")
    return None


def scaffold_tokens(roles: tuple[str, ...], source: str, encoder: RowEncoder,
                    cache: dict[tuple[str, ...], int | None] | None = None) -> int | None:
    """Tokens of a row with these roles and one-character turns, as the encoder renders it; None when the encoder
    refuses even that (a scaffold over the limit): every row of these roles is then tokenised. ``cache`` keeps the
    answer per sequence of roles."""
    cache = {} if cache is None else cache
    if roles not in cache:
        probe = {"prompt_id": -1, "messages": [{"role": role, "content": SCAFFOLD_PROBE} for role in roles]}
        try:
            encoded = encoder.encode(probe, source)
        except DataError:
            cache[roles] = None
        else:
            cache[roles] = len(encoded["prompt_token_ids"]) + len(encoded.get("response_token_ids", ()))
    return cache[roles]
