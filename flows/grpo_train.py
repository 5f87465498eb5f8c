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
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

from prefect import flow
from rich.console import Console

from grpo_core.cluster.engines import EngineLost, Engines
from grpo_core.cluster.reward_models import RewardModels
from grpo_core.cluster.teacher import TeacherActors
from grpo_core.config import ConfigError, GRPOConfig, build_config, check_model_folder, load_config
from grpo_core.data.chat import ConversationTokenizer, end_of_turn_ids
from grpo_core.metric_sinks import MetricSinks
from grpo_core.pipeline.evaluation import EvalScorers, load_eval_sets
from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer
from grpo_core.progress import Progress, iteration_line
from grpo_core.report import plot_curves, plot_timeline, summary_lines
from grpo_core.rewards.scorer import Scorer
from grpo_core.runs import RunStatus, requested_samplers
from grpo_core.storage import RunStore
from tasks.checkpoint import begin_checkpoint, commit_checkpoint, restore, save_final
from tasks.console import RunConsole
from tasks.context import Opaque, RunContext
from tasks.conversations import conversations
from tasks.endpoint import close_endpoint, open_endpoint, paused
from tasks.evaluate import evaluate
from tasks.gate import gate
from tasks.inbox import take_inbox
from tasks.io_retry import io_retry_options
from tasks.outside import close_outside, fill_inbox, open_outside
from tasks.results import (EvalResult, FillResult, InboxResult, IterationTimes, RolloutResult, ScoreResult,
                           iteration_row)
from tasks.rollout import rollout
from tasks.run_log import run_logging
from tasks.run_state import (RunInputs, latest_checkpoint, prepare_run, record, resolve_inputs, scale_samplers,
                             write_status)
from tasks.score import assemble, group_outcomes, score
from tasks.sync import ensure_synced, sync
from tasks.train import train


class RunFailed(RuntimeError):
    """The run cannot go on in this flow run; the message says why and where it can be resumed from."""


class _Stages:
    """The flow run's tasks, each with the storage retry policy of this run's config, called through `Opaque`.
    Every stage the flow runs goes through one of these."""

    def __init__(self, cfg: GRPOConfig):
        opts = io_retry_options(cfg.storage)

        def stage(fn) -> Opaque:
            return Opaque(fn.with_options(**opts))

        self.prepare_run, self.resolve_inputs = stage(prepare_run), stage(resolve_inputs)
        self.take_inbox, self.rollout, self.score, self.assemble = \
            stage(take_inbox), stage(rollout), stage(score), stage(assemble)
        self.fill_inbox, self.conversations = stage(fill_inbox), stage(conversations)
        self.train, self.sync, self.evaluate = stage(train), stage(sync), stage(evaluate)
        self.begin_checkpoint, self.commit_checkpoint = stage(begin_checkpoint), stage(commit_checkpoint)
        self.latest_checkpoint, self.restore, self.save_final = \
            stage(latest_checkpoint), stage(restore), stage(save_final)
        self.record, self.write_status, self.scale_samplers = stage(record), stage(write_status), stage(scale_samplers)
        self.gate = stage(gate)


