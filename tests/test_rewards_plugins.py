"""User reward plugins: loading from a module or a file path, calling with dataset columns, wrong answers rejected."""
from __future__ import annotations

import sys
import textwrap

import pytest

from grpo_core.rewards.plugins import PluginError, call_plugin, load_plugin
from grpo_core.rewards.scorer import Scorer

PLUGIN_SOURCE = textwrap.dedent("""
    def length_bonus(completions, **columns):
        return [len(c) / 10 for c in completions]

    def echo_level(completions, level, **columns):
        return [float(v) if v is not None else None for v in level]

    def wrong_count(completions, **columns):
        return [1.0] * (len(completions) + 1)

    def raises(completions, **columns):
        raise RuntimeError("plugin bug")

    def not_a_number(completions, **columns):
        return ["high"] * len(completions)

    CALLS = []

    def call_number(completions, **columns):  # not a function of its inputs: the how-many-th completion it saw
        out = []
        for _ in completions:
            CALLS.append(1)
            out.append(float(len(CALLS)))
        return out
""")


@pytest.fixture()
def plugin_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(PLUGIN_SOURCE)
    return path


def test_load_by_file_path_and_by_module(plugin_file, monkeypatch):
    by_path = load_plugin(f"{plugin_file}:length_bonus")
    assert by_path(["abcde"]) == [0.5]
    monkeypatch.syspath_prepend(str(plugin_file.parent))
    sys.modules.pop("my_rewards", None)
    by_module = load_plugin("my_rewards:echo_level")
    assert by_module(["x", "y"], level=[1, None]) == [1.0, None]


def test_load_errors_name_the_plugin(plugin_file):
    with pytest.raises(PluginError, match="no_such_module_xyz"):
        load_plugin("no_such_module_xyz:f")
    with pytest.raises(PluginError, match="has no attribute 'missing'"):
        load_plugin(f"{plugin_file}:missing")
    with pytest.raises(PluginError, match="does not exist"):
        load_plugin("/nonexistent/file.py:f")


def test_call_checks_count_and_types(plugin_file):
    with pytest.raises(PluginError, match="'wrong_count' returned 3 values for 2 completions"):
        call_plugin("wrong_count", load_plugin(f"{plugin_file}:wrong_count"), ["a", "b"], {})
    with pytest.raises(PluginError, match="'not_a_number' returned 'high'"):
        call_plugin("not_a_number", load_plugin(f"{plugin_file}:not_a_number"), ["a"], {})


@pytest.mark.timeout(120)
def test_plugins_through_the_scorer(plugin_file):
    options = {"plugins": {"level": f"{plugin_file}:echo_level", "count": f"{plugin_file}:wrong_count",
                           "bug": f"{plugin_file}:raises"}}
    rows = [{"gt_answer": "7", "level": 2}, {"gt_answer": "7", "level": None}]
    completions = ["\\boxed{7}", "\\boxed{7}"]
    with Scorer(rewards=["accuracy", "level", f"{plugin_file}:length_bonus"], weights=[1.0, 0.5, 1.0],
                num_workers=1, options=options) as scorer:
        first, second = scorer.score(completions, rows)
    assert first.components == pytest.approx({"accuracy": 1.0, "level": 2.0, "length_bonus": 0.9})
    assert first.reward == pytest.approx(1.0 + 1.0 + 0.9)
    assert second.components["level"] is None and second.error is None   # None: does not apply, not an error
    assert second.reward == pytest.approx(1.0 + 0.9)
    with Scorer(rewards=["accuracy", "count", "bug"], num_workers=1, options=options) as scorer:
        (result,) = scorer.score(["\\boxed{7}"], [{"gt_answer": "7"}])
    assert result.reward is None and result.components["accuracy"] == 1.0
    assert "'count' returned 2 values for 1 completions" in result.error
    assert "plugin 'bug' failed: RuntimeError: plugin bug" in result.error


@pytest.mark.timeout(120)
def test_identical_pairs_are_verified_once_unless_dedupe_is_off(plugin_file):
    """A batch's identical (completion, row) pairs reach the workers once and share the outcome; a different row or
    completion is its own pair. With dedupe off every completion is verified."""
    completions = ["\\boxed{7}", "\\boxed{7}", "\\boxed{8}", "\\boxed{7}", "\\boxed{7}"]
    rows = [{"gt_answer": "7"}] * 3 + [{"gt_answer": "8"}, {"gt_answer": "7"}]
    rewards = ["accuracy", f"{plugin_file}:call_number"]
    with Scorer(rewards=rewards, num_workers=1) as scorer:
        results = scorer.score(completions, rows)
    calls = [r.components["call_number"] for r in results]
    assert calls[0] == calls[1] == calls[4] and len({calls[0], calls[2], calls[3]}) == 3
    assert [r.components["accuracy"] for r in results] == [1.0, 1.0, 0.0, 0.0, 1.0]
    with Scorer(rewards=rewards, num_workers=1, dedupe=False) as scorer:
        results = scorer.score(completions, rows)
    assert len({r.components["call_number"] for r in results}) == 5
