"""Online curation: prompts the policy always or never solves leave the pool for a while (prime-rl's difficulty
pools, SkyRL's zero-variance filter applied before sampling rather than after).

Why: a group whose G answers are all right or all wrong has zero advantage under GRPO, so its rollout buys no
gradient. DAPO's filter drops such groups after sampling them; the pool stops sampling them: a prompt whose group
was all right ("easy") leaves the pool and is passed over the next ``easy_skips`` times its turn comes in the epoch
order, one all wrong ("hard") ``hard_skips`` times; then it is back (the policy may have moved). Counted in turns,
not iterations: in the epoch-wise order a prompt comes once per pass over the train set, so a cooldown in iterations
shorter than a pass would do nothing and a longer one would depend on the prompt's place in the next permutation.

Exactness: iteration j's prompts depend only on the outcomes of iterations < j, read back from the run folder's
scored files (``outcomes``), never on timing. In async RL the rollout of j starts after j - 1 is scored (the flow
collects batches in order), so the rule holds for any staleness; a resume or a recovery replays the outcomes from
the state of a checkpoint and draws exactly the prompts an uninterrupted run would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

EASY, HARD = "easy", "hard"


@dataclass(frozen=True)
class GroupOutcome:
    """One sampled group of an iteration: where it sits in the iteration's selection (its ``group_id``), the
    dataset's ``prompt_id`` (to tell our groups from an inbox's) and the share of right answers."""
    group_id: int
    prompt_id: int
    success: float


@dataclass
class PoolState:
    """After selecting ``iteration``: the order's positions consumed, the prompts out of the pool (index ->
    (turns still to pass over, why)) and the selection itself (the next iteration reads its outcomes by it)."""
    iteration: int = -1
    cursor: int = 0
    retired: dict[int, tuple[int, str]] = field(default_factory=dict)
    selection: list[int] = field(default_factory=list)
    skipped: int = 0      # positions passed over by the last selection

    def to_json(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "cursor": self.cursor,
                "retired": [[i, turns, why] for i, (turns, why) in sorted(self.retired.items())],
                "selection": list(self.selection), "skipped": self.skipped}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "PoolState":
        return cls(iteration=int(doc["iteration"]), cursor=int(doc["cursor"]),
                   retired={int(i): (int(turns), str(why)) for i, turns, why in doc["retired"]},
                   selection=[int(i) for i in doc["selection"]], skipped=int(doc["skipped"]))


class DifficultyPool:
    """Which prompt indices each iteration samples, skipping retired prompts.

    size: prompts in the train set; order(epoch) -> a permutation of range(size) (the stream's epoch order);
    per_iteration: prompts drawn per iteration (every dynamic-sampling round's); prompt_ids[i]: the dataset id of
    index i; outcomes(iteration) -> that iteration's groups, read from the run folder."""

    def __init__(self, size: int, order: Callable[[int], np.ndarray], per_iteration: int, prompt_ids: list[int],
                 outcomes: Callable[[int], list[GroupOutcome]], easy_skips: int, hard_skips: int,
                 keep_states: int = 64):
        self.size, self.order, self.per_iteration = size, order, per_iteration
        self.prompt_ids, self.outcomes = prompt_ids, outcomes
        self.skips = {EASY: easy_skips, HARD: hard_skips}
        self.keep_states = keep_states
        self._states: dict[int, PoolState] = {-1: PoolState()}

    # ------------------------------------------------------------------------------------------ selection
    def selection(self, iteration: int) -> list[int]:
        return self.state(iteration).selection

    def restore(self, state: PoolState) -> None:
        """Start from a checkpoint's state: later iterations are replayed from it."""
        self._states = {state.iteration: state}

    def metrics(self, iteration: int) -> dict[str, int]:
        s = self.state(iteration)
        retired = s.retired
        easy = sum(why == EASY for _, why in retired.values())
        return {"pool_active": self.size - len(retired), "pool_easy": easy, "pool_hard": len(retired) - easy,
                "pool_skipped": s.skipped}

    def state(self, iteration: int) -> PoolState:
        """The state after selecting ``iteration`` (replayed from the nearest earlier one if needed)."""
        if iteration in self._states:
            return self._states[iteration]
        earlier = [i for i in self._states if i < iteration]
        if not earlier:
            raise ValueError(f"the difficulty pool holds no state before iteration {iteration} (it starts at "
                             f"{min(self._states)}): restore a checkpoint's state first")
        state = self._states[max(earlier)]
        for i in range(state.iteration + 1, iteration + 1):
            state = self._next(state, i)
            self._states[i] = state
        for old in sorted(self._states)[:-self.keep_states]:
            del self._states[old]
        return state

    def _next(self, prev: PoolState, iteration: int) -> PoolState:
        retired = dict(prev.retired)
        if prev.iteration >= 0:  # what the previous iteration's groups showed
            chosen = prev.selection
            for o in self.outcomes(prev.iteration):
                if not (0 <= o.group_id < len(chosen)) or self.prompt_ids[chosen[o.group_id]] != o.prompt_id:
                    continue  # not one of our groups (the inbox's)
                why = EASY if o.success >= 1.0 else HARD if o.success <= 0.0 else None
                if why is not None and self.skips[why] > 0:
                    retired[chosen[o.group_id]] = (self.skips[why], why)
        picked, pos, skipped = [], prev.cursor, 0
        while len(picked) < self.per_iteration:  # ends: every pass-over spends one of a prompt's turns
            idx = int(self.order(pos // self.size)[pos % self.size])
            pos += 1
            if idx in retired:
                turns, why = retired[idx]
                if turns > 1:
                    retired[idx] = (turns - 1, why)
                else:
                    del retired[idx]
                skipped += 1
                continue
            picked.append(idx)
        return PoolState(iteration=iteration, cursor=pos, retired=retired, selection=picked, skipped=skipped)
