"""After training: the eval gate between a run's final policy (the challenger) and the registry's champion, and the
registration of its decision. ``gate.json`` in the run folder holds the outcome, whatever it is.

Order, so that two runs finishing at once promote one at a time and nothing is half-written:
1. the challenger is evaluated on the gate sets (outside the lock: runs evaluate their own policies side by side;
   its figures are kept in ``gate/challenger.json`` so that a retried gate does not evaluate it again);
2. under the registry's lock: the champion is read (if it changed since step 1 began, because another run promoted
   meanwhile, the challenger is compared against the new one and the outcome says so), evaluated with the same
   prompts and seeds, the decision taken, and the challenger registered with it in one all-or-nothing write.
A registry that cannot be reached at any step ends the gate as ``registry_unavailable``: the run's policy stays in
its final/, the registry as it was; running the finished run again (same run_name) retries the gate.
"""
from __future__ import annotations

import getpass
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from grpo_core.lifecycle import lineage
from grpo_core.config import GRPOConfig
from grpo_core.lifecycle.gate import GateDecision, decide, figure_json, figures_read, gate_figures
from grpo_core.lifecycle.registry import ModelRegistry, ModelVersion, RegistryUnavailable, open_registry, registry_uri
from grpo_core.lifecycle.registry.records import utc_now
from grpo_core.run.storage import RunStore

GATE = "gate.json"
CHALLENGER_FIGURES = "gate/challenger.json"
Outcome = Literal["promoted", "refused", "registry_unavailable"]

# (policy folder's run, its storage root) -> eval/<set>/<figure> metrics; the default is grpo eval's code path.
Evaluate = Callable[[GRPOConfig, str, str], dict[str, float]]


@dataclass(frozen=True)
class GateOutcome:
    """What the gate decided for one run, as ``gate.json`` and the Prefect artifact show it."""

    run: str
    outcome: Outcome
    reason: str
    registry: str
    decision: dict[str, Any] | None     # GateDecision.to_json()
    version: int | None                  # the registry version the challenger became (None: not registered)
    compared_with: int | None            # the champion version it was compared against
    champion_changed: str | None         # said when another run promoted while this one was evaluated
    challenger: dict[str, float]         # every eval/<set>/... figure of the challenger
    champion: dict[str, float] | None    # the same of the champion (None: none)
    decided_at: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return figure_json(asdict(self))


def evaluate_policy(cfg: GRPOConfig, run: str, root: str) -> dict[str, float]:
    """A run's final policy on the gate sets, through `grpo eval`'s code (own vLLM engine, same seeds every time)."""
    from grpo_core.lifecycle.offline_eval import evaluate_offline, resolve_policy

    gated = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"datasets": cfg.gate_sets()}),
                                   "data": cfg.data.model_copy(update={"eval_path": None})})
    with ExitStack() as stack:
        policy = resolve_policy(stack, run=run, root=root, storage_options=cfg.storage.options or None)
        return evaluate_offline(gated, policy, None, log=lambda _line: None)["metrics"]


def run_gate(cfg: GRPOConfig, store: RunStore, evaluate: Evaluate = evaluate_policy,
             log: Callable[[str], None] = print) -> GateOutcome:
    """The gate for the finished run in ``store`` (cfg.gate set); writes and returns its outcome."""
    started = time.perf_counter()
    opts = cfg.storage.options or None
    location = registry_uri(cfg.registry, cfg.storage.root)
    try:
        registry = open_registry(cfg.registry, cfg.storage.root, opts)
        location = registry.location
        seen = registry.champion()
        challenger = _challenger_figures(cfg, store, evaluate, log)
        with registry.lock(on_wait=log):
            earlier = _recorded_earlier(registry, store)
            outcome = (_outcome_of(earlier, store, registry, challenger) if earlier is not None else
                       _decide_and_record(cfg, store, registry, seen, challenger, evaluate, log))
    except RegistryUnavailable as err:
        kept = store.get_json_file(CHALLENGER_FIGURES) or {}
        outcome = GateOutcome(store.run_name, "registry_unavailable", f"not promoted: registry unavailable ({err})",
                              location, None, None, None, None, figures_read(kept.get("metrics", {})), None, utc_now(),
                              0.0)
    outcome = replace(outcome, seconds=time.perf_counter() - started)
    store.put_json_file(GATE, outcome.to_json())
    log(f"gate: {outcome.reason}" + (f" -> registry version {outcome.version}" if outcome.version else ""))
    return outcome


