"""The `grpo-train` flow: per iteration rollout -> score -> train -> sync, with evaluation every `eval.interval`
and a checkpoint every `checkpoint.interval`. In async RL (`rollout.max_staleness` s > 0, split placement) the
rollout and scoring of iteration k+s run while iteration k trains (the train task is submitted, the rollout runs
beside it); which weights sample which iteration is fixed (`cfg.window`, an `AsyncWindow`), so async runs are
deterministic and resume exactly. Between iterations the flow follows `grpo scale` (control.json).

Engines (the policy actor, the scorer's processes) are created once per flow run. Each task returns a small
reference with metrics; the data stays in the run folder. metrics.parquet gets one row per iteration: the row of
iteration k describes the weights that sampled it (version before k's update), so its ``eval_accuracy`` is that of
the policy before the update; a last row, iteration = ``iterations``, holds the final evaluation.

Resume: a run name whose folder exists continues from its latest committed checkpoint (``latest.json``) with the
learner, sampler and RNG restored, at the next iteration; stage outputs of later iterations are reused where their
policy version matches. An engine actor that dies mid-run is recreated and restored the same way, at most
``cluster.max_actor_restarts`` times. Storage I/O that fails transiently is retried by Prefect task retries.
"""
from __future__ import annotations

import json
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from prefect import flow
from rich.console import Console

from flows.prefect_api import wait_patiently_for_the_api

from grpo_core.cluster.engines import EngineLost, Engines
from grpo_core.cluster.reward_models import RewardModels
from grpo_core.cluster.teacher import TeacherActors
from grpo_core.config import ConfigError, GRPOConfig, build_config, check_model_folder, load_config
from grpo_core.run.metric_sinks import MetricSinks
from grpo_core.pipeline.evaluation import EvalScorers, load_eval_sets
from grpo_core.pipeline.prompts import PromptStream
from grpo_core.run.progress import Progress, iteration_line
from grpo_core.run.report import plot_curves, plot_timeline, summary_lines
from grpo_core.rewards.scorer import Scorer
from grpo_core.run.status import RunStatus, requested_samplers
from grpo_core.run.storage import RunStore
from tasks.batch_sources import Batch, BatchSource, batch_source
from tasks.console import RunConsole
from tasks.context import RunContext
from tasks.endpoint import close_endpoint, open_endpoint, paused
from tasks.results import EvalResult, IterationRecord, IterationTimes
from tasks.run_log import run_logging
from tasks.run_state import RunInputs
from tasks.score import group_outcomes
from tasks.stage_timer import StageTimer
from tasks.stages import Stages
from tasks.sync import ensure_synced

# Prefect 3.7's own API start gives up on a slow first answer (flows/prefect_api.py); from here on it waits.
wait_patiently_for_the_api()


class RunFailed(RuntimeError):
    """The run cannot go on in this flow run; the message says why and where it can be resumed from."""