def _build_context(cfg: GRPOConfig, store: RunStore, status: RunStatus, inputs: RunInputs) -> RunContext:
    from transformers import AutoTokenizer

    from grpo_core.data.files import merged, read_prompt_files
    from grpo_core.data.precheck import check_lengths

    d, files = cfg.data, inputs.data_files
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    if cfg.sft is not None:  # SFT: conversations, the loss on their assistant turns
        encoder = ConversationTokenizer(tokenizer, cfg.reward.type, d.system_prompt, cfg.sft.max_tokens,
                                        end_of_turn_ids(cfg.model.path, tokenizer))
    else:
        encoder = PromptTokenizer(tokenizer, cfg.reward.type, d.system_prompt, d.max_prompt_tokens,
                                  [t.model_dump() for t in d.few_shot])
    read = dict(format=d.format, prompt_key=d.prompt_key, answer_key=d.answer_key, on_bad_row=d.on_bad_row,
                storage_options=cfg.storage.options or None)
    limit = cfg.sft.max_tokens if cfg.sft is not None else d.max_prompt_tokens
    # every row's length checked now, with data.on_bad_row, not when a batch first draws the row
    train_parts = [check_lengths(part, encoder, limit, d.on_bad_row)
                   for part in read_prompt_files(files["train"], **read)]
    train_set = merged(train_parts)
    rounds = 1 + (cfg.algo.max_resample_times if cfg.algo.filter_groups else 0)
    pool = dict(pool_skips=(d.pool_easy_skips, d.pool_hard_skips),
                outcomes=partial(group_outcomes, store, cfg.algo.filter_groups, cfg.rollout.samples_per_prompt)) \
        if d.sampler == "difficulty_pool" else {}
    stream = PromptStream(train_set, encoder, batch_size=cfg.rollout.prompts_per_iteration, seed=cfg.seed,
                          shuffle=d.shuffle, rounds_per_iteration=rounds, **pool)
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
    r = cfg.reward
    reward_models = teacher = None
    try:
        if r.models or cfg.distill is not None:  # their actors go on the run's Ray (else a default Ray would start)
            engines.connect()
        if r.models:
            reward_models = RewardModels(cfg)
        if cfg.distill is not None:
            teacher = TeacherActors(cfg, inputs.teacher_folder)
        scorer = Scorer(reward_type=r.type, rewards=r.rewards, weights=r.weights, num_workers=r.num_workers,
                        timeout_s=r.timeout_s, options=r.options, dedupe=r.dedupe,
                        models=reward_models.clients() if reward_models else None)
    except BaseException:  # no context holds them yet: stop what started
        if reward_models is not None:
            reward_models.close()
        if teacher is not None:
            teacher.close()
        engines.close()
        raise
    return RunContext(cfg=cfg, store=store, engines=engines, scorer=scorer, train_prompts=stream, status=status,
                      eval_sets=eval_sets, eval_scorers=EvalScorers(cfg, eval_sets, scorer) if eval_sets else None,
                      reward_models=reward_models, teacher=teacher)


@dataclass
class _Batch:
    """One iteration's training batch as collected: rollout task results (one per dynamic-sampling round), the
    score result, the seconds spent inside the engines and scorer, the wall seconds, stage timestamps, and the
    take-inbox result."""
    rollouts: list[RolloutResult]
    scored: ScoreResult
    inside: float
    wall: float
    stamps: dict[str, float]
    inbox: InboxResult  # what the iteration took from the inbox
    filled: FillResult | None = None  # what its outside source put into the inbox first (atropos, endpoint.clients)


def _collect_batch(ctx: RunContext, stages: _Stages, iteration: int) -> _Batch:
    """Rollout then score. Dynamic sampling (algo.filter_groups) adds rounds until enough groups have mixed
    outcomes or `max_resample_times` more rounds were sampled, then assembles the batch."""
    import torch

    from grpo_core.algo import DynamicBatch

    cfg = ctx.cfg
    t0, stamps = time.perf_counter(), {"rollout_started_at": ctx.clock()}
    rollouts, scored = [], []
    batch = DynamicBatch(cfg.rollout.prompts_per_iteration, cfg.algo.max_resample_times, cfg.algo.filter_range) \
        if cfg.algo.filter_groups else None
    filled = stages.fill_inbox(ctx, iteration) if ctx.outside is not None else None
    taken = stages.take_inbox(ctx, iteration) if cfg.window.takes_inbox(cfg.algo.filter_groups) else None
    while not rollouts or (batch is not None and not (batch.full or batch.exhausted)):
        rollouts.append(stages.rollout(ctx, iteration, len(rollouts)))
        stamps["rollout_ended_at"] = ctx.clock()
        stamps.setdefault("score_started_at", stamps["rollout_ended_at"])
        scored.append(stages.score(ctx, iteration, rollouts[-1].name))
        stamps["score_ended_at"] = ctx.clock()
        if batch is not None:
            success = torch.tensor(scored[-1].group_success, dtype=torch.float64)
            batch.add(success, list(range(success.shape[0])))
    if batch is None:
        sc = scored[0]
    else:  # the assembled batch: the first round's reward metrics, the group counts, every round's seconds
        out = stages.assemble(ctx, iteration, [s.name for s in scored])
        sc = ScoreResult(out.name, out.rows, False, {**scored[0].metrics, **out.metrics,
                                                     "score_seconds": sum(s.seconds for s in scored)})
    inside = sum(r.seconds for r in rollouts if not r.reused) + sc.seconds
    return _Batch(rollouts, sc, inside, time.perf_counter() - t0, stamps, taken or InboxResult(), filled)


