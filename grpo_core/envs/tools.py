"""Tools an episode can call: a ``calculator`` (exact arithmetic, in-process) and ``python`` (a program run in the
nsjail sandbox, its stdout back as the observation), plus user tools as ``module:Class`` / ``file.py:Class``.

A tool is a class with a ``name`` and ``run(text) -> str``; it raises ``ToolError`` for a bad call (the message
becomes the observation, so the policy sees what went wrong and the episode goes on).
"""
from __future__ import annotations

import ast
import operator
import threading
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any, Callable


class ToolError(ValueError):
    """A call the tool could not answer; the message is shown to the policy as the tool's output."""


class Tool(ABC):
    name: str = ""

    @abstractmethod
    def run(self, text: str) -> str:
        """The observation for one call whose input is ``text``."""


# ------------------------------------------------------------------------------------------------- calculator

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class Calculator(Tool):
    """Exact arithmetic on integers and decimals: ``+ - * / // % **`` and parentheses. Division is exact
    (fractions), the answer an integer when it is one, else a decimal to ``digits`` significant digits.

    Bounded so that a call cannot hang the episode: at most ``max_chars`` of input, exponents up to
    ``max_exponent``, results up to ``max_digits`` digits."""

    name = "calculator"

    def __init__(self, max_chars: int = 200, max_exponent: int = 64, max_digits: int = 64, digits: int = 12):
        self.max_chars, self.max_exponent, self.max_digits, self.digits = max_chars, max_exponent, max_digits, digits

    def run(self, text: str) -> str:
        expr = text.strip().replace("×", "*").replace("^", "**")
        if not expr:
            raise ToolError("calculator: empty expression")
        if len(expr) > self.max_chars:
            raise ToolError(f"calculator: expression longer than {self.max_chars} characters")
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError as error:
            raise ToolError(f"calculator: cannot parse {expr!r}: {error.msg}") from error
        value = self._eval(tree.body)
        if value.denominator == 1:
            return str(value.numerator)
        return f"{float(value):.{self.digits}g}"

    def _eval(self, node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](self._eval(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self._eval(node.left), self._eval(node.right)
            if isinstance(node.op, ast.Pow):
                if right.denominator != 1 or abs(right) > self.max_exponent:
                    raise ToolError(f"calculator: exponents must be integers up to {self.max_exponent}")
                right = int(right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ToolError("calculator: division by zero")
            value = Fraction(_BINARY[type(node.op)](left, right))
            if max(len(str(abs(value.numerator))), len(str(value.denominator))) > self.max_digits:
                raise ToolError(f"calculator: a result has more than {self.max_digits} digits")
            return value
        raise ToolError(f"calculator: only numbers, + - * / // % ** and parentheses are allowed, not "
                        f"{ast.unparse(node)!r}")


# ------------------------------------------------------------------------------------------------- python

class PythonTool(Tool):
    """Runs the call's text as a Python 3 program in the nsjail sandbox (a fresh jail per call, the sandbox's
    limits); the observation is its stdout, with the last lines of stderr when it fails."""

    name = "python"

    def __init__(self, wall_time_s: float = 5.0, cpu_time_s: float = 2.0, memory_mb: int = 512,
                 max_output_bytes: int = 64 * 1024):
        from grpo_core.infra.sandbox.limits import SandboxLimits

        self.limits = SandboxLimits(wall_time_s=wall_time_s, cpu_time_s=cpu_time_s, memory_mb=memory_mb,
                                    max_output_bytes=max_output_bytes)
        self._sandbox = None
        self._lock = threading.Lock()

    def _jail(self):
        """One Sandbox per tool (it only holds configuration; threads share it), started on first use: its
        construction runs a self-check jail."""
        with self._lock:
            if self._sandbox is None:
                from grpo_core.infra.sandbox.runner import Sandbox

                self._sandbox = Sandbox(self.limits)
            return self._sandbox

    def run(self, text: str) -> str:
        code = _strip_fence(text)
        result = self._jail().run(code)
        if result.ok:
            return result.stdout
        if result.timed_out:
            raise ToolError(f"python: timed out after {self.limits.wall_time_s:g} s\n{result.stdout}")
        if result.output_truncated:
            raise ToolError(f"python: output passed {self.limits.max_output_bytes} bytes; the program was stopped")
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise ToolError(f"{result.stdout}{tail}" if tail else f"python: exit status {result.exit_code}")


def _strip_fence(text: str) -> str:
    """The code of a call written as a fenced block (```python ... ```) or as plain code."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body + "\n"


BUILT_IN_TOOLS: dict[str, type[Tool]] = {"calculator": Calculator, "python": PythonTool}


def make_tool(spec: str, args: dict[str, Any] | None = None) -> Tool:
    """A built-in tool by name, or a user tool class given as ``module:Class`` / ``path/to/file.py:Class``."""
    from grpo_core.rewards.plugins import is_plugin_spec, load_plugin

    if spec in BUILT_IN_TOOLS:
        cls = BUILT_IN_TOOLS[spec]
    elif is_plugin_spec(spec):
        cls = load_plugin(spec)
    else:
        raise ValueError(f"unknown tool {spec!r}: built-in {sorted(BUILT_IN_TOOLS)}, or 'module:Class' / "
                         "'path/to/file.py:Class'")
    tool = cls(**(args or {}))
    if not isinstance(tool, Tool) and not callable(getattr(tool, "run", None)):
        raise TypeError(f"tool {spec!r}: {cls!r} has no run(text) method")
    if not getattr(tool, "name", ""):
        raise TypeError(f"tool {spec!r}: {cls!r} has no name (the tag the policy calls it by)")
    return tool