def _build_context(cfg: GRPOConfig, store: RunStore, status: RunStatus, inputs: RunInputs,
                   resources: ExitStack) -> RunContext:
    """The run's data, engines, scorers and the actors its kind needs, each stopped by ``resources`` when the run
    ends (or at once, if a later one fails to start)."""
    from transformers import AutoTokenizer

    from grpo_core.data.files import merged, read_prompt_files
    from grpo_core.data.precheck import check_lengths

    d, files, kind = cfg.data, inputs.data_files, cfg.kind
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    encoder = kind.encoder(cfg, tokenizer)
    read = dict(format=d.format, prompt_key=d.prompt_key, answer_key=d.answer_key, on_bad_row=d.on_bad_row,
                storage_options=cfg.storage.options or None)
    # every row's length checked now, with data.on_bad_row, not when a batch first draws the row
    train_parts = [check_lengths(part, encoder, kind.row_limit(cfg), d.on_bad_row)
                   for part in read_prompt_files(files["train"], **read)]
    train_set = merged(train_parts)
    pool = dict(pool_skips=(d.pool_easy_skips, d.pool_hard_skips),
                outcomes=partial(group_outcomes, store, cfg.rollout.samples_per_prompt)) \
        if d.sampler == "difficulty_pool" else {}
    stream = PromptStream(train_set, encoder, batch_size=kind.rows_per_iteration(cfg), seed=cfg.seed,
                          shuffle=d.shuffle, rounds_per_iteration=cfg.sampling_rounds, **pool)
    sets = [(part.source, part.skipped) for part in train_parts]
    eval_sets = load_eval_sets(cfg, tokenizer, cfg.storage.options or None, files) if cfg.eval.interval > 0 else []
    sets += [(s.source, s.skipped) for s in eval_sets]
    skipped = {source: [{"row": row, "reason": why} for row, why in rows] for source, rows in sets if rows}
    if skipped:  # counted, reported and kept with the run, never dropped silently
        store.put_bytes("skipped_rows.json", json.dumps(skipped, indent=1).encode())
        for source, rows in skipped.items():
            print(f"skipped {len(rows)} bad rows of {source} (data.on_bad_row=skip), listed in "
                  f"{store.uri}/skipped_rows.json; first: {rows[0]}")
    engines = Engines(cfg)
    resources.callback(engines.close)
    r = cfg.reward
    reward_models = None
    if r.models or inputs.teacher_folder is not None:  # their actors go on the run's Ray (else a default one starts)
        engines.connect()
    if r.models:
        reward_models = RewardModels(cfg)
        resources.callback(reward_models.close)
    teacher = None
    if inputs.teacher_folder is not None:  # the kind's teacher (grpo_core.config.run_kinds), resolved to a folder
        teacher = TeacherActors(cfg, inputs.teacher_folder)
        resources.callback(teacher.close)
    scorer = Scorer(reward_type=r.type, rewards=r.rewards, weights=r.weights, num_workers=r.num_workers,
                    timeout_s=r.timeout_s, options=r.options, dedupe=r.dedupe,
                    models=reward_models.clients() if reward_models else None)
    resources.callback(scorer.close)
    eval_scorers = EvalScorers(cfg, eval_sets, scorer) if eval_sets else None
    if eval_scorers is not None:
        resources.callback(eval_scorers.close)
    return RunContext(cfg=cfg, store=store, engines=engines, scorer=scorer, train_prompts=stream, status=status,
                      eval_sets=eval_sets, eval_scorers=eval_scorers, reward_models=reward_models, teacher=teacher)


def _run_start_time():
    """What a run-name template's {date} and {time} mean: the flow run's scheduled start (UTC), which a Prefect
    retry of the same flow run keeps, so the retry resumes the same run folder."""
    from datetime import timezone

    from prefect.runtime import flow_run

    return flow_run.scheduled_start_time.astimezone(timezone.utc)


def flow_config(config: dict | None, config_path: str | None, overrides: list[str] | None) -> GRPOConfig:
    """A flow's config from its parameters, run-name templates expanded with the flow run's start time."""
    now = _run_start_time()
    return build_config(config, "<flow parameter>", now) if config is not None \
        else load_config(config_path, overrides, now=now)


def _flow_run_name() -> str:
    """The flow run is named after the training run (its folder under storage.root), not a random name."""
    from prefect.runtime import flow_run

    from grpo_core.config import ConfigError

    p = flow_run.parameters
    try:
        cfg = flow_config(p.get("config"), p.get("config_path"), p.get("overrides"))
    except ConfigError:
        return f"{flow_run.flow_name}-invalid-config"  # the flow itself then fails with the config error
    return cfg.run_name


@flow(name="grpo-train", flow_run_name=_flow_run_name, log_prints=True)
def grpo_train(config_path: str | None = None, overrides: list[str] | None = None,
               config: dict | None = None) -> dict[str, Any]:
    """Train a policy with GRPO-family RL. Give a YAML path (+ `key=value` overrides) or a config dict.
    A run name whose folder exists is resumed from its latest checkpoint."""
    return asdict(_run_flow(flow_config(config, config_path, overrides), "grpo-train"))


