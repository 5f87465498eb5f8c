"""A training client's optimizer steps as curves in the project's metric sinks (TensorBoard by default, W&B, MLflow).

``requests.jsonl`` keeps every request; a person looks at curves. One row per ``optim_step``, logged at the client's
step count: what the ``forward_backward`` calls since the previous step added up to (``loss_sum``, ``tokens``,
``datums``, ``forward_backward_calls``) and the step's own figures (``grad_norm``, ``learning_rate``). Each training
client is a run of its own in the sinks, named by its folder in the service's run folder. The sinks open with the
client, so a backend that cannot be used fails its creation, before anything trains. A client whose state is loaded
continues at that state's step: its sinks reopen there, and TensorBoard drops what an earlier timeline logged from
that step on, as a resumed flow run's does.
"""
from __future__ import annotations

from typing import Any

from grpo_core.run.metric_sinks import MetricSinks, SinkSettings
from grpo_core.run.storage import RunStore


class StepLog:
    """One training client's rows, from ``next_step`` (the step count its next ``optim_step`` reaches)."""

    def __init__(self, settings: SinkSettings, store: RunStore, next_step: int):
        self.settings, self.store = settings, store
        self.sinks: MetricSinks | None = None
        self._reset()
        self._open(next_step)

    def _open(self, next_step: int) -> None:
        if self.settings.backends:
            self.sinks = MetricSinks(self.settings, self.store, start_step=next_step)

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
        row = {"iteration": int(metrics["step"]), "loss_sum": self.loss_sum, "tokens": self.tokens,
               "datums": self.datums, "forward_backward_calls": self.calls, "grad_norm": float(metrics["grad_norm"]),
               "learning_rate": float(metrics["learning_rate"])}
        self._reset()
        if self.sinks is not None:
            self.sinks.log(row)
        return row

    def restart(self, next_step: int) -> None:
        """The client's state was loaded: the gradients it had are gone, and its timeline goes on from the loaded
        step."""
        self.close()
        self._reset()
        self._open(next_step)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
            self.sinks = None
