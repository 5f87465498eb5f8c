"""Code accuracy through the Scorer: correct programs score 1, hostile ones 0 with a reason, every row finishes and
the scorer keeps working. Runs real nsjail sandboxes (grpo_core.infra.sandbox)."""
from __future__ import annotations


import pytest

from grpo_core.rewards.scorer import Scorer

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("jail_shared")]

DOUBLE = {"test_cases": {"inputs": ["2\n", "21\n"], "outputs": ["4\n", "42\n"]}}


def block(code: str, fence: str = "python") -> str:
    return f"Here is my solution.\n```{fence}\n{code}\n```\n"


CORRECT = block("print(int(input()) * 2)")
HOSTILE = {
    "infinite loop": block("while True:\n    pass"),
    "fork bomb": block("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    "huge allocation": block("x = bytearray(8 * 1024 ** 3)\nprint(len(x))"),
    "huge output": block("while True:\n    print('x' * 10000)"),
    "kills its parent": block("import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
                              "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass"),
}


@pytest.fixture(scope="module")
def code_scorer():
    limits = {"cpu_time_s": 1.0, "wall_time_s": 3.0, "memory_mb": 256, "max_processes": 16}
    with Scorer(reward_type="code", num_workers=2, timeout_s=20.0, options={"sandbox": limits}) as scorer:
        yield scorer


def test_correct_and_hostile_programs_in_one_batch(code_scorer):
    completions = [CORRECT, *HOSTILE.values(), block("print(int(input()) * 2)", fence="py")]
    results = code_scorer.score(completions, [DOUBLE] * len(completions))
    assert len(results) == len(completions)
    assert results[0].reward == 1.0 and results[0].error is None
    assert results[-1].reward == 1.0  # ```py fences count too
    for name, result in zip(HOSTILE, results[1:-1]):
        assert result.reward == 0.0, (name, result)
        assert result.components == {"accuracy": 0.0}
        assert result.error, f"{name}: a hostile program must come back with a reason"
    again = code_scorer.score([CORRECT, block("print(0)")], [DOUBLE, DOUBLE])  # the scorer survived
    assert [r.reward for r in again] == [1.0, 0.0]
    assert "wrong answer" in again[1].error


def test_last_python_block_counts_and_missing_block_is_wrong(code_scorer):
    draft_then_fix = block("print(0)") + "Wait, fix:\n" + CORRECT
    results = code_scorer.score([draft_then_fix, "print(int(input())*2)"], [DOUBLE, DOUBLE])
    assert results[0].reward == 1.0
    assert results[1].reward == 0.0 and "no ```python block" in results[1].error


def test_malformed_test_cases_make_the_row_unscorable(code_scorer):
    bad_rows = [{"test_cases": {"inputs": ["1\n"], "outputs": []}}, {"other": 1}]
    results = code_scorer.score([CORRECT, CORRECT], bad_rows)
    assert [r.reward for r in results] == [None, None]
    assert "1 inputs but 0 outputs" in results[0].error
    assert "test_cases" in results[1].error


def test_no_sandbox_is_a_clear_error_not_an_unsandboxed_run(monkeypatch, tmp_path):
    from grpo_core.infra.sandbox import SandboxUnavailable

    # The spawned workers inherit sys.path and PATH: give them an nsjail package without a binary, and no nsjail on PATH.
    fake = tmp_path / "fake" / "nsjail"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "locator.py").write_text("def bundled_nsjail():\n    raise FileNotFoundError('no bundled nsjail')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "fake"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="nsjail"):
        Scorer(reward_type="code", num_workers=1, timeout_s=5.0)