@flow(name="grpo-sft", flow_run_name=_flow_run_name, log_prints=True)
def grpo_sft(config_path: str | None = None, overrides: list[str] | None = None,
             config: dict | None = None) -> dict[str, Any]:
    """Supervised fine-tuning on conversations (the config's sft section, data.format chat): the loss on the
    assistant turns, in the learner, run folder, checkpoints, resume and evaluation of RL runs. Give a YAML path
    (+ `key=value` overrides) or a config dict. A run name whose folder exists is resumed from its latest
    checkpoint."""
    return asdict(_run_flow(flow_config(config, config_path, overrides), "grpo-sft"))


def _run_flow(cfg: GRPOConfig, flow_name: str) -> "RunOutcome":
    refusal = cfg.kind.wrong_flow(cfg.run_name, flow_name)
    if refusal is not None:
        raise ConfigError(refusal)
    check_model_folder(cfg)
    store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
    _tag_flow_run(cfg)
    terminal = Console()
    with run_logging(cfg, store, terminal):
        return _run(cfg, store, terminal)


@dataclass(frozen=True)
class RunOutcome:
    """What a flow run returns (as a dict: Prefect keeps it as the flow run's result)."""
    run: str
    iterations: int
    final_folder: str
    final_eval_accuracy: float | None
    summary: list[str]
    resumed_from: str | None
    recoveries: int = 0
    replaced_samplers: int = 0
    actors: list = field(default_factory=list)
    gate: dict | None = None  # the eval gate's outcome (grpo_core.lifecycle.promotion.GateOutcome), when cfg.gate is set


def _run(cfg: GRPOConfig, store: RunStore, terminal: Console) -> RunOutcome:
    stages = Stages(cfg)
    started = time.perf_counter()
    plan = stages.prepare_run(cfg, store)
    for change in plan.config_changes:
        print(f"config change on resume: {change}")
    if plan.finished:
        return _gated(cfg, store, stages, _already_finished(cfg, store))
    with ExitStack() as resources:  # the run's engines, actors, scorers, endpoint and source: closed in reverse
        try:
            inputs = stages.resolve_inputs(cfg, store)
            print(f"starting weights: {inputs.weights_from}; train data: " + ", ".join(inputs.data_files["train"]))
            if inputs.teacher_folder is not None:
                print(f"distillation teacher: {inputs.teacher_from}")
            ctx = _build_context(cfg.starting_from(inputs.weights_folder), store, plan.status, inputs, resources)
            outcome = _train(ctx, stages, plan.checkpoint, started, terminal, resources)
        except BaseException as exc:
            try:
                stages.write_status(store, plan.status, "failed", f"{type(exc).__name__}: {exc}")
            except Exception as status_exc:  # noqa: BLE001 - never mask the failure itself
                print(f"could not record the failure in status.json: {status_exc!r}")
            raise
    return _gated(cfg, store, stages, outcome)


def _gated(cfg: GRPOConfig, store: RunStore, stages: Stages, outcome: "RunOutcome") -> "RunOutcome":
    """The eval gate after training (cfg.gate set), once the run's engines are gone: its outcome joins the
    flow run's result. A finished run whose gate never ran, or found the registry unavailable, gates again."""
    from grpo_core.lifecycle.promotion import gate_pending

    if cfg.gate is None or not gate_pending(store):
        return outcome
    decided = stages.gate(cfg, store)
    return replace(outcome, gate=decided.to_json(), summary=[*outcome.summary, f"gate: {decided.reason}"])


def run_tags(cfg: GRPOConfig) -> list[str]:
    """Tags that make runs findable in the UI's filters: objective, model, placement, the RL preset (and LoRA)."""
    import os

    tags = [f"objective:{cfg.objective}", f"model:{os.path.basename(os.path.normpath(cfg.model.path))}",
            f"placement:{cfg.cluster.placement}"] + cfg.kind.tags(cfg)
    return tags + (["lora"] if cfg.model.lora is not None else [])


def _tag_flow_run(cfg: GRPOConfig) -> None:
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run.id)
        client.update_flow_run(run.id, tags=sorted(set(run.tags) | set(run_tags(cfg))))


