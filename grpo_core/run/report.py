"""The run report: training curves as a PNG, a few summary lines, a metrics table.

Why: after (or during) a run the user wants one glance at whether reward and eval accuracy
went up and where the time went, without opening a notebook. Everything here reads the
``metrics.parquet`` table (one row per iteration) and returns data (PNG bytes, strings, a rich
Table); writing it somewhere is the caller's job (``RunStore.put_bytes``).

Column conventions: ``iteration``, ``reward_mean`` (or ``nll`` in SFT runs), ``eval_accuracy`` (null on iterations
without an evaluation), ``time_<stage>_s`` (seconds spent in a stage), and optionally
``time_total_s`` (wall time of the whole iteration; otherwise the stage times are summed).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

_STAGE_TIME = re.compile(r"^time_(.+)_s$")
_TOTAL_TIME = "time_total_s"
@dataclass(frozen=True)
class Headline:
    """An iteration's training signal as the line, the bar, the summary and the curves show it."""
    column: str   # in metrics.parquet
    label: str    # on the iteration line and the progress bar
    summary: str  # in the summary's first -> last line
    title: str    # of the curve


# The mean reward of its groups (RL), or the negative log-likelihood of its conversations' assistant turns (SFT, where
# nothing is rewarded): the first that a table or row holds is shown.
HEADLINES = (Headline("reward_mean", "reward", "reward mean", "mean reward per iteration"),
             Headline("nll", "nll", "nll", "negative log-likelihood per assistant token"))


def is_trained_row(row: dict) -> bool:
    """A metrics row of an iteration that trained (not the final evaluation-only row): it has a loss, or a reward
    (RL)."""
    return row.get("loss") is not None or row.get("reward_mean") is not None


def headline(row: dict) -> tuple[str, float | None]:
    """(label, value) of the row's training signal (``HEADLINES``); the first label and None when it has none."""
    for h in HEADLINES:
        if row.get(h.column) is not None:
            return h.label, row[h.column]
    return HEADLINES[0].label, None


def headline_of(metrics: pa.Table) -> Headline:
    """The table's training signal: the first of ``HEADLINES`` with a recorded value."""
    return next((h for h in HEADLINES if _points(metrics, h.column)[0]), HEADLINES[0])


def _points(metrics: pa.Table, column: str) -> tuple[list[int], list[float]]:
    """(iterations, values) where ``column`` is present and not null/NaN, sorted by iteration."""
    if column not in metrics.column_names or "iteration" not in metrics.column_names:
        return [], []
    pairs = sorted(
        (int(i), float(v))
        for i, v in zip(metrics["iteration"].to_pylist(), metrics[column].to_pylist())
        if i is not None and v is not None and not (isinstance(v, float) and math.isnan(v))
    )
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def plot_curves(metrics: pa.Table, title: str = "GRPO training curves") -> bytes:
    """PNG of reward_mean per iteration (top) and eval_accuracy where evaluated (bottom)."""
    # Figure without pyplot: no global figure registry, and the Agg canvas needs no display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_reward, ax_eval = fig.subplots(2, 1, sharex=True)
    fig.suptitle(title)

    signal = headline_of(metrics)
    its, rewards = _points(metrics, signal.column)
    if its:
        ax_reward.plot(its, rewards, marker="o", markersize=3, linewidth=1.5, color="tab:blue")
    else:
        ax_reward.text(0.5, 0.5, f"no {signal.column} recorded", ha="center", va="center",
                       transform=ax_reward.transAxes)
    ax_reward.set_ylabel(signal.column)
    ax_reward.set_title(signal.title, fontsize=10)
    ax_reward.grid(True, alpha=0.3)

    its, accs = _points(metrics, "eval_accuracy")
    if its:
        ax_eval.plot(its, accs, marker="o", markersize=5, linewidth=1, linestyle="--", color="tab:green")
    else:
        ax_eval.text(0.5, 0.5, "no eval_accuracy recorded", ha="center", va="center", transform=ax_eval.transAxes)
    ax_eval.set_ylabel("eval_accuracy")
    ax_eval.set_xlabel("iteration")
    ax_eval.set_title("eval accuracy (iterations with an evaluation)", fontsize=10)
    ax_eval.grid(True, alpha=0.3)
    ax_eval.xaxis.set_major_locator(MaxNLocator(integer=True))

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


TIMELINE_STAGES = (("rollout", "tab:blue"), ("score", "tab:orange"), ("train", "tab:green"), ("sync", "tab:red"))


