"""The policy endpoint's door: every rule a request's fields must meet before anything acts on them, in one place
(the endpoint's routes call these; a training service taking the same fields can too).

A request is refused here, with the field it is about (``RequestError.param``, the OpenAI-style error's ``param``),
rather than reaching the tokenizer, the samplers or the inbox with a value they cannot take: a seed beyond 64 bits
(vLLM fails inside the engine), a NaN temperature (Python's ``json`` reads the literals ``NaN`` and ``Infinity``, and
``1e999`` as infinity; NaN passes every ``<`` check), an integer of hundreds of digits (``float()`` of it raises), a
reward so large that a group's statistics overflow, a string holding a lone surrogate (``"\\ud800"``: nothing can
encode it), JSON nested thousands deep (the decoder's recursion), a body of many megabytes, an id that could not be
routed back (``/`` in an episode id: the path is decoded before routing).

The limits, and why each cannot refuse a request that could be served:

* the body: ``EndpointSettings.max_body_bytes`` (8 MiB), refused (413) before it is parsed: a 128k-token context is
  about 1 MiB as token ids, a few MiB as text.
* rewards (and Atropos scores): finite, ``|reward| <= MAX_ABS_REWARD`` (``EndpointSettings.max_abs_reward``).
* ``MAX_JSON_DEPTH`` = 32: the deepest field of this API is ``messages[i].content[k].text`` (depth 5).
* integers must fit in a signed 64-bit integer: no field of this API takes a larger one (token ids, counts, seeds).
* ``seed``: ``0 <= seed`` and ``seed + n - 1 < 2**63`` (vLLM gives the ``n`` samples of a call the seeds ``seed + k``;
  torch's generator takes at most 64 bits, vLLM's request structs a signed 64-bit integer).
* ids (episode ids, group names): ``[A-Za-z0-9._:-]{1,128}`` (``ID_PATTERN``): what uuid4s, ``<prefix>-<n>`` names
  and the project's drivers use; nothing that a URL path, a file name or a log line would change.
* text before it is rendered or tokenised: at most ``max_model_len * chars_per_token_bound(tokenizer)`` characters
  (``prompt_size``). A token is at most as many characters as its vocabulary entry is long (byte-level BPE: one
  entry character per byte, and a character is at least one byte; SentencePiece: the piece itself, byte-fallback
  entries ``<0x41>`` longer than their one byte), and Unicode normalisation (NFC/NFKC) composes at most 4 code
  points into one; so a text longer than that bound is more than ``max_model_len`` tokens whatever the chat template
  adds to it. The assumption: neither the tokenizer nor the template deletes text (BERT-style accent stripping, a
  template that trims whitespace, sentencepiece's ``fuse_unk``); the exact count after tokenising is checked anyway.
* token ids are counted before anything else is done with them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

MAX_JSON_DEPTH = 32
INT64_MAX = 2**63 - 1
SEED_LIMIT = 2**63  # seed + n - 1 must stay below it
ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
NORMALIZATION_SHRINK = 4  # NFC/NFKC compose at most 4 code points into one (e.g. U+1FA2 from omega and 3 marks)
MAX_N = 64
# Rewards are O(1) for verifiable tasks and O(10) for reward models' scores; 1e6 is far above any of them and far
# below what a group's statistics take in float32 (squares 1e12; float32 overflows at 3.4e38): a reward beyond it is
# an environment's bug, refused naming the field, not clipped (training on a changed value would hide the bug).
MAX_ABS_REWARD = 1e6


class RequestError(ValueError):
    """A request the endpoint refuses: ``param`` names the field, ``code`` the OpenAI-style error code."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request", status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


# ------------------------------------------------------------------------------------------------------- the body
def too_large(size: int, limit: int) -> RequestError:
    return RequestError(f"the body is {size} bytes or more; this endpoint takes at most {limit} "
                        "(EndpointSettings.max_body_bytes)", code="request_too_large", status=413)