# What deployments run: a failed flow run is retried (the same flow run, same parameters) after a pause, and being
# the same run name it resumes from the latest checkpoint. `grpo train` runs `grpo_train` without flow retries.
grpo_train_with_retries = grpo_train.with_options(retries=2, retry_delay_seconds=60)


def _already_finished(cfg: GRPOConfig, store: RunStore) -> RunOutcome:
    metrics = store.read_metrics()
    evals = [a for a in metrics.column("eval_accuracy").to_pylist() if a is not None] \
        if "eval_accuracy" in metrics.column_names else []
    lines = [f"run {cfg.run_name} already finished all {cfg.iterations} iterations; final policy in "
             f"{store.url('final')} (raise `iterations` to extend it, or choose a new run_name)"]
    for line in lines:
        print(line)
    return RunOutcome(run=store.uri, iterations=cfg.iterations, final_folder=store.url("final"),
                      final_eval_accuracy=evals[-1] if evals else None, summary=lines, resumed_from=None)


def _train(ctx: RunContext, stages: Stages, ref, started: float, terminal: Console,
           resources: ExitStack) -> RunOutcome:
    cfg, store = ctx.cfg, ctx.store
    info = ctx.engines.start()
    ctx.status.actors = info.actors
    c = cfg.cluster
    print(f"engines ready in {time.perf_counter() - started:.1f}s ({c.placement}: {c.samplers} sampler(s), "
          f"{c.learners} learner rank(s), weights by {cfg.transport}, {'/'.join(info.dtypes)}; vLLM load "
          f"{info.sampler_load_s:.1f}s, DeepSpeed init {info.learner_init_s:.1f}s); run folder {store.uri}")
    resumed_from = None
    if ref is not None:
        restored = stages.restore(ctx, ref)
        resumed_from = ref.name
        print(f"resuming {cfg.run_name} from {ref.name}, policy version {ref.policy_version} "
              f"(restored in {restored.seconds:.1f}s; continuing at iteration {ref.next_iteration})")
    start = ref.next_iteration if ref is not None else 0
    if cfg.endpoint is not None:  # the samplers hold the run's weights now
        ctx.endpoint = open_endpoint(ctx)
        resources.callback(close_endpoint, ctx.endpoint)
    source = batch_source(cfg, stages)
    source.open(ctx, start)  # an outside source samples through the endpoint
    resources.callback(source.close)
    console = RunConsole(cfg.run_name, cfg.iterations, store.read_metrics().to_pylist(),
                         min_interval_s=cfg.logging.console_interval_s)
    try:
        last_eval = _iterate_with_recovery(ctx, stages, source, start, console, terminal)
    except BaseException:
        try:  # the rows recorded since the last publication, for whoever looks at the failed run
            console.publish()
        except Exception as exc:  # noqa: BLE001 - never mask the failure itself
            print(f"could not publish the metrics table: {exc!r}")
        raise
    stages.commit_checkpoint(ctx, wait=True)
    saved = stages.save_final(ctx)
    metrics = store.read_metrics()
    store.put_bytes("curves.png", plot_curves(metrics))
    store.put_bytes("timeline.png", plot_timeline(metrics))
    stages.write_status(store, ctx.status, "finished")
    lines = summary_lines(metrics)
    lines.append(f"final policy (version {saved.policy_version}) saved to {saved.folder}")
    lines.append(f"total wall time {time.perf_counter() - started:.1f}s; run folder {store.uri}")
    for line in lines:
        print(line)
    console.summary(lines, saved.folder, ctx.status.latest_checkpoint)
    return RunOutcome(run=store.uri, iterations=cfg.iterations, final_folder=saved.folder,
                      final_eval_accuracy=last_eval.accuracy if last_eval else None, summary=lines,
                      resumed_from=resumed_from, recoveries=ctx.status.recoveries,
                      replaced_samplers=ctx.engines.replaced_samplers, actors=list(ctx.status.actors))


