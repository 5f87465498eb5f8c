"""Running untrusted Python code with no network, no host files and hard limits (nsjail).

    sandbox = Sandbox(SandboxLimits(cpu_time_s=2))        # raises SandboxUnavailable if no jail can start
    result = sandbox.run("print(input()[::-1])", stdin="abc\\n")
    outcome = check_tests(program, inputs, outputs, sandbox=sandbox)

Each run's whole process tree is capped (memory, processes) by a cgroup where the host allows one; see
grpo_core.infra.sandbox.cgroups. Code scoring must refuse (not fall back to running unsandboxed) when SandboxUnavailable is
raised.
"""

from grpo_core.infra.sandbox.cgroups import TreeCaps, TreeUsage, detect_tree_caps
from grpo_core.infra.sandbox.checking import TestOutcome, check_tests, normalize_output, outputs_match
from grpo_core.infra.sandbox.limits import MemoryBudget, SandboxLimits, memory_budget
from grpo_core.infra.sandbox.nsjail import SandboxUnavailable
from grpo_core.infra.sandbox.runner import RunResult, Sandbox

__all__ = [
    "MemoryBudget",
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "TestOutcome",
    "TreeCaps",
    "TreeUsage",
    "check_tests",
    "detect_tree_caps",
    "memory_budget",
    "normalize_output",
    "outputs_match",
]
