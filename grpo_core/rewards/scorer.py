"""Scoring completions: accuracy (and plugins) in a pool of worker processes, shaping rewards here, one weighted sum.

What a ``RewardResult`` means:
- ``reward`` is a float and ``error`` is None: scored normally.
- ``reward`` is a float and ``error`` is set: scored, with a reason worth keeping. A verification that ran out of
  time (math-verify stuck on hostile LaTeX, a worker killed at the hard limit) is a WRONG answer: accuracy 0.0, the
  reason in ``error``. A program that failed its tests gets accuracy 0.0 and the sandbox's reason.
- ``reward`` is None and ``error`` is set: the row could not be scored at all (a missing or unparseable gold answer,
  malformed test cases, a plugin that raised or timed out, a worker that died on its own). The component(s) at fault
  are None; the row keeps its place.
A plugin may return None for a completion it does not apply to: that component is None, left out of the weighted
sum, and is not an error (as in TRL). A row where no component applies gets reward None with an error.

Model rewards (``models``: reward models and judges, see ``grpo_core.rewards.models``) score the same pairs in
whatever holds them (Ray actors in a run, this process in ``grpo score``); a row a model could not score (too long,
an unparseable verdict, a judge server that never answered) is unscored with the model's reason, and a judge's text
is kept in ``RewardResult.raw``.

Identical (completion, row) pairs of one ``score`` call are verified once and share the outcome (``dedupe``, on by
default; turn it off for a plugin whose result is not a function of the completion and its row).

Time limits: each worker-side component of a row gets ``timeout_s`` (an alarm in the worker); a worker still busy
with one row after ``timeout_s * components + grace`` is killed and replaced.

``cosine`` uses lengths: token counts from ``completion_lengths`` when given, otherwise characters, as open-r1 does.
"""
from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping

from grpo_core.rewards import shaping
from grpo_core.rewards.models.base import ModelReward, ModelVerdict, RewardInput
from grpo_core.rewards.pool import FatalWorkerError, LostRow, RowOutput, WorkerPool
from grpo_core.rewards.registry import RewardPlan, build_plan
from grpo_core.rewards.worker import ACCURACY, ComponentOutcome, WorkerSpec

HARD_LIMIT_GRACE_S = 2.0


@dataclass
class RewardResult:
    reward: float | None                   # weighted sum; None when the row could not be scored
    components: dict[str, float | None]    # one entry per configured reward name
    error: str | None                      # why it could not be scored, or a note on a row scored as wrong
    raw: dict[str, str | None] = field(default_factory=dict)  # a judge's text, per model component


