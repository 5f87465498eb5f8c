"""The eval gate's decision: does the challenger (a run's final policy) replace the champion? A pure function of the
two sides' figures and the gate's settings, so that the rule is read and tested in one place."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from grpo_core.config import GateConfig


def figure_json(value: Any) -> Any:
    """A record of figures as strict JSON holds it: a figure that nothing measured (NaN, an infinity) is null,
    anywhere in dicts and lists. Only for figures, where NaN means "not measured"; metrics rows keep refusing it."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: figure_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [figure_json(v) for v in value]
    return value


def figures_read(doc: dict[str, Any]) -> dict[str, float]:
    """Figures from such a record: null back to NaN (nothing measured), so that the gate's rule sees it as it was."""
    return {k: float("nan") if v is None else v for k, v in doc.items()}


@dataclass(frozen=True)
class GuardCheck:
    figure: str
    challenger: float
    champion: float
    tolerance: float

    @property
    def held(self) -> bool:
        return self.champion - self.challenger <= self.tolerance


@dataclass(frozen=True)
class GateDecision:
    promote: bool
    reason: str
    metric: str
    challenger: float
    champion: float | None       # None: there was no champion
    threshold: float             # what the challenger's metric had to reach
    guards: tuple[GuardCheck, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return figure_json({**asdict(self), "guards": [{**asdict(g), "held": g.held} for g in self.guards]})


def gate_figures(metrics: dict[str, float], sets: list[str], figures: list[str]) -> dict[str, float]:
    """Each figure (``accuracy``, ``pass@k``) as the mean of ``eval/<set>/<figure>`` over the gate sets."""
    out = {}
    for figure in figures:
        values = [metrics[f"eval/{name}/{figure}"] for name in sets]
        out[figure] = sum(values) / len(values)
    return out


def decide(gate: GateConfig, challenger: dict[str, float], champion: dict[str, float] | None) -> GateDecision:
    """``challenger`` and ``champion``: `gate_figures` of each side (None: no champion yet)."""
    metric, value = gate.metric, challenger[gate.metric]
    if champion is None and not math.isfinite(value):
        return GateDecision(False, f"refused: {metric} is {value} (nothing measured; no champion yet)", metric,
                            value, None, gate.min_value)
    if champion is None:
        promote = value >= gate.min_value
        return GateDecision(promote, f"{'first champion' if promote else 'refused'}: {metric} {value:.4f} "
                                     f"{'>=' if promote else '<'} gate.min_value {gate.min_value:.4f} (no champion "
                                     "yet)", metric, value, None, gate.min_value)
    theirs = champion[metric]
    threshold = theirs + gate.margin
    guards = tuple(GuardCheck(f, challenger[f], champion[f], tol) for f, tol in gate.guards.items())
    lost = [g for g in guards if not g.held]
    if not math.isfinite(value):
        return GateDecision(False, f"refused: {metric} is {value} (nothing measured)", metric, value, theirs,
                            threshold, guards)
    gain = value - theirs
    compared = f"{metric} {value:.4f} against the champion's {theirs:.4f} ({gain:+.4f}"
    if value < threshold - 1e-12:
        return GateDecision(False, f"refused: {compared}, below the margin {gate.margin:.4f})", metric, value, theirs,
                            threshold, guards)
    if lost:
        worst = ", ".join(f"{g.figure} {g.challenger:.4f} against {g.champion:.4f} (lost "
                          f"{g.champion - g.challenger:.4f} > tolerance {g.tolerance:.4f})" for g in lost)
        return GateDecision(False, f"refused: {compared}) but a guard failed: {worst}", metric, value, theirs,
                            threshold, guards)
    return GateDecision(True, f"promoted: {compared} >= margin {gate.margin:.4f})", metric, value, theirs,
                        threshold, guards)