def read_json(raw: bytes) -> Any:
    """The body's JSON value, every value in it checked (``check_values``); an empty body is None."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except RecursionError:
        raise RequestError(f"the body is JSON nested deeper than this endpoint reads (at most {MAX_JSON_DEPTH} "
                           "levels)", code="invalid_json") from None
    except ValueError as exc:  # not JSON, not UTF-8, an integer of more than 4300 digits
        raise RequestError(f"the body is not JSON: {exc}", code="invalid_json") from None
    check_values(value)
    return value


def _where(path: tuple[str | int, ...]) -> str | None:
    """The field's name as the error gives it (``messages[0].content``); a key that is not text is shown escaped."""
    out = ""
    for part in path:
        if isinstance(part, str):
            part = shown_text(part)
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def shown_text(text: str) -> str:
    """``text`` as an error may carry it: what cannot be encoded (a lone surrogate) written as its escape."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_values(value: Any, max_depth: int = MAX_JSON_DEPTH, root: str | None = None,
                 leaves: bool = True) -> None:
    """Refuse, naming the field: nesting deeper than ``max_depth``, and with ``leaves`` a number that is not finite,
    an integer outside 64 bits, a string (or key) that is not valid Unicode text (a lone surrogate). Iterative: a
    value nested as deep as Python's recursion limit is refused, not crashed on. ``root``: the value's own field
    name (None: the value is the whole body)."""
    start: tuple[str | int, ...] = () if root is None else (root,)
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, start)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, (dict, list)):
            if len(path) - len(start) >= max_depth:
                raise RequestError(f"{_where(path) or 'the body'} is nested deeper than {max_depth} levels",
                                   param=_where(path[:1]))
            if isinstance(item, dict):
                for key, inner in item.items():
                    if leaves:
                        _text(key, path + (key,))
                    stack.append((inner, path + (key,)))
            elif not (leaves and _plain_ints(item)):  # token ids: checked at once
                stack.extend((inner, path + (i,)) for i, inner in enumerate(item))
        elif not leaves:
            continue
        elif isinstance(item, str):
            _text(item, path)
        elif isinstance(item, float) and not math.isfinite(item):
            raise RequestError(f"{_where(path) or 'the body'} is {item}: numbers must be finite", param=_where(path))
        elif isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            raise RequestError(f"{_where(path) or 'the body'} is {shown_value(item)}: integers must fit in 64 bits",
                               param=_where(path))


def _plain_ints(items: list) -> bool:
    """A list of 64-bit integers only (the common large list: token ids), checked at C speed."""
    return bool(items) and all(type(x) is int for x in items) and -INT64_MAX - 1 <= min(items) and \
        max(items) <= INT64_MAX


def _text(text: str, path: tuple[str | int, ...]) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{_where(path) or 'the body'} holds {text[exc.start]!r} at {exc.start}, a lone "
                           "surrogate: not text", param=_where(path)) from None


def shown_value(value: Any) -> str:
    """A refused value as an error message quotes it: short (a 401-digit integer by its length, a long text cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    text = shown_text(repr(value))
    return text if len(text) <= 100 else f"{text[:80]}... ({len(text)} characters)"


def json_object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", code="invalid_request")
    return body


# ------------------------------------------------------------------------------------------------------ fields
def number(body: dict, name: str, default: Any, kind: type, low: float | None = None,
           high: float | None = None) -> Any:
    """``body[name]`` (``default`` when absent or null) as ``kind``: an integer, or a finite number, in
    [low, high]. Compared exactly before converting (``float()`` of a huge integer raises)."""
    value = body.get(name, default)
    if value is None:
        value = default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(f"{name} must be an integer, not {shown_value(value)}", param=name)
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RequestError(f"{name} must be a number, not {shown_value(value)}", param=name)
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, not {value}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        raise RequestError(f"{name}={shown_value(value)} is out of range [{low}, {high}]", param=name)
    return kind(value)


def seed(body: dict, n: int) -> int | None:
    """The call's seed: None, or ``0 <= seed`` with ``seed + n - 1 < 2**63`` (the ``n`` samples' seeds)."""
    if body.get("seed") is None:
        return None
    return number(body, "seed", None, int, 0, SEED_LIMIT - n)


def identifier(value: Any, param: str, what: str) -> str:
    """An episode id or a group name: ``ID_PATTERN``."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise RequestError(f"{param} must be {what}: 1-128 characters of A-Z a-z 0-9 . _ : - (not "
                           f"{shown_value(value)})", param=param)
    return value


def reward(value: Any, max_abs: float) -> float | None:
    """A finished episode's reward: null (could not be scored) or a finite number with ``|reward| <= max_abs``.
    Refused, not clipped: a reward out of bounds is a bug in the environment, and training on a changed value would
    hide it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not math.isfinite(value)):
        raise RequestError(f"reward must be a finite number or null, not {shown_value(value)}", param="reward")
    if not -max_abs <= value <= max_abs:  # exact for any int: never converted before this
        raise RequestError(f"reward {shown_value(value)} is outside [-{max_abs:g}, {max_abs:g}] "
                           "(EndpointSettings.max_abs_reward)", param="reward")
    return float(value)


