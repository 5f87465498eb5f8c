"""The built-in tool-use environment: the policy calls a tool by writing ``<NAME>input</NAME>`` in its turn (for
example ``<calculator>347*829</calculator>``); each call's output comes back as a ``tool`` message and the policy
takes another turn. A turn without a call is the answer and ends the episode, which the scorer then scores.

Tags named after the tool keep calls short and readable for small models, and need no JSON. Every call runs under a
time limit in a thread of its own: a tool that fails, hangs or prints too much gives an observation saying so and the
episode goes on (the tool's ``error`` is recorded), so a policy can learn from its bad calls.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any

from grpo_core.envs.base import Environment, Step, ToolCall
from grpo_core.envs.tools import Tool, ToolError


class ToolEnv(Environment):
    def __init__(self, tools: list[Tool], *, tool_timeout_s: float = 10.0, max_observation_chars: int = 1000,
                 max_calls_per_turn: int = 4):
        if not tools:
            raise ValueError("ToolEnv needs at least one tool")
        self.tools = {t.name: t for t in tools}
        self.tool_timeout_s = tool_timeout_s
        self.max_observation_chars = max_observation_chars
        self.max_calls_per_turn = max_calls_per_turn
        names = "|".join(re.escape(n) for n in self.tools)
        self._call = re.compile(rf"<({names})>(.*?)</\1>", re.DOTALL)
        self._opened = re.compile(rf"<({names})>")

    def step(self, assistant_text: str) -> Step:
        calls = [(m.group(1), m.group(2)) for m in self._call.finditer(assistant_text)]
        if not calls:
            unclosed = self._opened.search(assistant_text)
            if unclosed is None:
                return Step(done=True, reason="answered")
            name = unclosed.group(1)
            record = ToolCall(name=name, input=assistant_text[unclosed.end():], output="",
                              error=f"the <{name}> call is not closed with </{name}>")
            return Step(messages=[{"role": "tool", "content": f"error: {record.error}"}], tool_calls=[record])
        records = [self._run(name, text) for name, text in calls[: self.max_calls_per_turn]]
        messages = [{"role": "tool", "content": r.output} for r in records]
        if len(calls) > self.max_calls_per_turn:
            messages.append({"role": "tool", "content": f"error: at most {self.max_calls_per_turn} calls per turn; "
                                                        f"{len(calls) - self.max_calls_per_turn} not run"})
        return Step(messages=messages, tool_calls=records)

    def _run(self, name: str, text: str) -> ToolCall:
        """One call under the time limit; a hung call's thread is left behind (daemon) and the call recorded as
        timed out."""
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["output"] = self.tools[name].run(text)
            except ToolError as error:
                outcome["error"] = str(error)
            except Exception as error:  # a tool's own bug: shown to the policy and recorded, the episode goes on
                outcome["error"] = f"{name} failed: {type(error).__name__}: {error}"

        started = time.perf_counter()
        worker = threading.Thread(target=call, name=f"tool-{name}", daemon=True)
        worker.start()
        worker.join(self.tool_timeout_s)
        seconds = time.perf_counter() - started
        if worker.is_alive():
            error = f"{name} timed out after {self.tool_timeout_s:g} s"
            return ToolCall(name=name, input=text, output=f"error: {error}", error=error, seconds=seconds)
        error = outcome.get("error")
        output = f"error: {error}" if error is not None else str(outcome.get("output", ""))
        if len(output) > self.max_observation_chars:
            cut = len(output) - self.max_observation_chars
            output = output[: self.max_observation_chars] + f"\n[... {cut} characters cut]"
            error = error or f"output longer than {self.max_observation_chars} characters (cut)"
        return ToolCall(name=name, input=text, output=output, error=error, seconds=seconds)
