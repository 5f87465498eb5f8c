"""Runs a batch of episodes against a sampler, turn by turn, all episodes of the batch at once.

Each round sends the next turn of every unfinished episode to the sampler in one call, so vLLM's continuous batching
sees all of them together (never one episode at a time), then runs the environments' steps concurrently in threads.
The first turn is sampled exactly like a single-turn rollout (``n`` samples per prompt, the group's seed); later turns
are one request per episode, seeded per (group, sample, turn), so a resumed run samples the same episodes.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from grpo_core.envs.base import Environment, Step
from grpo_core.envs.episode import (
    ANSWERED, BUDGET, ENV_ERROR, ENV_TIMEOUT, LENGTH, MAX_TURNS, ChatContinuation, Episode)

T = TypeVar("T")
_SEED_MOD = 2**31 - 1
_TURN_SEED_STRIDE = 7919  # later turns' seeds: group seed + sample + turn * stride


@dataclass(frozen=True)
class EpisodeLimits:
    """budget: tokens after the prompt for the whole episode (the policy's and the environment's);
    turn_tokens: at most this many tokens per assistant turn; max_turns: assistant turns;
    step_timeout_s: one environment step (a hung step ends its episode as ``env_timeout``);
    workers: environment steps run at once."""

    budget: int
    turn_tokens: int
    max_turns: int
    step_timeout_s: float = 30.0
    workers: int = 16


def run_episodes(sampler: Any, chat: ChatContinuation, new_env: Callable[[], Environment],
                 prompts: list[dict[str, Any]], *, n: int, limits: EpisodeLimits, greedy: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0, seeds: list[int] | None = None) -> list[list[Episode]]:
    """``n`` episodes per prompt (``{"prompt_token_ids", "columns"}``), grouped like ``sampler.generate``'s output.

    ``sampler`` has ``generate(prompts, n=, max_tokens=, temperature=, top_p=, seeds=)`` and
    ``generate_greedy(prompts, max_tokens=)`` with per-prompt ``max_tokens`` lists (VLLMSampler, ServerSampler)."""
    episodes = [[Episode() for _ in range(n)] for _ in prompts]
    slots = [(g, k) for g in range(len(prompts)) for k in range(n)]
    envs: dict[tuple[int, int], Environment] = {}

    def start(slot: tuple[int, int]) -> Environment:
        env = new_env()
        env.reset(dict(prompts[slot[0]].get("columns", {})))
        return env

    for slot, (status, value) in zip(slots, _run_bounded([lambda s=s: start(s) for s in slots], limits)):
        if status == "ok":
            envs[slot] = value
        else:
            _fail(episodes[slot[0]][slot[1]], status, value, "reset")
    active = [s for s in slots if s in envs]
    turn = 0
    while active:
        samples = _sample_turn(sampler, prompts, episodes, active, turn, n=n, limits=limits, greedy=greedy,
                               temperature=temperature, top_p=top_p, seeds=seeds)
        stepping = []
        for slot, s in zip(active, samples):
            ep = episodes[slot[0]][slot[1]]
            ep.add("assistant", list(s.token_ids), list(s.logprobs), s.text, s.finish_reason)
            ep.text = s.text
            if s.finish_reason == "length" or not s.token_ids:
                ep.end, ep.finish_reason = (BUDGET if len(ep.token_ids) >= limits.budget else LENGTH), "length"
            else:
                stepping.append(slot)
        outcomes = _run_bounded([lambda s=s: envs[s].step(episodes[s[0]][s[1]].text) for s in stepping], limits)
        active = []
        for slot, (status, step) in zip(stepping, outcomes):
            ep = episodes[slot[0]][slot[1]]
            if status != "ok":
                _fail(ep, status, step, "step")
            elif _advance(ep, step, chat, limits):
                active.append(slot)
        turn += 1
    return episodes


def _sample_turn(sampler, prompts, episodes, active, turn, *, n, limits, greedy, temperature, top_p, seeds):
    """The next assistant turn of each active episode, in ``active``'s order."""
    if turn == 0 and len(active) == len(prompts) * n:  # every episode starts: sample as a single-turn rollout
        width = min(limits.turn_tokens, limits.budget)
        ids = [p["prompt_token_ids"] for p in prompts]
        if greedy:
            return [s for s in sampler.generate_greedy(ids, max_tokens=width) for _ in range(n)]
        groups = sampler.generate(ids, n=n, max_tokens=width, temperature=temperature, top_p=top_p, seeds=seeds)
        return [s for group in groups for s in group]
    contexts, widths, turn_seeds = [], [], []
    for g, k in active:
        ep = episodes[g][k]
        contexts.append(list(prompts[g]["prompt_token_ids"]) + ep.token_ids)
        widths.append(min(limits.turn_tokens, limits.budget - len(ep.token_ids)))
        if seeds is not None:
            turn_seeds.append((seeds[g] + k + turn * _TURN_SEED_STRIDE) % _SEED_MOD)
    if greedy:
        return sampler.generate_greedy(contexts, max_tokens=widths)
    out = sampler.generate(contexts, n=1, max_tokens=widths, temperature=temperature, top_p=top_p,
                           seeds=turn_seeds if seeds is not None else None)
    return [group[0] for group in out]