def _collect_conversations(ctx: RunContext, stages: _Stages, iteration: int) -> _Batch:
    """SFT: the iteration's conversations are its batch; nothing is sampled or scored."""
    t0, stamps = time.perf_counter(), {"rollout_started_at": ctx.clock()}
    rollout, scored = stages.conversations(ctx, iteration)
    stamps["rollout_ended_at"] = stamps["score_started_at"] = stamps["score_ended_at"] = ctx.clock()
    return _Batch([rollout], scored, 0.0, time.perf_counter() - t0, stamps, InboxResult())


def _collector(cfg: GRPOConfig):
    """How a run collects an iteration's batch: sampled and scored (RL), or its conversations (SFT)."""
    return _collect_conversations if cfg.sft is not None else _collect_batch


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
    cfg = flow_config(config, config_path, overrides)
    if cfg.sft is not None:
        raise ConfigError(f"run {cfg.run_name}: the config sets sft (supervised fine-tuning): run it with `grpo sft` "
                          f"(the grpo-sft flow)")
    return asdict(_run_flow(cfg))


@flow(name="grpo-sft", flow_run_name=_flow_run_name, log_prints=True)
def grpo_sft(config_path: str | None = None, overrides: list[str] | None = None,
             config: dict | None = None) -> dict[str, Any]:
    """Supervised fine-tuning on conversations (the config's sft section, data.format chat): the loss on the
    assistant turns, in the learner, run folder, checkpoints, resume and evaluation of RL runs. Give a YAML path
    (+ `key=value` overrides) or a config dict. A run name whose folder exists is resumed from its latest
    checkpoint."""
    cfg = flow_config(config, config_path, overrides)
    if cfg.sft is None:
        raise ConfigError(f"run {cfg.run_name}: grpo-sft needs a config with sft set (and data.format: chat); an RL "
                          f"config runs with `grpo train`")
    return asdict(_run_flow(cfg))


def _run_flow(cfg: GRPOConfig) -> "RunOutcome":
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
    gate: dict | None = None  # the eval gate's outcome (grpo_core.promotion.GateOutcome), when cfg.gate is set


def _run(cfg: GRPOConfig, store: RunStore, terminal: Console) -> RunOutcome:
    stages = _Stages(cfg)
    started = time.perf_counter()
    plan = stages.prepare_run(cfg, store)
    for change in plan.config_changes:
        print(f"config change on resume: {change}")
    if plan.finished:
        return _gated(cfg, store, stages, _already_finished(cfg, store))
    ctx = None
    try:
        inputs = stages.resolve_inputs(cfg, store)
        print(f"starting weights: {inputs.weights_from}; train data: " + ", ".join(inputs.data_files["train"]))
        if inputs.teacher_folder is not None:
            print(f"distillation teacher: {inputs.teacher_from}")
        ctx = _build_context(cfg.starting_from(inputs.weights_folder), store, plan.status, inputs)
        outcome = _train(ctx, stages, plan.checkpoint, started, terminal)
    except BaseException as exc:
        try:
            stages.write_status(store, plan.status, "failed", f"{type(exc).__name__}: {exc}")
        except Exception as status_exc:  # noqa: BLE001 - never mask the failure itself
            print(f"could not record the failure in status.json: {status_exc!r}")
        raise
    finally:
        if ctx is not None:
            if ctx.outside is not None:
                close_outside(ctx.outside)
            if ctx.endpoint is not None:
                close_endpoint(ctx.endpoint)
            ctx.scorer.close()
            if ctx.eval_scorers is not None:
                ctx.eval_scorers.close()
            if ctx.reward_models is not None:
                ctx.reward_models.close()
            if ctx.teacher is not None:
                ctx.teacher.close()
            ctx.engines.close()
    return _gated(cfg, store, stages, outcome)


