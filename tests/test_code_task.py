"""The built-in code task: committed splits that are disjoint and reproducible, held-out problems that combine parts
seen in train, and test cases that the correct program passes in the sandbox while the warm-up's near misses fail."""
from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.data import code_task
from grpo_core.data.readers import read_prompts
from grpo_core.lifecycle.model import tiny
from grpo_core.rewards.accuracy import code_accuracy
from grpo_core.infra.sandbox import Sandbox, SandboxLimits

pytestmark = pytest.mark.usefixtures("jail_shared")  # runs programs in the sandbox (tests/jail.py)

DATA = Path(__file__).resolve().parents[1] / "data" / "code"


def test_splits_are_disjoint_reproducible_and_match_committed_files(tmp_path):
    written = code_task.write_splits(tmp_path)
    for split, path in written.items():
        assert path.read_text() == (DATA / f"{split}.jsonl").read_text(), f"{split} differs from committed file"
    train = [code_task.parse_question(r["messages"]["content"]) for r in code_task.make_rows("train")]
    evals = [code_task.parse_question(r["messages"]["content"]) for r in code_task.make_rows("eval")]
    assert len(evals) == code_task.EVAL_SIZE and len(train) + len(evals) == len(code_task.all_problems())
    assert not set(train) & set(evals)
    # every part of a held-out problem occurs in train: the eval split measures composition, not memory
    for part in ("layout", "operation", "constant"):
        assert {getattr(p, part) for p in evals} <= {getattr(p, part) for p in train}
    assert code_task.make_rows("eval", seed=1) != code_task.make_rows("eval")
    assert read_prompts(str(DATA / "eval.jsonl"), format="code").rows[0]["test_cases"]["inputs"]


def test_question_round_trip_and_unknown_questions():
    p = code_task.Problem("lines", "max", 17)
    assert code_task.parse_question(p.question()) == p
    assert p.program() == "a = int(input())\nb = int(input())\nprint(max(a, b) + 17)"
    assert p.response(2).endswith("print(max(a, b) + 19)\n```")
    with pytest.raises(ValueError, match="not a built-in code problem"):
        code_task.parse_question("Print the sum.")


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits())


@pytest.mark.parametrize("layout", sorted(code_task.LAYOUTS))
def test_correct_programs_pass_and_near_misses_fail_in_the_sandbox(sandbox, layout):
    rows = [r for r in code_task.make_rows("eval")
            if code_task.parse_question(r["messages"]["content"]).layout == layout]
    seen = set()
    for row in rows:
        problem = code_task.parse_question(row["messages"]["content"])
        if problem.operation in seen:
            continue
        seen.add(problem.operation)
        assert code_accuracy(problem.response(), row, sandbox).value == 1.0, problem
        for offset in (1, 2):  # the warm-up's near misses never pass: each test has its own operands
            verdict = code_accuracy(problem.response(offset), row, sandbox)
            assert verdict.value == 0.0 and "0/3 tests passed" in verdict.note, (problem, verdict)
        wrong_layout = code_task.Problem("line" if layout == "lines" else "lines", problem.operation,
                                         problem.constant)
        assert code_accuracy(wrong_layout.response(), row, sandbox).value == 0.0
    assert seen == set(code_task.OPERATIONS)


def test_tiny_code_task_reads_the_split_and_checks_responses_as_text():
    rows = tiny.CODE.read(DATA / "train.jsonl")
    user, problem = rows[0]
    assert user == problem.question()
    assert tiny.CODE.correct(tiny.CODE.respond(problem, 0), problem)
    assert not tiny.CODE.correct(tiny.CODE.respond(problem, 1), problem)
    assert tiny.CODE.parsed(tiny.CODE.respond(problem, 1)) and not tiny.CODE.parsed("\\boxed{3}")
    assert tiny.ARITH.correct("\\boxed{5}", 5) and not tiny.ARITH.correct("\\boxed{6}", 5)


def test_tiny_code_build_writes_a_loadable_policy_whose_prompts_fit_the_config(tmp_path):
    """A short build (the real one: `grpo model tiny-code`, `make model-code`): the folder loads with transformers,
    and every prompt of the task, with the code system prompt, fits configs/tiny-code.yaml's max_prompt_tokens."""
    import json

    from transformers import AutoTokenizer

    from grpo_core.config import load_config
    from grpo_core.pipeline.prompts import PromptTokenizer

    spec = tiny.TinySpec(**{**tiny.TINY_CODE_SPEC.__dict__, "clean_steps": 2, "noisy_steps": 1, "batch_size": 4,
                            "clean_retry_rounds": 0, "noisy_extra_chunks": 0})  # no check's extra rounds
    metrics = tiny.build_tiny(tmp_path / "m", task="code", spec=spec, log=lambda _: None)
    assert metrics["task"] == "code" and json.loads((tmp_path / "m" / "build_metrics.json").read_text())["task"] \
        == "code"
    cfg = load_config(DATA.parents[1] / "configs" / "tiny-code.yaml")
    encoder = PromptTokenizer(AutoTokenizer.from_pretrained(tmp_path / "m"), "code", None, cfg.data.max_prompt_tokens)
    for split in ("train", "eval"):
        for row in read_prompts(str(DATA / f"{split}.jsonl"), format="code").rows:
            encoder.encode(row, split)  # raises DataError if a prompt is longer than max_prompt_tokens