# -------------------------------------------------------------------------------------------- prompt size
def chars_per_token_bound(tokenizer: Any) -> int:
    """At least as many characters as any one token can stand for, in the text the client sends (see the module's
    docstring): the longest vocabulary entry, times what normalisation may shrink."""
    return NORMALIZATION_SHRINK * max(len(entry) for entry in tokenizer.get_vocab())


def _texts(messages: Any) -> int:
    """Characters of the messages' text (whatever is malformed is refused later, field by field)."""
    total = 0
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


def prompt_size(param: str, prompt: Any, max_model_len: int, chars_per_token: int) -> None:
    """Before a prompt is rendered or tokenised: token ids counted, text measured against the most characters
    ``max_model_len - 1`` tokens can be (an answer needs at least one token of the context)."""
    room = max_model_len - 1
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if len(prompt) > room:
            raise context_exceeded(param, len(prompt), max_model_len)
        return
    chars = len(prompt) if isinstance(prompt, str) else _texts(prompt)
    if chars > room * chars_per_token:
        raise RequestError(f"the prompt is {chars} characters: more than the {room} tokens the policy's context of "
                           f"{max_model_len} leaves a prompt could hold ({chars_per_token} characters a token at "
                           "most)", param=param, code="context_length_exceeded")


def context_exceeded(param: str, tokens: int, max_model_len: int) -> RequestError:
    return RequestError(f"the prompt is {tokens} tokens; the policy's context is {max_model_len}, and the answer "
                        "needs at least 1", param=param, code="context_length_exceeded")


# ---------------------------------------------------------------------------------------------- whole requests
# Request fields this endpoint does not serve, with the value that asks for nothing (then accepted)
UNSERVED = {"stream": False, "tools": [], "functions": [], "response_format": {"type": "text"}, "best_of": 1,
            "echo": False, "suffix": ""}


@dataclass(frozen=True)
class SamplingRequest:
    """One call's sampling settings as the door checked them, applied as given (``grpo_core.outside.endpoint.sampling``)."""
    n: int
    max_tokens: int
    temperature: float  # 0: greedy
    top_p: float
    seed: int | None


def sampling_fields(body: dict, max_tokens: int, temperature: float, top_p: float) -> SamplingRequest:
    """The sampling fields of a completion, chat or ``/generate`` call (the defaults: the run's; ``max_tokens`` as
    asked: the endpoint clamps it to the room left in the context). Stop sequences are
    refused, not bounded: the policy stops at its end-of-turn token or ``max_tokens``, and a stop string would cut
    an answer inside the tokens it was sampled as."""
    for name, neutral in UNSERVED.items():
        if body.get(name) not in (None, neutral):
            raise RequestError(f"{name} is not served by this endpoint", param=name, code="unsupported_parameter")
    if body.get("stop") not in (None, [], ""):
        raise RequestError("stop sequences are not served: the policy stops at its end-of-turn token or "
                           "max_tokens", param="stop", code="unsupported_parameter")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    n = number(body, "n", 1, int, 1, MAX_N)
    return SamplingRequest(n=n, max_tokens=number(body, key, max_tokens, int, 1, None),
                           temperature=number(body, "temperature", temperature, float, 0.0, 2.0),
                           top_p=number(body, "top_p", top_p, float, 1e-6, 1.0), seed=seed(body, n))


def episode_id(body: dict, headers: dict[str, str]) -> str | None:
    """The call's episode id (the ``X-Episode-Id`` header, or ``episode_id`` in the body), if any."""
    value = headers.get("x-episode-id") or body.get("episode_id")
    return None if value is None else identifier(value, "episode_id", "an episode id")


@dataclass(frozen=True)
class FinishFields:
    reward: float | None
    group: str | None


def finish_fields(body: Any, max_abs_reward: float) -> FinishFields:
    """``POST /v1/episodes/{id}/finish``'s body: ``{"reward": number | null, "group": name}`` (both optional)."""
    body = json_object(body) if body is not None else {}
    group = body.get("group")
    return FinishFields(reward(body.get("reward"), max_abs_reward),
                        None if group is None else identifier(group, "group", "a group name (the episodes of one "
                                                                              "task)"))