class Scorer:
    """Scores completions in a pool of worker processes (math-verify needs a main thread; a hostile or stuck
    verification costs only its own time budget).

    The pool starts in the constructor (about a second per worker) and serves every ``score`` call until ``close``.
    The parent side uses no signals, so ``score`` may be called from any thread, but from one thread at a time.
    """

    def __init__(self, reward_type: str = "boxed", rewards: list[str] = ["accuracy"],
                 weights: list[float] | None = None, num_workers: int = 2, timeout_s: float = 5.0,
                 options: dict | None = None, dedupe: bool = True, models: Mapping[str, ModelReward] | None = None,
                 prompt_key: str = "messages"):
        """``models``: the model rewards by name (each named in ``rewards`` too); ``prompt_key``: the rows' column
        of prompt messages they score with the completion."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.dedupe = dedupe
        self.models = dict(models or {})
        self.prompt_key = prompt_key
        self.plan: RewardPlan = build_plan(reward_type, list(rewards), weights, options, model_names=self.models)
        self.timeout_s = timeout_s
        self._pool: WorkerPool | None = None
        worker_components = int(self.plan.needs_accuracy) + len(self.plan.plugins)
        if worker_components:
            spec = WorkerSpec(reward_type=reward_type, timeout_s=timeout_s,
                              compute_accuracy=self.plan.needs_accuracy, plugins=dict(self.plan.plugins),
                              answer_key=self.plan.answer_key, sandbox_limits=self.plan.sandbox_limits,
                              concurrent_sandboxes=num_workers)
            hard_limit = timeout_s * worker_components + max(HARD_LIMIT_GRACE_S, 0.5 * timeout_s)
            try:
                self._pool = WorkerPool(spec, num_workers, hard_timeout_s=hard_limit)
            except FatalWorkerError as error:
                raise _original_error(error) from error
            self._finalizer = weakref.finalize(self, self._pool.close)

    @property
    def workers_replaced(self) -> int:
        """How many workers were killed (stuck) or found dead and replaced since the scorer started."""
        return self._pool.replaced if self._pool is not None else 0

    def score(self, completions: list[str], rows: list[dict], *,
              completion_lengths: list[int] | None = None) -> list[RewardResult]:
        """One RewardResult per completion, in input order."""
        self._check_inputs(completions, rows, completion_lengths)
        items = list(zip(completions, rows))
        slots = _distinct_slots(items) if self.dedupe else list(range(len(items)))
        unique_by_slot = {slot: item for slot, item in zip(slots, items)}
        unique = [unique_by_slot[k] for k in range(len(unique_by_slot))]
        if self._pool is not None:
            try:
                found = self._pool.run(unique)
            except FatalWorkerError as error:
                raise _original_error(error) from error
            outputs = [found[slot] for slot in slots]
        else:
            outputs = [{} for _ in completions]
        verdicts = self._model_verdicts(unique)
        return [self._combine(i, completion, outputs[i], completion_lengths, rows[i],
                              {name: found[slots[i]] for name, found in verdicts.items()})
                for i, completion in enumerate(completions)]

    def _model_verdicts(self, items: list[tuple[str, dict]]) -> dict[str, list[ModelVerdict]]:
        """Each model reward's verdicts on the distinct (completion, row) pairs."""
        if not self.models:
            return {}
        inputs = [reward_input(c, row, self.prompt_key, self.plan.answer_key) for c, row in items]
        out = {}
        for name, model in self.models.items():
            verdicts = model.score(inputs)
            if len(verdicts) != len(inputs):
                raise RuntimeError(f"model reward {name!r} gave {len(verdicts)} verdicts for {len(inputs)} rows")
            out[name] = verdicts
        return out

    def _check_inputs(self, completions: list[str], rows: list[dict], completion_lengths: list[int] | None) -> None:
        if len(completions) != len(rows):
            raise ValueError(f"{len(completions)} completions but {len(rows)} rows")
        for index, completion in enumerate(completions):
            if not isinstance(completion, str):
                raise TypeError(f"completion {index} is {type(completion).__name__}, expected str")
        if completion_lengths is not None and len(completion_lengths) != len(completions):
            raise ValueError(f"{len(completion_lengths)} completion_lengths for {len(completions)} completions")

    def _combine(self, index: int, completion: str, output: RowOutput, completion_lengths: list[int] | None,
                 row: dict, verdicts: dict[str, ModelVerdict]) -> RewardResult:
        outcomes = _outcomes_of(output, self.plan)
        outcomes.update({name: ComponentOutcome(v.value, error=v.error and f"{name}: {v.error}")
                         for name, v in verdicts.items()})
        raw = {name: v.raw for name, v in verdicts.items() if v.raw is not None}
        length = completion_lengths[index] if completion_lengths is not None else len(completion)
        accuracy = outcomes.get(ACCURACY)
        components: dict[str, float | None] = {}
        messages: list[str] = []
        failed = False
        for name in self.plan.names:
            outcome = outcomes.get(name)
            if name == "format":
                outcome = ComponentOutcome(shaping.format_reward(completion))
            elif name == "repetition":
                outcome = ComponentOutcome(shaping.repetition_penalty(completion, self.plan.repetition))
            elif name == "cosine":
                outcome = _cosine_outcome(accuracy, length, self.plan.cosine)
            elif name == "env":
                outcome = _env_outcome(row)
            if outcome is None:
                outcome = ComponentOutcome(None, error=f"{name}: no result from the scorer worker")
            components[name] = outcome.value
            if outcome.error is not None:
                failed = True
                messages.append(outcome.error)
            elif outcome.note is not None and name != "cosine":
                messages.append(outcome.note)
        if accuracy is not None and "accuracy" not in self.plan.names and accuracy.note and not failed:
            messages.append(accuracy.note)  # cosine used accuracy: keep why it counted as wrong
        for name, outcome in outcomes.items():  # errors from components not configured (a crash reported on accuracy)
            if name not in self.plan.names and outcome.error is not None and outcome.error not in messages:
                failed = True
                messages.append(outcome.error)
        error = "; ".join(dict.fromkeys(messages)) or None
        if failed:
            return RewardResult(None, components, error, raw)
        applicable = [(w, v) for w, v in zip(self.plan.weights, components.values()) if v is not None]
        if not applicable:
            return RewardResult(None, components, error or "no reward component applies to this completion", raw)
        return RewardResult(sum(w * v for w, v in applicable), components, error, raw)

    def close(self) -> None:
        """Stop the worker processes. Safe to call twice."""
        if self._pool is not None:
            self._finalizer()
            self._pool = None

    def __enter__(self) -> Scorer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def prompt_messages(prompt: Any, prompt_key: str, reader: str = "a model reward") -> tuple[tuple[str, str], ...]:
    """A row's prompt (a chat list, one message, or a plain string) as (role, content) pairs; ``reader`` (who needs
    it) names the error."""
    if isinstance(prompt, dict):
        prompt = [prompt]
    if isinstance(prompt, str):
        return (("user", prompt),)
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        return tuple((str(m.get("role", "user")), str(m.get("content", ""))) for m in prompt)
    raise ValueError(f"{reader} needs the prompt: the row's {prompt_key!r} column holds "
                     f"{type(prompt).__name__}, not chat messages or a string")


