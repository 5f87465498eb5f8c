"""Tasks that read and write the run folder's own state: the resume plan, the per-iteration record, the end.

They are tasks (not plain calls in the flow) so that their I/O gets the flow run's storage retries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from grpo_core.run import checkpoint

from grpo_core.lifecycle import lineage
from grpo_core.run.checkpoint import CheckpointRef
from grpo_core.config import RESUME_SAFE_FIELDS, ConfigError, GRPOConfig, upgrade_stored_config
from grpo_core.data import files as data_files
from grpo_core.pipeline.evaluation import eval_files_key
from grpo_core.run.report import is_trained_row
from grpo_core.engine.results import Scaled
from grpo_core.run.status import FINAL_MANIFEST, RunStatus, read_status
from grpo_core.run.storage import RunStore
from tasks.context import RunContext


@dataclass
class RunPlan:
    """Where a flow run starts: a fresh run, a resume from a checkpoint, or a run that is already finished."""

    status: RunStatus
    checkpoint: CheckpointRef | None
    start_iteration: int
    config_changes: list[str]
    existed: bool
    finished: bool


@task(name="prepare-run", cache_policy=NONE)
def prepare_run(cfg: GRPOConfig, store: RunStore) -> RunPlan:
    """Record the config (an existing run refuses changes that alter the result), find the checkpoint to resume
    from, drop metrics rows of iterations that will be redone, and mark the run as running."""
    existed = store.read_config() is not None
    changes = store.write_config(cfg.recorded(), may_change=RESUME_SAFE_FIELDS,
                                 upgrade=upgrade_stored_config)
    previous = read_status(store)
    ref = checkpoint.latest(store) if existed else None
    if ref is not None and ref.next_iteration > cfg.iterations:
        raise ConfigError(f"iterations={cfg.iterations}, but run {store.run_name} has already trained through "
                          f"iteration {ref.iteration} ({store.url(ref.path)}); set iterations >= "
                          f"{ref.next_iteration} or start a new run name")
    finished = (previous is not None and previous.state == "finished" and previous.iterations == cfg.iterations
                and store.exists(FINAL_MANIFEST))
    start = ref.next_iteration if ref is not None else 0
    status = RunStatus(state="running", attempt=(previous.attempt + 1) if previous else 0,
                       iterations=cfg.iterations, iteration=start - 1 if start else None,
                       latest_checkpoint=ref.name if ref else None)
    if finished:
        status = previous
    else:
        store.truncate_metrics(start)
        status.write(store)
    return RunPlan(status=status, checkpoint=ref, start_iteration=start, config_changes=changes, existed=existed,
                   finished=finished)


@dataclass
class RunInputs:
    """What a run trains from, fixed at its first start: the starting weights and the data files."""

    weights_folder: str | None          # a local HF folder to start from; None: model.path
    weights_from: str                   # where they come from, in words
    data_files: dict[str, list[str]]    # {"train": [...], "eval:<set>": [...]}
    teacher_folder: str | None = None   # distill: a local HF folder of the teacher (the resolved distill.teacher)
    teacher_from: str | None = None     # where the teacher comes from, in words


@task(name="resolve-inputs", cache_policy=NONE)
def resolve_inputs(cfg: GRPOConfig, store: RunStore) -> RunInputs:
    """Resolve ``model.init_from``, ``distill.teacher`` and the data folders/globs once per run (recorded in the run
    folder with the data files' sizes and hashes and the code's commit, reused by resumes); copy a remote starting
    policy or teacher to ``$GRPO_CACHE_DIR/init_from`` (default ``.cache``)."""
    opts = cfg.storage.options or None
    source, _ = lineage.recorded_or_resolved(store, cfg.model.init_from, cfg.storage.root, opts,
                                             registry=cfg.registry)
    cache = os.path.join(os.environ.get("GRPO_CACHE_DIR", ".cache"), "init_from")
    folder = lineage.local_policy_folder(source, cfg.storage.root, opts, cache)
    specs = {"train": cfg.data.train_path}
    specs.update({eval_files_key(name): spec.path for name, spec in cfg.eval_sets().items()})
    files = data_files.recorded_or_resolved(store, specs, opts)
    lineage.record_inputs(store, files, opts)
    teacher = teacher_from = None
    spec = cfg.kind.teacher()
    if spec is not None:
        found, _ = lineage.recorded_or_resolved(store, spec, cfg.storage.root, opts, record=lineage.TEACHER)
        if found.folder is None:
            store.delete(lineage.TEACHER)  # not a choice to keep: a resume looks again
            raise lineage.InitFromError(f"distill.teacher={spec!r} is neither a model folder (with config.json) nor "
                                        f"a run under {cfg.storage.root} with a policy (final/ or a checkpoint)")
        teacher = lineage.local_policy_folder(found, cfg.storage.root, opts, cache, field="distill.teacher")
        teacher_from = lineage.describe(found, field="distill.teacher")
    return RunInputs(weights_folder=folder, weights_from=lineage.describe(source), data_files=files,
                     teacher_folder=teacher, teacher_from=teacher_from)


@task(name="latest-checkpoint", cache_policy=NONE)
def latest_checkpoint(store: RunStore, drop_metrics_from_resume: bool = True) -> CheckpointRef | None:
    """The checkpoint an in-flow recovery restores (None: start over from the initial weights)."""
    ref = checkpoint.latest(store)
    if drop_metrics_from_resume:
        store.truncate_metrics(ref.next_iteration if ref else 0)
    return ref


def _record_run_name() -> str:
    from prefect.runtime import task_run

    return f"record-{task_run.parameters['row']['iteration']:06d}"


@task(name="record", task_run_name=_record_run_name, cache_policy=NONE)
def record(store: RunStore, status: RunStatus, row: dict[str, Any]) -> None:
    """Append an iteration's metrics row (replacing one for the same iteration) and the heartbeat."""
    store.append_metrics(row)
    if is_trained_row(row):
        status.iteration = row["iteration"]
    status.write(store)


@task(name="write-status", cache_policy=NONE)
def write_status(store: RunStore, status: RunStatus, state: str, error: str | None = None) -> None:
    status.state = state
    status.error = error
    status.write(store)


@task(name="scale-samplers", cache_policy=NONE)
def scale_samplers(ctx: RunContext, count: int) -> Scaled:
    """Between iterations: follow an operator's `grpo scale RUN --samplers N` (control.json in the run folder)."""
    out = ctx.engines.scale_samplers(count)
    print(f"scaled samplers {out.samplers_before} -> {out.samplers} in {out.seconds:.1f}s "
          f"(grpo scale; the new ones loaded the current weights first)")
    return out
