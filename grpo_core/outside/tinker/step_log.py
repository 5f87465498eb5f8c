"""A training client's optimizer steps as curves in the project's metric sinks (TensorBoard by default, W&B, MLflow).

``requests.jsonl`` keeps every request; a person looks at curves. One row per ``optim_step``, logged at the client's
step count: what the ``forward_backward`` calls since the previous step added up to (``loss_sum``, ``tokens``,
``datums``, ``forward_backward_calls``) and the step's own figures (``grad_norm``, ``learning_rate``). Each training
client is a run of its own in the sinks, named by its folder in the service's run folder. A client whose state is
loaded continues at that state's step: its sinks reopen there, and TensorBoard drops what an earlier timeline logged
from that step on, as a resumed flow run's does.
"""
from __future__ import annotations

from typing import Any

from grpo_core.run.metric_sinks import MetricSinks, SinkSettings
from grpo_core.run.storage import RunStore


class StepLog:
    """One training client's rows; the sinks open at its first step (at the step it starts from)."""

    def __init__(self, settings: SinkSettings, store: RunStore):
        self.settings, self.store = settings, store
        self.sinks: MetricSinks | None = None
        self._reset()

    def _reset(self) -> None:
        self.loss_sum, self.tokens, self.datums, self.calls = 0.0, 0, 0, 0

    def forward_backward(self, metrics: dict[str, float], datums: int, tokens: int) -> None:
        """A ``forward_backward`` whose gradients the next step applies (a ``forward`` adds nothing)."""
        self.loss_sum += float(metrics.get("loss:sum", 0.0))
        self.tokens += tokens
        self.datums += datums
        self.calls += 1

    def optim_step(self, metrics: dict[str, float]) -> dict[str, Any]:
        """The step's row (``iteration``: the client's step count after it), logged to the sinks; returns it."""
        step = int(metrics["step"])
        if not self.settings.backends:
            self._reset()
            return {}
        if self.sinks is None:
            self.sinks = MetricSinks(self.settings, self.store, start_step=step)
        row = {"iteration": step, "loss_sum": self.loss_sum, "tokens": self.tokens, "datums": self.datums,
               "forward_backward_calls": self.calls, "grad_norm": float(metrics["grad_norm"]),
               "learning_rate": float(metrics["learning_rate"])}
        self.sinks.log(row)
        self._reset()
        return row

    def restart(self) -> None:
        """The client's state was loaded: the gradients it had are gone, and its timeline goes on from the loaded
        step (the sinks reopen at the next step)."""
        self.close()
        self._reset()

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
            self.sinks = None
