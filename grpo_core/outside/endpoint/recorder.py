"""Calls from outside, tagged with an episode id, recorded as one training sample: the tokens the policy sampled, and
the tokens of everything else, without decoding and encoding again what was sampled.

An agent that speaks the OpenAI API sends text: each chat call carries the whole conversation, the policy's earlier
answers as text. Rendering that text with the chat template again would give the policy's turns as the tokenizer
splits them, not as they were sampled (and the learner would then train on tokens the sampler never drew). So for
an episode's next turn the recorder takes the tokens it recorded (the first prompt, every sampled turn exactly as
sampled, every message in between) and renders only the new messages as a continuation
(``grpo_core.envs.episode.ChatContinuation``, as the multi-turn rollouts do); the client's copy of the earlier turns
must equal what it was given (else the call is refused: a client that rewrote the history is not the episode that
was sampled). How often a plain re-rendering of the text would have given other tokens is counted
(``retokenized_differs``): the measure of what token-in/token-out buys.

The recorded episode is an ``Episode`` (``grpo_core.envs.episode``): response tokens, the sampler's logprobs on the
policy's tokens and 0.0 elsewhere, a mask 1 on the policy's tokens and 0 on the rest, and the turns.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from grpo_core.outside.endpoint.requests import RequestError, chars_per_token_bound
from grpo_core.envs.episode import ANSWERED, LENGTH, ChatContinuation, Episode
from grpo_core.engine.rollout.sampler import Sample


def message_text(message: Any, index: int) -> tuple[str, str]:
    """(role, text) of one chat message: ``content`` a string or a list of text parts."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise RequestError(f"{where} must be an object with role and content", param=where)
    role, content = message.get("role"), message.get("content")
    if role not in ("system", "user", "assistant", "tool"):
        raise RequestError(f"{where}.role must be system, user, assistant or tool, not {role!r}", param=f"{where}.role")
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content[{k}]: only text parts are served", param=f"{where}.content")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    return role, content


@dataclass(frozen=True)
class TurnPlan:
    """What one call samples from: the prompt's token ids and, for a tracked episode, what the call adds to it
    before the policy's turn (``added_ids``: the new messages rendered, or a completion prompt's new text)."""
    prompt_ids: list[int]
    episode_id: str | None = None
    added_ids: list[int] = field(default_factory=list)
    added_role: str = "user"
    added_text: str = ""
    transcript: list[dict[str, str]] | str | None = None  # the client's view after this call's prompt
    retokenized_differs: bool | None = None  # later turns: whether rendering the text again gives other tokens
    recorded: int = 0  # the episode's tokens when the call was planned (0: a new episode)


@dataclass
class _Open:
    prompt_ids: list[int]
    episode: Episode
    transcript: list[dict[str, str]] | str  # chat: the messages so far; completion: the text so far
    versions: list[int]
    closed: bool = True  # the last policy turn ended with the end-of-turn token


@dataclass(frozen=True)
class FinishedEpisode:
    """A recorded episode and its reward: one training row (``prompt_ids`` then ``episode``'s tokens)."""
    episode_id: str
    prompt_ids: list[int]
    episode: Episode
    policy_version: int  # the oldest version that sampled one of its turns (the staleness rule reads it)
    versions: list[int]
    group: str | None = None  # the episodes of one task that the environment compared (GRPO's group)


@dataclass
class RecorderStats:
    calls: int = 0
    later_turns: int = 0
    retokenized_differs: int = 0  # later turns whose text, rendered again, is not the recorded tokens
    discarded: int = 0  # episodes their client gave up (a failed rollout): never trained on


def _unknown(episode_id: str) -> RequestError:
    return RequestError(f"no open episode {episode_id!r}", param="episode_id", code="unknown_episode", status=404)