def _iterate_with_recovery(ctx: RunContext, stages: Stages, source: BatchSource, start: int, console: RunConsole,
                           terminal: Console) -> EvalResult | None:
    """Run the iterations from `start`; an engine actor lost mid-run is recreated and the run continues from the
    latest checkpoint, at most ``cluster.max_actor_restarts`` times. Returns the last evaluation."""
    cfg, store = ctx.cfg, ctx.store
    while True:
        sinks = MetricSinks.of_run(cfg, store, start)  # (re)opened where the iterations (re)start
        try:
            return _run_iterations(ctx, stages, source, start, console, terminal, sinks)
        except EngineLost as lost:
            ctx.pending_checkpoint = None  # its writer died with the actor; it never counts
            ctx.status.recoveries += 1
            where = ctx.status.latest_checkpoint
            if ctx.status.recoveries > cfg.cluster.max_actor_restarts:
                raise RunFailed(
                    f"{lost}; gave up after cluster.max_actor_restarts={cfg.cluster.max_actor_restarts} "
                    f"recoveries. Resume the run with the same run_name ({cfg.run_name}) "
                    + (f"from {store.url('checkpoints/' + where)}" if where else "from its start (no checkpoint)")
                ) from lost
            with paused(ctx, "the engines are being recreated after a lost actor"):
                info = ctx.engines.recreate()
                ctx.status.actors = info.actors
                ref = stages.latest_checkpoint(store)
                if ref is not None:
                    stages.restore(ctx, ref)
            start = ref.next_iteration if ref is not None else 0
            print(f"{lost}\nrecreated the engine actors ({ctx.status.recoveries}/{cfg.cluster.max_actor_restarts}) "
                  f"in {info.recreate_s:.1f}s and restored "
                  + (f"{ref.name}, policy version {ref.policy_version}" if ref else "the initial weights")
                  + f"; continuing at iteration {start}")
        finally:
            sinks.close()


class _Published:
    """Where a recorded row goes: the run folder's metrics, the metric sinks, the Prefect UI's artifacts, the
    terminal's line and progress bar."""

    def __init__(self, ctx: RunContext, stages: Stages, sinks: MetricSinks, console: RunConsole, progress: Progress):
        self.ctx, self.stages, self.sinks, self.console, self.progress = ctx, stages, sinks, console, progress

    def __call__(self, row: dict[str, Any]) -> None:
        self.stages.record(self.ctx.store, self.ctx.status, row)
        self.sinks.log(row)
        if row["iteration"] < self.ctx.cfg.iterations:
            self.console.iteration_done(row)
        print(iteration_line(row))
        self.progress.update(row)


def _run_iterations(ctx: RunContext, stages: Stages, source: BatchSource, start: int, console: RunConsole,
                    terminal: Console, sinks: MetricSinks) -> EvalResult | None:
    """Iterations ``start..iterations-1`` and the final evaluation; returns the last evaluation. Each recorded
    row and evaluation also goes to the run's artifacts in the Prefect UI (``console``)."""
    from prefect.runtime import flow_run

    cfg = ctx.cfg
    last_eval: EvalResult | None = None
    batches: dict[int, Batch] = {}  # collected, not yet trained on (async: up to s ahead)
    with Progress(cfg.iterations, console=terminal, completed=start, label=flow_run.flow_name or "grpo-train") \
            as progress:
        publish = _Published(ctx, stages, sinks, console, progress)
        for it in range(start, cfg.iterations):
            record = _iteration(ctx, stages, source, it, batches, console)
            last_eval = record.evaluation or last_eval
            publish(record.row())
        if _evaluates(ctx):
            timer = StageTimer()
            with timer("eval"):
                last_eval = stages.evaluate(ctx, cfg.iterations)
            console.evaluation(cfg.iterations, last_eval)
            publish({"iteration": cfg.iterations, "eval_accuracy": last_eval.accuracy,
                     "run_attempt": ctx.status.attempt, "time_eval_s": timer["eval"],
                     "policy_version": last_eval.policy_version, **last_eval.metrics})
    return last_eval


def _evaluates(ctx: RunContext, iteration: int | None = None) -> bool:
    """Whether the run evaluates at all (``iteration`` None), or before ``iteration``."""
    interval = ctx.cfg.eval.interval
    return bool(ctx.eval_sets) and interval > 0 and (iteration is None or iteration % interval == 0)


