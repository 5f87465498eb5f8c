"""Answer extraction (last box / tag / python block) and math equivalence with math-verify."""
from __future__ import annotations

import pytest

from grpo_core.rewards.accuracy import RowError, boxed_accuracy, tag_accuracy
from grpo_core.rewards.extract import last_answer_tag, last_boxed_content, last_python_block
from grpo_core.rewards.math_equiv import GoldAnswerError, answers_match


@pytest.mark.parametrize("text, expected", [
    ("The answer is \\boxed{42}.", "42"),
    ("first \\boxed{1}, then \\boxed{2}", "2"),                       # the last box wins
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),         # nested braces
    ("$\\boxed 5$", "5"),
    ("\\fbox{x+1}", "x+1"),
    ("\\boxed{1} and \\fbox{3}", "3"),
    ("\\boxed {7}", "7"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),                             # escaped braces are content
    ("no box here", None),
    ("\\boxed{}", None),
    ("\\boxed{1} then an unclosed \\boxed{2", None),                   # a truncated last box gives no answer
    ("\\boxedx{3}", None),
])
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


def test_last_answer_tag_and_python_block():
    assert last_answer_tag("<answer>1</answer> wait <answer> 2 </answer>") == "2"
    assert last_answer_tag("<answer>  </answer>") is None and last_answer_tag("<answer>1") is None
    text = "```python\nprint(1)\n```\nbetter:\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert last_python_block(text) == "print(2)\n"
    assert last_python_block("```python\n\n```") is None and last_python_block("print(1)") is None


@pytest.mark.parametrize("predicted, gold, equal", [
    ("0.5", "\\frac{1}{2}", True),            # decimal vs fraction
    ("\\frac{1}{2}", "1/2", True),
    ("\\frac{2}{4}", "0.5", True),
    ("0.51", "1/2", False),
    ("\\{2, 1\\}", "\\{1,2\\}", True),        # sets ignore order
    ("\\{1, 3\\}", "\\{1,2\\}", False),
    ("(x+1)^2", "x^2+2x+1", True),            # symbolic equality
    ("x^2+1", "x^2+2x+1", False),
    ("\\sqrt{18}", "3\\sqrt{2}", True),
    ("7", "\\boxed{7}", True),                # boxed gold
    ("8", "7", False),
])
def test_answers_match(predicted, gold, equal):
    assert answers_match(predicted, gold) is equal


def test_unusable_gold_is_an_error_not_a_wrong_answer():
    for _ in range(2):  # answers_match is cached: an error is raised again, never remembered as a verdict
        with pytest.raises(GoldAnswerError):
            answers_match("1", "\\frac{")
    with pytest.raises(RowError, match="gt_answer"):
        boxed_accuracy("\\boxed{1}", {"gt_answer": "   "})
    with pytest.raises(RowError, match="no 'gt_answer' field"):
        boxed_accuracy("\\boxed{1}", {})


def test_accuracy_functions_use_the_last_answer():
    assert boxed_accuracy("\\boxed{3} no, \\boxed{4}", {"gt_answer": "4"}).value == 1.0
    assert boxed_accuracy("\\boxed{4} no, \\boxed{3}", {"gt_answer": "4"}).value == 0.0
    assert boxed_accuracy("the answer is 4", {"gt_answer": "4"}).value == 0.0   # no box, no answer
    assert boxed_accuracy("\\boxed{4}", {"gt_answer": 4}).value == 1.0          # numeric gold from a file
    assert tag_accuracy("<answer>\\boxed{\\frac12}</answer>", {"gt_answer": "0.5"}).value == 1.0
    assert tag_accuracy("<answer>5</answer><answer>6</answer>", {"gt_answer": "5"}).value == 0.0
    assert tag_accuracy("\\boxed{5}", {"gt_answer": "5"}).value == 0.0           # tags required
