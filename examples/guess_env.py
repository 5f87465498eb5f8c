"""An example multi-turn environment: guess a number with "higher" / "lower" hints.

Use it with a dataset whose rows carry the secret (``{"messages": ..., "gt_answer": "37"}``) and
``env: {kind: examples/guess_env.py:GuessNumber, args: {low: 1, high: 100}}`` in the config. The episode's reward
is the environment's own (``reward.rewards: [env]``): 1 for finding the number, less for every extra guess.
"""
from __future__ import annotations

import re

from grpo_core.envs import Environment, Step


class GuessNumber(Environment):
    max_turns = 6

    def __init__(self, low: int = 1, high: int = 100):
        self.low, self.high = low, high

    def reset(self, row):
        self.secret = int(row["gt_answer"])
        self.guesses = 0

    def step(self, assistant_text: str) -> Step:
        found = re.findall(r"-?\d+", assistant_text)
        if not found:
            return Step(messages=[{"role": "user", "content": f"Say one number from {self.low} to {self.high}."}])
        self.guesses += 1
        guess = int(found[-1])
        if guess == self.secret:
            return Step(done=True, reason="answered", reward=1.0 - 0.1 * (self.guesses - 1))
        hint = "higher" if guess < self.secret else "lower"
        return Step(messages=[{"role": "user", "content": f"{guess} is wrong: go {hint}."}])
