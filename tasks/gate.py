"""The eval gate as a Prefect task: ``grpo_core.lifecycle.promotion.run_gate``, its decision published as a markdown artifact
(``<run>-gate``) beside the run's other artifacts."""
from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from grpo_core.config import GRPOConfig
from grpo_core.run.logs import LOGS, process_output_to
from grpo_core.lifecycle.promotion import GateOutcome, evaluate_policy, run_gate
from grpo_core.run.storage import RunStore
from tasks.console import artifact_key

GATE_LOG = f"{LOGS}/gate.log"


def _figure(key: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if key.endswith(("/prompts", "/unscored")) else f"{value:.4f}"


def gate_markdown(outcome: GateOutcome) -> str:
    """The decision, both sides' figures and the reason, as the Prefect UI shows them."""
    d = outcome.decision or {}
    head = {"promoted": "PROMOTED", "refused": "REFUSED", "registry_unavailable": "NOT PROMOTED"}[outcome.outcome]
    lines = [f"# Gate: {head}", "", outcome.reason, "",
             f"- run: `{outcome.run}`", f"- registry: `{outcome.registry}`"]
    if outcome.version is not None:
        lines.append(f"- registered as version **{outcome.version}**")
    if outcome.compared_with is not None:
        lines.append(f"- compared against the champion, version {outcome.compared_with}")
    figures = sorted(k for k in outcome.challenger if k.startswith("eval/"))
    if figures:
        lines += ["", "| figure | challenger | champion |", "|---|---|---|"]
        for key in figures:
            lines.append(f"| {key} | {_figure(key, outcome.challenger[key])} | "
                         f"{_figure(key, (outcome.champion or {}).get(key))} |")
    if d:
        lines += ["", f"Gate metric `{d['metric']}`: challenger {d['challenger']:.4f}, threshold "
                      f"{d['threshold']:.4f}."]
        for g in d.get("guards", []):
            lines.append(f"- guard `{g['figure']}`: {g['challenger']:.4f} against {g['champion']:.4f}, tolerance "
                         f"{g['tolerance']:.4f}: {'held' if g['held'] else 'FAILED'}")
    return "\n".join(lines)


def _upload_if_written(store: RunStore, log_file: str) -> None:
    """A remote run folder gets the gate's log once the evaluations wrote it."""
    if os.path.exists(log_file):
        store.put_file(GATE_LOG, log_file)


@task(name="gate", cache_policy=NONE)
def gate(cfg: GRPOConfig, store: RunStore) -> GateOutcome:
    """Evaluate the challenger and the champion, decide, register (see grpo_core/lifecycle/promotion.py). The evaluations'
    engine output goes to the run's logs/gate.log (the terminal with logging.verbose)."""
    with ExitStack() as stack:
        log_file = store.local_path(GATE_LOG)
        if log_file is None:
            log_file = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="grpo-gate-")), "gate.log")
            stack.callback(_upload_if_written, store, log_file)

        def evaluate(cfg: GRPOConfig, run: str, root: str) -> dict[str, float]:
            if cfg.logging.verbose:
                return evaluate_policy(cfg, run, root)
            with process_output_to(log_file):
                return evaluate_policy(cfg, run, root)
        outcome = run_gate(cfg, store, evaluate)
    create_markdown_artifact(markdown=gate_markdown(outcome), key=f"{artifact_key(cfg.run_name)}-gate",
                             description=f"eval gate of run {cfg.run_name}: {outcome.outcome}")
    return outcome
