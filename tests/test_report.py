"""The run report: curves PNG and summary lines from a metrics table."""

from __future__ import annotations

import struct

import pyarrow as pa

from grpo_core.run.report import metrics_table, plot_curves, plot_timeline, stage_spans, summary_lines

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _metrics() -> pa.Table:
    return pa.table(
        {
            "iteration": [0, 1, 2, 3],
            "reward_mean": [0.1, 0.25, 0.4, 0.55],
            "eval_accuracy": [0.2, None, 0.35, None],
            "time_rollout_s": [2.0, 1.0, 1.0, 2.0],
            "time_score_s": [0.5, 0.5, 0.5, 0.5],
            "time_train_s": [3.0, 3.0, 3.0, 3.0],
        }
    )


def _png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == PNG_SIGNATURE
    assert png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def test_plot_curves_is_a_png():
    png = plot_curves(_metrics())
    width, height = _png_size(png)
    assert (width, height) == (800, 600)
    assert len(png) > 5000  # two drawn panels, not an empty canvas


def test_stage_spans_and_timeline():
    table = pa.table({
        "iteration": [0, 1, 2],
        "rollout_started_at": [0.0, 1.0, None], "rollout_ended_at": [1.0, 2.5, None],
        "train_started_at": [1.0, 2.6, 4.0], "train_ended_at": [2.6, 4.0, 5.5],
    })
    spans = stage_spans(table)
    assert spans["rollout"] == [(0, 0.0, 1.0), (1, 1.0, 2.5)]  # a row without timestamps has no bar
    assert spans["train"][2] == (2, 4.0, 5.5) and spans["score"] == [] and spans["sync"] == []
    width, height = _png_size(plot_timeline(table))
    assert width == 1000 and height >= 300
    assert _png_size(plot_timeline(pa.table({"iteration": pa.array([], pa.int64())})))[0] == 1000


def test_plot_curves_survives_missing_columns_and_empty_table():
    only_reward = pa.table({"iteration": [0, 1], "reward_mean": [0.0, 1.0]})
    assert _png_size(plot_curves(only_reward)) == (800, 600)
    empty = pa.table({"iteration": pa.array([], pa.int64())})
    assert _png_size(plot_curves(empty)) == (800, 600)


def test_summary_lines():
    lines = summary_lines(_metrics())
    assert lines[0] == "iterations: 4 (0..3)"
    assert lines[1] == "eval accuracy: first 0.2 (iteration 0) -> last 0.35 (iteration 2)"
    assert lines[2] == "reward mean: first 0.1 (iteration 0) -> last 0.55 (iteration 3)"
    assert lines[3] == "mean seconds per stage: rollout 1.5, score 0.5, train 3"
    assert lines[4] == "total time: 20 s (sum of stage times)"


def test_summary_lines_prefers_recorded_total_and_handles_gaps():
    table = pa.table(
        {
            "iteration": [5, 4],
            "reward_mean": [0.9, 0.8],
            "eval_accuracy": pa.array([None, None], pa.float64()),
            "time_rollout_s": [1.0, None],
            "time_total_s": [2.5, 3.5],
        }
    )
    lines = summary_lines(table)
    assert lines[0] == "iterations: 2 (4..5)"
    assert lines[1] == "eval accuracy: none recorded"
    assert lines[2] == "reward mean: first 0.8 (iteration 4) -> last 0.9 (iteration 5)"
    assert lines[3] == "mean seconds per stage: rollout 1"
    assert lines[4] == "total time: 6 s over 2 iterations"
    assert summary_lines(pa.table({"iteration": pa.array([], pa.int64())})) == ["iterations: 0"]


def test_metrics_table_renders_last_rows():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(metrics_table(_metrics(), columns=["iteration", "reward_mean", "nope"], last=2))
    text = console.export_text()
    assert "reward_mean" in text and "0.55" in text and "0.4" in text
    assert "0.25" not in text and "nope" not in text