def _iteration(ctx: RunContext, stages: Stages, source: BatchSource, it: int, batches: dict[int, Batch],
               console: RunConsole) -> IterationRecord:
    """One iteration: the samplers' count and weights checked, the evaluation when due, the batch collected (in
    async RL, the next ones too), the update, the weight sync, and the checkpoint started when due."""
    cfg, window, timer = ctx.cfg, ctx.cfg.window, StageTimer()
    with timer("prepare"):
        wanted = requested_samplers(ctx.store) if cfg.placement.scale_refusal() is None else None
        if wanted is not None and wanted != len(ctx.engines.samplers):
            stages.scale_samplers(ctx, wanted)
        samplers = len(ctx.engines.samplers.live_ids())
        resync = ensure_synced(ctx, expected_learner_version=window.learner_version(it), sync_stage=stages.sync)
    evaluation = None
    if _evaluates(ctx, it):
        with timer("eval"):
            evaluation = stages.evaluate(ctx, it)
        console.evaluation(it, evaluation)
    serial = 0.0  # seconds inside the engines on the critical path
    with timer("collect"):
        for j in window.collect_before_training(it, collected=set(batches)):
            batches[j] = source.collect(ctx, j)
            serial += batches[j].inside
        batch = batches.pop(it)
        _poll_checkpoint(ctx, stages)
    ahead = window.beside_update(it)
    with timer("train"):
        if ahead is None:
            tr = stages.train(ctx, it)
        else:  # async: the rollout of iteration it + s runs while this one trains
            training = stages.train.submit(ctx, it)
            try:
                batches[ahead] = source.collect(ctx, ahead)
            finally:
                training.wait()
            tr = training.result()
    sync_started = ctx.clock()
    checked = it % cfg.weights.check_every == 0 or it == cfg.iterations - 1
    with timer("sync"):
        sy = stages.sync(ctx, check=(it, batch.check_file) if checked else None, iteration=it)
    sync_ended, check_s = ctx.clock(), sy.check_seconds or 0.0
    overlapped = max(tr.seconds, batches[ahead].inside if ahead is not None else 0.0)
    times = IterationTimes(
        eval_s=timer["eval"] if evaluation else None, rollout_s=batch.wall - batch.scored.seconds,
        train_s=timer["train"], sync_s=timer["sync"] - check_s, total_s=timer.total(),
        # orchestration: the iteration's wall time beyond the engines' work on its critical path
        overhead_s=timer["collect"] + timer["train"] + timer["sync"] - serial - overlapped - sy.seconds - check_s,
        stamps=batch.stamps, sync_started_at=sync_started, sync_ended_at=sync_ended)
    taken = batch.inbox
    record = IterationRecord(
        iteration=it, attempt=ctx.status.attempt, samplers=samplers, resynced=resync is not None,
        evaluation=evaluation, rollouts=batch.rollouts, scored=batch.scored, inbox=taken, filled=batch.filled,
        staleness=window.staleness_of(it, batch.rollouts[0].policy_version, cfg.batch_size, taken.rows,
                                      taken.version_sum, taken.version_min),
        train=tr, sync=sy, times=times)
    # The checkpoint of iteration `it` is only started here (a copy in memory); it is committed later, after this
    # row is recorded, so a resume from it always finds the rows of the iterations it holds.
    if cfg.is_checkpoint_iteration(it):
        with timer("checkpoint"):
            pending = stages.begin_checkpoint(ctx, it)
        record = replace(record, checkpoint_s=timer["checkpoint"], checkpoint_snapshot_s=pending.snapshot_seconds)
    else:
        _poll_checkpoint(ctx, stages)
    return record


def _poll_checkpoint(ctx: RunContext, stages: Stages) -> None:
    """Commit the checkpoint being written as soon as its files are (a cheap actor call while it is not)."""
    pending = ctx.pending_checkpoint
    if pending is not None and ctx.engines.learners.poll(pending, wait=False):
        stages.commit_checkpoint(ctx, wait=False)