def stage_spans(metrics: pa.Table) -> dict[str, list[tuple[int, float, float]]]:
    """Per stage, (iteration, started_at, ended_at) of every row that has both ``<stage>_started_at`` and
    ``<stage>_ended_at`` (seconds since the flow run started; the rollout and score of a row are those of its
    batch, which in async RL ran during an earlier iteration)."""
    rows = metrics.to_pylist()
    spans: dict[str, list[tuple[int, float, float]]] = {}
    for stage, _ in TIMELINE_STAGES:
        spans[stage] = [(int(r["iteration"]), float(r[f"{stage}_started_at"]), float(r[f"{stage}_ended_at"]))
                        for r in rows if r.get(f"{stage}_started_at") is not None
                        and r.get(f"{stage}_ended_at") is not None]
    return spans


def plot_timeline(metrics: pa.Table, title: str = "stages over time") -> bytes:
    """PNG: one lane per iteration, a bar per stage from its start to its end (seconds since the flow run
    started). Overlapping bars of neighbouring lanes show rollout running while training does (async RL)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    spans = stage_spans(metrics)
    lanes = sorted({it for stage in spans.values() for it, _, _ in stage})
    fig = Figure(figsize=(10, max(3.0, 0.25 * len(lanes) + 1.5)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    fig.suptitle(title)
    if not lanes:
        ax.text(0.5, 0.5, "no stage timestamps recorded", ha="center", va="center", transform=ax.transAxes)
    for stage, color in TIMELINE_STAGES:
        for it, start, end in spans[stage]:
            ax.broken_barh([(start, max(end - start, 1e-3))], (it - 0.4, 0.8), color=color)
    ax.set_xlabel("seconds since the flow run started")
    ax.set_ylabel("iteration")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in TIMELINE_STAGES], loc="upper right", fontsize=8)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _first_last(metrics: pa.Table, column: str, label: str) -> str:
    its, values = _points(metrics, column)
    if not its:
        return f"{label}: none recorded"
    if len(its) == 1:
        return f"{label}: {_fmt(values[0])} (iteration {its[0]})"
    return (
        f"{label}: first {_fmt(values[0])} (iteration {its[0]}) -> "
        f"last {_fmt(values[-1])} (iteration {its[-1]})"
    )


def stage_columns(metrics: pa.Table) -> list[tuple[str, str]]:
    """(stage, column) for every ``time_<stage>_s`` column except ``time_total_s``, in table order."""
    return [
        (m.group(1), name)
        for name in metrics.column_names
        if (m := _STAGE_TIME.match(name)) and name != _TOTAL_TIME
    ]


def summary_lines(metrics: pa.Table) -> list[str]:
    """Iterations, eval accuracy and reward first/last, mean seconds per stage, total time."""
    iterations = [i for i in (metrics["iteration"].to_pylist() if "iteration" in metrics.column_names else []) if i is not None]
    if not iterations:
        return ["iterations: 0"]
    lines = [f"iterations: {len(iterations)} ({min(iterations)}..{max(iterations)})"]
    lines.append(_first_last(metrics, "eval_accuracy", "eval accuracy"))
    signal = headline_of(metrics)
    lines.append(_first_last(metrics, signal.column, signal.summary))

    stage_means = []
    stage_total = 0.0
    for stage, column in stage_columns(metrics):
        _, values = _points(metrics, column)
        if values:
            stage_means.append(f"{stage} {_fmt(sum(values) / len(values))}")
            stage_total += sum(values)
    lines.append("mean seconds per stage: " + (", ".join(stage_means) if stage_means else "none recorded"))

    _, totals = _points(metrics, _TOTAL_TIME)
    if totals:
        lines.append(f"total time: {_fmt(sum(totals))} s over {len(totals)} iterations")
    elif stage_means:
        lines.append(f"total time: {_fmt(stage_total)} s (sum of stage times)")
    else:
        lines.append("total time: none recorded")
    return lines


def metrics_table(metrics: pa.Table, columns: Sequence[str] | None = None, last: int | None = None):
    """A ``rich.table.Table`` of the metrics (chosen columns, optionally only the last N rows)."""
    from rich.table import Table

    names = [c for c in (columns or metrics.column_names) if c in metrics.column_names]
    rows = metrics.select(names).to_pylist()
    if last is not None:
        rows = rows[-last:] if last > 0 else []
    table = Table(title="metrics")
    for name in names:
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(*("" if row[n] is None else _fmt(row[n]) if isinstance(row[n], float) else str(row[n]) for n in names))
    return table