def reward_input(completion: str, row: dict, prompt_key: str, answer_key: str) -> RewardInput:
    """What a model reward sees of a row: its prompt messages (a chat list, one message, or a plain string), the
    completion and the gold answer if the row has one."""
    answer = row.get(answer_key)
    return RewardInput(prompt_messages(row.get(prompt_key), prompt_key), completion,
                       None if answer is None else str(answer))


def _distinct_slots(items: list[tuple[str, dict]]) -> list[int]:
    """The slot of each (completion, row) among the distinct pairs, numbered by first appearance.

    A group's samples share their row, and as a policy converges they repeat the same completion (late in the tiny
    task most groups of 8 hold two or three distinct answers; code groups repeat whole programs, each a sandbox
    run): the workers verify each distinct pair once."""
    seen: dict[tuple[str, str], int] = {}
    return [seen.setdefault((c, json.dumps(row, sort_keys=True, default=repr)), len(seen)) for c, row in items]


def _outcomes_of(output: RowOutput, plan: RewardPlan) -> dict[str, ComponentOutcome]:
    """Worker outcomes of one row; a lost row becomes accuracy 0.0 (timed out) or unscorable (worker died)."""
    if not isinstance(output, LostRow):
        return output
    outcomes: dict[str, ComponentOutcome] = {}
    if plan.needs_accuracy:
        if output.timed_out:
            outcomes[ACCURACY] = ComponentOutcome(0.0, note=f"accuracy: {output.reason}; counted as wrong")
        else:
            outcomes[ACCURACY] = ComponentOutcome(None, error=f"accuracy: {output.reason}")
    for name in plan.plugins:
        outcomes[name] = ComponentOutcome(None, error=f"plugin {name!r}: {output.reason}")
    return outcomes


def _env_outcome(row: dict) -> ComponentOutcome:
    """The reward a multi-turn environment gave its episode (``env_reward``); an episode it did not reward (cut
    short, or an environment that raised) scores 0 with the reason."""
    if "env_reward" not in row:
        return ComponentOutcome(None, error="env: the row has no env_reward column (a multi-turn run's rollouts "
                                            "have one; set env in the config)")
    if row["env_reward"] is None:
        return ComponentOutcome(0.0, note=f"env: no reward from the environment (episode_end="
                                          f"{row.get('episode_end')!r})")
    return ComponentOutcome(float(row["env_reward"]))


def _cosine_outcome(accuracy: ComponentOutcome | None, length: int, params: shaping.CosineParams) -> ComponentOutcome:
    if accuracy is None or accuracy.value is None:
        return ComponentOutcome(None)  # accuracy's own error explains the row
    return ComponentOutcome(shaping.cosine_reward(accuracy.value >= 1.0, length, params))


def _original_error(error: FatalWorkerError) -> Exception:
    """Re-create the worker's fatal error in this process (SandboxUnavailable stays SandboxUnavailable)."""
    if error.error_type == "SandboxUnavailable":
        from grpo_core.infra.sandbox import SandboxUnavailable

        return SandboxUnavailable(error.detail)
    return error
