"""The live display of a training run: a progress bar with ETA, and the text of the line per iteration (which the
flow logs, so it reaches the terminal above the bar, the Prefect UI's Logs tab and the run's logs/flow.log)."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from grpo_core.run.report import headline, is_trained_row


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def iteration_line(row: dict[str, Any]) -> str:
    """One metrics row as the line a person reads."""
    label, value = headline(row)
    return (f"iter {row['iteration']:4d}  {label} {_fmt(value, '.3f')}  "
            f"eval_acc {_fmt(row.get('eval_accuracy'), '.3f')}  loss {_fmt(row.get('loss'), '+.4f')}  "
            f"len {_fmt(row.get('response_length_mean'), '.1f')}  "
            f"time {_fmt(row.get('time_total_s', row.get('time_eval_s')), '.2f')}s")


class Progress:
    def __init__(self, total: int, console: Console | None = None, completed: int = 0, label: str = "grpo-train"):
        self.console = console or Console()
        self.bar = RichProgress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.description}"),
                                console=self.console, transient=False)
        self.task = self.bar.add_task("", total=total, completed=completed)

    def __enter__(self) -> "Progress":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, row: dict[str, Any]) -> None:
        if is_trained_row(row):
            label, value = headline(row)
            self.bar.update(self.task, advance=1, description=f"{label} {_fmt(value, '.3f')}")