class EpisodeRecorder:
    """Episodes in progress, by id. Thread-safe: the endpoint serves calls concurrently."""

    def __init__(self, tokenizer, max_open: int = 4096):
        self.tokenizer = tokenizer
        self.chat = ChatContinuation(tokenizer)
        self.chars_per_token = chars_per_token_bound(tokenizer)  # the door's bound on text before it is rendered
        self.max_open = max_open
        self.stats = RecorderStats()
        self._open: dict[str, _Open] = {}
        self._finishing: dict[str, tuple[_Open, Any, Any]] = {}  # finished, not yet settled: (state, end, reward)
        self._busy: set[str] = set()  # episodes with a call in flight
        self._lock = threading.Lock()

    @contextmanager
    def turn(self, plan: TurnPlan) -> Iterator[None]:
        """Hold ``plan``'s episode for its call: a second call on it meanwhile, or one planned before the last
        answer was recorded, is refused (it would fork the episode the learner trains on)."""
        episode = plan.episode_id
        if episode is None:
            yield
            return
        with self._lock:
            state = self._open.get(episode)
            now = 0 if state is None else len(state.prompt_ids) + len(state.episode.token_ids)
            if episode in self._busy or now != plan.recorded:
                raise RequestError(f"episode {episode!r} has another call in flight: an episode's calls go one after "
                                   "the other", param="episode_id", code="episode_busy", status=409)
            self._busy.add(episode)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(episode)

    # ------------------------------------------------------------------------------------------------ plans
    def plan_chat(self, messages: Any, episode_id: str | None) -> TurnPlan:
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        transcript = [dict(zip(("role", "content"), message_text(m, i))) for i, m in enumerate(messages)]
        if transcript[-1]["role"] == "assistant":
            raise RequestError("the last message is the assistant's: nothing to answer", param="messages")
        with self._lock:
            state = self._open.get(episode_id) if episode_id is not None else None
        rendered = self.tokenizer.apply_chat_template(transcript, add_generation_prompt=True, tokenize=False)
        naive = self.tokenizer.encode(rendered, add_special_tokens=False)
        if state is None:
            return TurnPlan(naive, episode_id, transcript=transcript)
        known = state.transcript
        assert isinstance(known, list)
        if len(transcript) <= len(known) or transcript[:len(known)] != known:
            at = next((i for i, (a, b) in enumerate(zip(transcript, known)) if a != b), min(len(transcript),
                                                                                              len(known)))
            raise RequestError(f"episode {episode_id!r}: messages[{at}] does not continue the recorded conversation "
                               "(send the earlier turns as they were answered, or use a new episode id)",
                               param=f"messages[{at}]", code="episode_history_mismatch")
        new = transcript[len(known):]
        added = self.chat.render(new, turn_closed=state.closed)
        prompt = state.prompt_ids + state.episode.token_ids + added
        return TurnPlan(prompt, episode_id, added, new[0]["role"], json.dumps(new, ensure_ascii=False), transcript,
                        retokenized_differs=naive != prompt, recorded=len(prompt) - len(added))

    def plan_completion(self, prompt: Any, episode_id: str | None) -> TurnPlan:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids, text = list(prompt), None
        elif isinstance(prompt, str) and prompt:
            ids, text = self.tokenizer.encode(prompt, add_special_tokens=False), prompt
        else:
            raise RequestError("prompt must be a non-empty string or a list of token ids (one prompt per call)",
                               param="prompt")
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(f"prompt holds token ids outside the vocabulary (0..{vocab - 1}): {bad[:5]}",
                               param="prompt")
        with self._lock:
            state = self._open.get(episode_id) if episode_id is not None else None
        if state is None:
            return TurnPlan(ids, episode_id, transcript=text if text is not None else "")
        before = state.prompt_ids + state.episode.token_ids
        if text is None:  # token ids: the recorded ones must come first
            if ids[:len(before)] != before or len(ids) == len(before):
                raise RequestError(f"episode {episode_id!r}: the prompt's token ids do not extend the recorded "
                                   "episode", param="prompt", code="episode_history_mismatch")
            return TurnPlan(ids, episode_id, ids[len(before):], "user", "", "", retokenized_differs=False,
                            recorded=len(before))
        known = state.transcript
        assert isinstance(known, str)
        if not text.startswith(known) or text == known:
            raise RequestError(f"episode {episode_id!r}: the prompt does not extend the recorded text",
                               param="prompt", code="episode_history_mismatch")
        added = self.tokenizer.encode(text[len(known):], add_special_tokens=False)
        prompt_ids = before + added
        return TurnPlan(prompt_ids, episode_id, added, "user", text[len(known):], text,
                        retokenized_differs=ids != prompt_ids, recorded=len(before))

    # ------------------------------------------------------------------------------------------------ record
    def record(self, plan: TurnPlan, sample: Sample, version: int) -> None:
        """The policy's answer to ``plan`` (one sample: an episode has one answer per turn)."""
        with self._lock:
            self.stats.calls += 1
            if plan.episode_id is None:
                return
            state = self._open.get(plan.episode_id)
            if state is None:
                if len(self._open) >= self.max_open:
                    raise RequestError(f"{self.max_open} episodes are open: finish some first", code="too_many_episodes",
                                       status=429)
                state = self._open[plan.episode_id] = _Open(plan.prompt_ids, Episode(), plan.transcript or "", [])
            else:
                self.stats.later_turns += 1
                self.stats.retokenized_differs += bool(plan.retokenized_differs)
                state.episode.add(plan.added_role, plan.added_ids, None, plan.added_text)
            state.episode.add("assistant", sample.token_ids, sample.logprobs, sample.text, sample.finish_reason)
            state.episode.text = sample.text
            state.episode.finish_reason = sample.finish_reason
            state.closed = bool(sample.token_ids) and sample.token_ids[-1] == self.chat.end_of_turn_id
            state.versions.append(version)
            if isinstance(plan.transcript, list):
                state.transcript = plan.transcript + [{"role": "assistant", "content": sample.text}]
            else:
                state.transcript = (plan.transcript or "") + sample.text

    def finish(self, episode_id: str, reward: float | None = None, group: str | None = None) -> FinishedEpisode:
        """Close an episode: it becomes a training row (its reward, when given, is the environment's). Until
        ``settle`` says whether its row was kept, no other call can finish it again."""
        with self._lock:
            state = self._open.pop(episode_id, None)
            if state is not None:
                self._finishing[episode_id] = (state, state.episode.end, state.episode.reward)
        if state is None:
            raise _unknown(episode_id)
        ep = state.episode
        ep.end = LENGTH if ep.finish_reason == "length" else ANSWERED
        ep.reward = reward
        return FinishedEpisode(episode_id, state.prompt_ids, ep, min(state.versions), list(state.versions), group)

    def settle(self, episode_id: str, kept: bool) -> None:
        """After ``finish``: its row was kept (the episode is done), or could not be (a storage fault): the episode is
        open again as it was, for the client to finish once more."""
        with self._lock:
            state, end, reward = self._finishing.pop(episode_id)
            if not kept:
                state.episode.end, state.episode.reward = end, reward
                self._open[episode_id] = state

    def discard(self, episode_id: str) -> int:
        """Drop an open episode that will never be finished (its rollout failed); returns its recorded turns."""
        with self._lock:
            if episode_id in self._busy:
                raise RequestError(f"episode {episode_id!r} has a call in flight", param="episode_id",
                                   code="episode_busy", status=409)
            state = self._open.pop(episode_id, None)
            if state is not None:
                self.stats.discarded += 1
        if state is None:
            raise _unknown(episode_id)
        return state.episode.num_turns

    def open_episodes(self) -> list[str]:
        with self._lock:
            return sorted(self._open)