def _gated(cfg: GRPOConfig, store: RunStore, stages: _Stages, outcome: "RunOutcome") -> "RunOutcome":
    """The eval gate after training (cfg.gate set), once the run's engines are gone: its outcome joins the
    flow run's result. A finished run whose gate never ran, or found the registry unavailable, gates again."""
    from grpo_core.promotion import gate_pending

    if cfg.gate is None or not gate_pending(store):
        return outcome
    decided = stages.gate(cfg, store)
    return replace(outcome, gate=decided.to_json(), summary=[*outcome.summary, f"gate: {decided.reason}"])


def run_tags(cfg: GRPOConfig) -> list[str]:
    """Tags that make runs findable in the UI's filters: objective, model, placement, the RL preset (and LoRA)."""
    import os

    tags = [f"objective:{cfg.objective}", f"model:{os.path.basename(os.path.normpath(cfg.model.path))}",
            f"placement:{cfg.cluster.placement}"] + ([f"preset:{cfg.algo.preset}"] if cfg.sft is None else [])
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


def _train(ctx: RunContext, stages: _Stages, ref, started: float, terminal: Console) -> RunOutcome:
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
    if cfg.endpoint is not None:  # an outside source samples through the endpoint (None: the run samples itself)
        ctx.outside = open_outside(ctx, start)
    console = RunConsole(cfg.run_name, cfg.iterations, store.read_metrics().to_pylist(),
                         min_interval_s=cfg.logging.console_interval_s)
    try:
        last_eval = _iterate_with_recovery(ctx, stages, start, console, terminal)
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


def _iterate_with_recovery(ctx: RunContext, stages: _Stages, start: int, console: RunConsole,
                           terminal: Console) -> EvalResult | None:
    """Run the iterations from `start`; an engine actor lost mid-run is recreated and the run continues from the
    latest checkpoint, at most ``cluster.max_actor_restarts`` times. Returns the last evaluation."""
    cfg, store = ctx.cfg, ctx.store
    while True:
        sinks = MetricSinks(cfg, store, start)  # (re)opened where the iterations (re)start
        try:
            return _run_iterations(ctx, stages, start, console, terminal, sinks)
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