def _advance(ep: Episode, step: Step, chat: ChatContinuation, limits: EpisodeLimits) -> bool:
    """Apply an environment's answer; True when the episode goes on to another assistant turn."""
    if not isinstance(step, Step):
        _fail(ep, "error", TypeError(f"step() returned {type(step).__name__}, expected grpo_core.envs.Step"), "step")
        return False
    ep.turns[-1].tool_calls = list(step.tool_calls)
    if step.done:
        ep.end, ep.reward = step.reason or ANSWERED, step.reward
        return False
    if ep.num_turns >= limits.max_turns:
        ep.end = MAX_TURNS
        return False
    if not step.messages:
        _fail(ep, "error", ValueError("step() neither ended the episode nor gave messages"), "step")
        return False
    try:
        ids = chat.render(step.messages, turn_closed=bool(ep.token_ids) and ep.token_ids[-1] == chat.end_of_turn_id)
    except Exception as error:  # a message the template cannot render is this episode's failure
        _fail(ep, "error", error, "render")
        return False
    if len(ep.token_ids) + len(ids) >= limits.budget:  # no room left for the next turn's first token
        ep.end, ep.finish_reason = BUDGET, "length"
        return False
    role = str(step.messages[0].get("role", "tool"))
    ep.add(role, ids, None, "\n".join(str(m.get("content", "")) for m in step.messages))
    return True


def _fail(ep: Episode, status: str, error: BaseException | None, where: str) -> None:
    ep.end = ENV_TIMEOUT if status == "timeout" else ENV_ERROR
    ep.error = f"{where}: " + ("timed out" if status == "timeout" else f"{type(error).__name__}: {error}")


def _run_bounded(calls: list[Callable[[], T]], limits: EpisodeLimits) -> list[tuple[str, Any]]:
    """Run the calls in daemon threads, at most ``limits.workers`` at once; each gets ``step_timeout_s`` from when
    it starts. Returns ``("ok", value)``, ``("error", exception)`` or ``("timeout", None)`` per call, in order. A
    timed-out call's thread is abandoned (a daemon) and its slot given to the next call."""
    results: list[tuple[str, Any] | None] = [None] * len(calls)
    deadlines: dict[int, float] = {}  # running calls
    changed = threading.Condition()

    def work(i: int) -> None:
        try:
            value: tuple[str, Any] = ("ok", calls[i]())
        except Exception as error:  # the environment's failure: recorded on its episode, the batch goes on
            value = ("error", error)
        with changed:
            if results[i] is None:
                results[i] = value
                deadlines.pop(i, None)
            changed.notify_all()

    waiting = list(range(len(calls)))
    with changed:
        while True:
            now = time.monotonic()
            for i in [i for i, d in deadlines.items() if d <= now]:
                results[i] = ("timeout", None)
                del deadlines[i]
            while waiting and len(deadlines) < max(1, limits.workers):
                i = waiting.pop(0)
                deadlines[i] = now + limits.step_timeout_s
                threading.Thread(target=work, args=(i,), daemon=True, name=f"env-step-{i}").start()
            if not waiting and not deadlines:
                return list(results)  # type: ignore[arg-type]
            changed.wait(timeout=max(0.0, min(deadlines.values()) - time.monotonic()) + 1e-3)
