"""Environments for the tests: episodes of a known shape whatever the policy writes."""
from __future__ import annotations

from grpo_core.envs import Environment, Step


class ThreeTurns(Environment):
    """Answers the first two turns with an observation and ends the episode after the third."""

    max_turns = 3

    def reset(self, row):
        self.turns = 0

    def step(self, assistant_text: str) -> Step:
        self.turns += 1
        if self.turns == 3:
            return Step(done=True, reason="answered")
        return Step(messages=[{"role": "tool", "content": f"observation {self.turns}"}])