def _run_iterations(ctx: RunContext, stages: _Stages, start: int, console: RunConsole, terminal: Console,
                    sinks: MetricSinks) -> EvalResult | None:
    """Iterations ``start..iterations-1`` and the final evaluation; returns the last evaluation. Each recorded
    row and evaluation also goes to the run's artifacts in the Prefect UI (``console``)."""
    from prefect.runtime import flow_run

    cfg, store = ctx.cfg, ctx.store
    window = cfg.window  # the async rule: what is collected when, which rows may train
    collect = _collector(cfg)
    do_eval = bool(ctx.eval_sets) and cfg.eval.interval > 0
    last_eval: EvalResult | None = None
    batches: dict[int, _Batch] = {}  # collected, not yet trained on (async: up to s ahead)
    with Progress(cfg.iterations, console=terminal, completed=start, label=flow_run.flow_name or "grpo-train") \
            as progress:
        for it in range(start, cfg.iterations):
            t0 = time.perf_counter()
            wanted = requested_samplers(store) if cfg.placement.scale_refusal() is None else None
            if wanted is not None and wanted != len(ctx.engines.samplers):
                stages.scale_samplers(ctx, wanted)
            samplers = len(ctx.engines.samplers.live_ids())
            resync = ensure_synced(ctx, expected_learner_version=window.learner_version(it),
                                   sync_stage=stages.sync)
            evaluation, eval_s = None, None
            if do_eval and it % cfg.eval.interval == 0:
                evaluation = last_eval = stages.evaluate(ctx, it)
                console.evaluation(it, last_eval)
                eval_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            serial = 0.0
            for j in window.collect_before_training(it, collected=set(batches)):
                batches[j] = collect(ctx, stages, j)
                serial += batches[j].inside
            batch = batches.pop(it)
            _poll_checkpoint(ctx, stages)
            t2 = time.perf_counter()
            ahead = window.beside_update(it)
            if ahead is None:
                tr = stages.train(ctx, it)
            else:  # async: the rollout of iteration it + s runs while this one trains
                training = stages.train.submit(ctx, it)
                try:
                    batches[ahead] = collect(ctx, stages, ahead)
                finally:
                    training.wait()
                tr = training.result()
            t3 = time.perf_counter()
            sync_started = ctx.clock()
            checked = it % cfg.weights.check_every == 0 or it == cfg.iterations - 1
            sy = stages.sync(ctx, check=(it, batch.rollouts[0].name) if checked else None, iteration=it)
            t4 = time.perf_counter()
            check_s = sy.check_seconds or 0.0
            overlapped = max(tr.seconds, batches[ahead].inside if ahead is not None else 0.0)
            taken = batch.inbox
            staleness = window.staleness_of(it, batch.rollouts[0].policy_version, cfg.batch_size, taken.rows,
                                            taken.version_sum, taken.version_min)
            times = IterationTimes(
                eval_s=eval_s, rollout_s=batch.wall - batch.scored.seconds, train_s=t3 - t2,
                sync_s=t4 - t3 - check_s, total_s=t4 - t0,
                # orchestration: the iteration's wall time beyond the engines' work on its critical path
                overhead_s=(t4 - t1) - serial - overlapped - sy.seconds - check_s,
                stamps=batch.stamps, sync_started_at=sync_started, sync_ended_at=ctx.clock())
            row = iteration_row(it, ctx.status.attempt, samplers, resync is not None, evaluation, batch.rollouts,
                                batch.scored, taken, staleness, tr, sy, times, batch.filled)
            # The checkpoint of iteration `it` is only started here (a copy in memory); it is committed later,
            # after this row is recorded, so a resume from it always finds the rows of the iterations it holds.
            if cfg.is_checkpoint_iteration(it):
                t5 = time.perf_counter()
                pending = stages.begin_checkpoint(ctx, it)
                row["time_checkpoint_s"] = time.perf_counter() - t5
                row["checkpoint_snapshot_s"] = pending.snapshot_seconds
            else:
                _poll_checkpoint(ctx, stages)
            stages.record(store, ctx.status, row)
            sinks.log(row)
            console.iteration_done(row)
            print(iteration_line(row))
            progress.update(row)
        final: dict[str, Any] = {"iteration": cfg.iterations, "eval_accuracy": None,
                                 "run_attempt": ctx.status.attempt}
        if do_eval:
            t0 = time.perf_counter()
            last_eval = stages.evaluate(ctx, cfg.iterations)
            console.evaluation(cfg.iterations, last_eval)
            final.update({"eval_accuracy": last_eval.accuracy, "time_eval_s": time.perf_counter() - t0,
                          "policy_version": last_eval.policy_version, **last_eval.metrics})
            stages.record(store, ctx.status, final)
            sinks.log(final)
            print(iteration_line(final))
            progress.update(final)
    return last_eval


def _poll_checkpoint(ctx: RunContext, stages: _Stages) -> None:
    """Commit the checkpoint being written as soon as its files are (a cheap actor call while it is not)."""
    pending = ctx.pending_checkpoint
    if pending is not None and ctx.engines.learners.poll(pending, wait=False):
        stages.commit_checkpoint(ctx, wait=False)
