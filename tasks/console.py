"""What the Prefect UI shows about a training run: progress, the metrics table, evaluations and the summary.

Artifacts are keyed by the run name (``<run>-progress``, ``<run>-metrics``, ``<run>-eval``, ``<run>-summary``), so
the Artifacts page keeps one history per training run across its flow runs (a resume or a retry adds versions),
and each flow run's Artifacts tab lists what it created. Everything here is called from the flow, never from inside
the engines; a failure to reach the Prefect API is the flow's failure like any other (the same API records the
task runs).

The progress and metrics-table artifacts are published at most every ``logging.console_interval_s`` seconds (and at
every evaluation, at the last iteration and when the run stops): each publication is a synchronous request to the
Prefect API carrying the whole table, about 40 ms on the tiny task, where an iteration takes 0.6 s.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable

from prefect.artifacts import (
    create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact,
)

from tasks.results import EvalResult

# The columns of the metrics table artifact (the rest stay in metrics.parquet).
TABLE_COLUMNS = ("iteration", "policy_version", "reward_mean", "nll", "reverse_kl", "accuracy_mean",
                 "eval_accuracy", "loss", "grad_norm", "entropy", "clipfrac", "response_length_mean", "staleness_max",
                 "sync_logprob_max_diff", "samplers", "time_total_s")
SPARKS = "▁▂▃▄▅▆▇█"


def artifact_key(run_name: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-") or "run"


def sparkline(values: list[float], low: float = 0.0, high: float = 1.0) -> str:
    """A curve in one line of text: the markdown artifact's view of accuracy over evaluations."""
    span = (high - low) or 1.0
    return "".join(SPARKS[min(len(SPARKS) - 1, max(0, int((v - low) / span * (len(SPARKS) - 1) + 0.5)))]
                   for v in values)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6 if abs(value) < 1e-2 else 4)
    return value


def _md(text: Any, limit: int = 160) -> str:
    s = str(text).replace("|", "\\|").replace("\n", " ⏎ ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def eval_markdown(run_name: str, iteration: int, result: EvalResult, history: list[float]) -> str:
    """Accuracy, its curve so far, and the best and worst completions of one evaluation."""
    mean = "none scored" if result.reward_mean is None else f"{result.reward_mean:.3f}"
    lines = [f"## {run_name}: evaluation at iteration {iteration}", "",
             f"**accuracy {result.accuracy:.3f}** ({'greedy' if result.greedy else 'sampled'}, "
             f"{result.rows} responses, policy version {result.policy_version}, mean reward {mean})", ""]
    sets = result.metrics
    if len({k.split("/")[1] for k in sets}) > 1 or any("pass@" in k for k in sets):  # named sets, pass@k
        lines += ["| metric | value |", "|---|---|"] + [f"| `{k}` | {v:.3f} |" for k, v in sets.items()
                                                         if not k.endswith(("/prompts", "/unscored"))] + [""]
    if history:
        lines += [f"accuracy over evaluations: `{sparkline(history)}` "
                  f"({' → '.join(f'{a:.2f}' for a in history[-8:])})", ""]
    for title, rows in (("Best", result.best), ("Worst", result.worst)):
        if rows:
            lines += [f"### {title}", "", "| prompt | response | answer | reward |", "|---|---|---|---|"]
            lines += [f"| {_md(r['prompt'])} | {_md(r['response'])} | {_md(r.get('answer', ''), 40)} | "
                      f"{r['reward']:.3f} |" for r in rows]
            lines.append("")
    episodes = [r for r in result.best[:2] + result.worst[:1] if r.get("turns")]
    if episodes:  # multi-turn: a few episodes turn by turn
        lines += ["### Episodes", ""]
        for r in episodes:
            lines += [f"**{_md(r['prompt'])}** (reward {r['reward']:.3f})", ""]
            lines += [f"- `{t['role']}`: {_md(t['text'], 300)}" + (f" — error: {_md(t['errors'])}"
                                                                 if t.get("errors") else "") for t in r["turns"]]
            lines.append("")
    return "\n".join(lines)


class RunConsole:
    """The artifacts of one flow run of a training run."""

    def __init__(self, run_name: str, iterations: int, rows: list[dict[str, Any]], min_interval_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.run_name, self.iterations = run_name, iterations
        self.key = artifact_key(run_name)
        self.rows = [r for r in rows if r.get("iteration", iterations) < iterations]
        self.evals = [r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None]
        self.min_interval_s, self._clock = min_interval_s, clock
        self._published_at: float | None = None
        self._unpublished = 0  # iterations done since the table was last published
        self._progress = create_progress_artifact(
            progress=self._percent(), key=f"{self.key}-progress",
            description=f"{run_name}: iterations done of {iterations}")

    def _percent(self) -> float:
        return 100.0 * len({r["iteration"] for r in self.rows}) / self.iterations

    def iteration_done(self, row: dict[str, Any]) -> None:
        self.rows = [r for r in self.rows if r["iteration"] != row["iteration"]] + [row]
        self._unpublished += 1
        due = self._published_at is None or self._clock() - self._published_at >= self.min_interval_s
        if due or row["iteration"] >= self.iterations - 1:
            self.publish()

    def publish(self) -> None:
        """Send the progress and the metrics table if iterations finished since they were last sent."""
        if not self._unpublished:
            return
        update_progress_artifact(self._progress, progress=self._percent())
        create_table_artifact(
            table=[{c: _cell(r.get(c)) for c in TABLE_COLUMNS} for r in self.rows], key=f"{self.key}-metrics",
            description=f"{self.run_name}: one row per iteration (all columns in metrics.parquet)")
        self._published_at, self._unpublished = self._clock(), 0

    def evaluation(self, iteration: int, result: EvalResult) -> None:
        self.publish()
        self.evals.append(result.accuracy)
        create_markdown_artifact(markdown=eval_markdown(self.run_name, iteration, result, self.evals),
                                 key=f"{self.key}-eval",
                                 description=f"{self.run_name}: accuracy {result.accuracy:.3f} at iteration "
                                             f"{iteration}")

    def summary(self, lines: list[str], final_folder: str, latest_checkpoint: str | None) -> None:
        md = [f"## {self.run_name}: finished", "", f"- final policy: `{final_folder}`",
              f"- latest checkpoint: `{latest_checkpoint or 'none'}`"]
        if self.evals:
            md.append(f"- eval accuracy: {self.evals[0]:.3f} → {self.evals[-1]:.3f} `{sparkline(self.evals)}`")
        md += ["", "```", *lines, "```"]
        create_markdown_artifact(markdown="\n".join(md), key=f"{self.key}-summary",
                                 description=f"{self.run_name}: final policy, checkpoints and figures")