def _challenger_figures(cfg: GRPOConfig, store: RunStore, evaluate: Evaluate,
                        log: Callable[[str], None]) -> dict[str, float]:
    """The challenger's figures on the gate sets: evaluated once, kept for a retried gate on the same sets."""
    sets = list(cfg.gate_sets())
    kept = store.get_json_file(CHALLENGER_FIGURES)
    if isinstance(kept, dict) and kept.get("sets") == sets:
        return figures_read(kept["metrics"])
    log(f"gate: evaluating this run's final policy on {', '.join(sets)}")
    metrics = evaluate(cfg, store.run_name, cfg.storage.root)
    store.put_json_file(CHALLENGER_FIGURES, {"sets": sets, "metrics": figure_json(metrics)})
    return metrics


def user() -> str:
    """Who is acting, for the registry's events."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _decide_and_record(cfg: GRPOConfig, store: RunStore, registry: ModelRegistry, seen: ModelVersion | None,
                       challenger: dict[str, float], evaluate: Evaluate,
                       log: Callable[[str], None]) -> GateOutcome:
    gate, sets = cfg.gate, list(cfg.gate_sets())
    champion = registry.champion()
    changed = None
    if (seen.version if seen else None) != (champion.version if champion else None):
        changed = (f"the champion changed from {_named(seen)} to {_named(champion)} while this run was evaluated "
                   f"(another run promoted): compared against {_named(champion)}")
        log(f"gate: {changed}")
    theirs = None
    if champion is not None:
        log(f"gate: evaluating the champion, version {champion.version} (run {champion.run}), on the same prompts "
            "and seeds")
        theirs = evaluate(cfg, champion.run, champion.root)
    decision: GateDecision = decide(gate, gate_figures(challenger, sets, gate.figures),
                                    gate_figures(theirs, sets, gate.figures) if theirs is not None else None)
    reason = decision.reason + (f"; {changed}" if changed else "")
    final = store.get_json_file("final/MANIFEST.json") or {}
    candidate = ModelVersion(
        run=store.run_name, root=cfg.storage.root, policy=store.url("final"),
        policy_version=int(final.get("policy_version", 0)), decision="promoted" if decision.promote else "refused",
        reason=reason, metrics=figure_json({**gate_figures(challenger, sets, gate.figures), **challenger}),
        lineage=lineage.version_lineage(store, cfg.storage.options or None),
        compared_with=champion.version if champion else None,
        champion_metrics=figure_json(theirs) if theirs is not None else None)
    registered = registry.record(candidate, by=f"gate (run {store.run_name}, {user()})")
    return GateOutcome(store.run_name, candidate.decision, reason, registry.location, decision.to_json(),
                       registered.version, candidate.compared_with, changed, challenger, theirs, utc_now(), 0.0)


def _recorded_earlier(registry: ModelRegistry, store: RunStore) -> ModelVersion | None:
    """The version an earlier attempt of this gate registered for this run's policy, if its commit landed: a store
    lost right after the commit ends that attempt ``registry_unavailable``, and the retry must not register the
    same policy twice."""
    policy = store.url("final")
    return next((v for v in registry.versions() if v.run == store.run_name and v.policy == policy), None)


def _outcome_of(version: ModelVersion, store: RunStore, registry: ModelRegistry,
                challenger: dict[str, float]) -> GateOutcome:
    reason = f"{version.reason}; recorded as version {version.version} by an earlier attempt of this gate"
    return GateOutcome(store.run_name, version.decision, reason, registry.location, None, version.version,
                       version.compared_with, None, challenger, version.champion_metrics, utc_now(), 0.0)


def _named(v: ModelVersion | None) -> str:
    return "no champion" if v is None else f"version {v.version} (run {v.run})"


def gate_pending(store: RunStore) -> bool:
    """Whether a finished run still needs its gate: none ran, or the registry was unavailable when it did."""
    doc = store.get_json_file(GATE)
    return not isinstance(doc, dict) or doc.get("outcome") == "registry_unavailable"
