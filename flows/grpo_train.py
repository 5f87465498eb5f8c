"""The `grpo-train` flow: per iteration rollout -> score -> train -> sync, with evaluation every `eval.interval`.

Engines (the policy actor, the scorer's processes) are created once per flow run. Each task returns a small
reference with metrics; the data stays in the run folder. metrics.parquet gets one row per iteration: the row of
iteration k describes the weights that sampled it (version before k's update), so its ``eval_accuracy`` is that of
the policy before the update; a last row, iteration = ``iterations``, holds the final evaluation.
"""
from __future__ import annotations

import json
import time
from typing import Any

from prefect import flow

from grpo_core.config import GRPOConfig, load_config
from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer
from grpo_core.progress import Progress
from grpo_core.report import plot_curves, summary_lines
from grpo_core.rewards.scorer import Scorer
from grpo_core.storage import RunStore
from tasks.context import RunContext
from tasks.evaluate import evaluate
from tasks.rollout import rollout
from tasks.score import assemble, score
from tasks.sync import ensure_synced, sync
from tasks.train import train


def _build_context(cfg: GRPOConfig, store: RunStore) -> RunContext:
    from transformers import AutoTokenizer

    from grpo_core.cluster.ray_cluster import create_policy_worker, start_ray
    from grpo_core.data.readers import read_prompts

    d = cfg.data
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    encoder = PromptTokenizer(tokenizer, cfg.reward.type, d.system_prompt, d.max_prompt_tokens)
    read = dict(format=d.format, prompt_key=d.prompt_key, answer_key=d.answer_key, on_bad_row=d.on_bad_row,
                storage_options=cfg.storage.options or None)
    train_set = read_prompts(d.train_path, **read)
    rounds = 1 + (cfg.algo.max_resample_times if cfg.algo.filter_groups else 0)
    stream = PromptStream(train_set, encoder, batch_size=cfg.rollout.prompts_per_iteration, seed=cfg.seed,
                          shuffle=d.shuffle, rounds_per_iteration=rounds)
    eval_prompts: list[dict[str, Any]] = []
    sets = [train_set]
    if d.eval_path and cfg.eval.interval > 0:
        eval_set = read_prompts(d.eval_path, **read)
        sets.append(eval_set)
        eval_prompts = PromptStream(eval_set, encoder, batch_size=1, seed=0, shuffle=False).all(cfg.eval.max_prompts)
    skipped = {s.source: [{"row": row, "reason": why} for row, why in s.skipped] for s in sets if s.skipped}
    if skipped:  # counted, reported and kept with the run, never dropped silently
        store.put_bytes("skipped_rows.json", json.dumps(skipped, indent=1).encode())
        for source, rows in skipped.items():
            print(f"skipped {len(rows)} bad rows of {source} (data.on_bad_row=skip), listed in "
                  f"{store.uri}/skipped_rows.json; first: {rows[0]}")
    start_ray(cfg)
    worker = create_policy_worker(cfg)
    r = cfg.reward
    scorer = Scorer(reward_type=r.type, rewards=r.rewards, weights=r.weights, num_workers=r.num_workers,
                    timeout_s=r.timeout_s, options=r.options)
    return RunContext(cfg=cfg, store=store, worker=worker, scorer=scorer, train_prompts=stream,
                      eval_prompts=eval_prompts)


def _collect_batch(ctx: RunContext, iteration: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rollout then score. Dynamic sampling (algo.filter_groups) adds rounds until enough groups have mixed
    outcomes or `max_resample_times` more rounds were sampled, then assembles the batch."""
    import torch

    from grpo_core.algo import DynamicBatch

    cfg = ctx.cfg
    if not cfg.algo.filter_groups:
        ro = rollout(ctx, iteration, 0)
        return [ro], score(ctx, iteration, ro["name"])
    batch = DynamicBatch(cfg.rollout.prompts_per_iteration, cfg.algo.max_resample_times, cfg.algo.filter_range)
    rollouts, scored = [], []
    while not (batch.full or batch.exhausted):
        ro = rollout(ctx, iteration, len(rollouts))
        sc = score(ctx, iteration, ro["name"])
        rollouts.append(ro)
        scored.append(sc)
        success = torch.tensor(sc.pop("group_success"), dtype=torch.float64)
        batch.add(success, list(range(success.shape[0])))
    out = assemble(ctx, iteration, [s["name"] for s in scored])
    first = dict(scored[0])
    first.update({k: v for k, v in out.items() if k != "name"})
    first["score_seconds"] = sum(s.get("score_seconds", 0.0) for s in scored)
    return rollouts, first


@flow(name="grpo-train", log_prints=True)
def grpo_train(config_path: str | None = None, overrides: list[str] | None = None,
               config: dict | None = None) -> dict[str, Any]:
    """Train a policy with GRPO-family RL. Give a YAML path (+ `key=value` overrides) or a config dict."""
    from grpo_core.cluster.ray_cluster import kill, stop_ray
    from grpo_core.config import build_config

    cfg = build_config(config, "<flow parameter>") if config is not None else load_config(config_path, overrides)
    store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
    store.write_config(cfg.model_dump(mode="json"))
    started = time.perf_counter()
    ctx = None
    try:
        ctx = _build_context(cfg, store)
        return _run_iterations(ctx, started)
    finally:
        if ctx is not None:
            ctx.scorer.close()
            kill(ctx.worker)
        stop_ray()


def _run_iterations(ctx: RunContext, started: float) -> dict[str, Any]:
    from grpo_core.cluster.ray_cluster import call

    cfg, store = ctx.cfg, ctx.store
    info = call(ctx.worker.info)
    print(f"engines ready in {time.perf_counter() - started:.1f}s (vLLM load {info['sampler_load_s']:.1f}s, "
          f"DeepSpeed init {info['learner_init_s']:.1f}s); run folder {store.uri}")
    steps_per_iter = cfg.train.ppo_epochs * (cfg.batch_size // (cfg.train.mini_batch_size or cfg.batch_size))
    do_eval = bool(ctx.eval_prompts) and cfg.eval.interval > 0
    progress = Progress(cfg.iterations)
    last_eval: dict[str, Any] | None = None
    with progress:
        for it in range(cfg.iterations):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"iteration": it}
            resync = ensure_synced(ctx, expected_learner_version=it * steps_per_iter)
            row["resynced"] = resync is not None
            row["eval_accuracy"] = None
            if do_eval and it % cfg.eval.interval == 0:
                last_eval = evaluate(ctx, it)
                row["eval_accuracy"] = last_eval["accuracy"]
                row["time_eval_s"] = time.perf_counter() - t0
            t1 = time.perf_counter()
            rollouts, sc = _collect_batch(ctx, it)
            t2 = time.perf_counter()
            tr = train(ctx, it)
            t3 = time.perf_counter()
            sy = sync(ctx, check=(it, rollouts[0]["name"]))
            t4 = time.perf_counter()
            inside = sum(r["seconds"] for r in rollouts if not r.get("reused")) + tr["seconds"] + sy["seconds"] + \
                sy.get("check_seconds", 0.0)
            row.update({
                "policy_version": rollouts[0]["policy_version"],
                "reward_mean": sc["reward_mean"],
                "accuracy_mean": sc.get("reward_accuracy_mean"),
                "loss": tr["loss"], "grad_norm": tr["grad_norm"], "lr": tr["lr"],
                "clipfrac": tr.get("clipfrac"), "clipfrac_low": tr.get("clipfrac_low"),
                "clipfrac_high": tr.get("clipfrac_high"), "approx_kl": tr.get("approx_kl"),
                "kl_ref": tr.get("kl_ref"), "entropy": tr.get("entropy"),
                "mismatch_abs_logp_mean": tr.get("mismatch_abs_logp_mean"),
                "response_length_mean": rollouts[0]["response_length_mean"],
                "truncated_frac": rollouts[0]["truncated_frac"],
                "kept_frac": sc.get("kept_frac"), "rollout_rounds": len(rollouts),
                "filtered_group_frac": sc.get("filtered_group_frac"),
                "time_rollout_s": t2 - t1 - _score_seconds(sc), "time_score_s": _score_seconds(sc),
                "sync_logprob_max_diff": sy.get("sync_logprob_max_diff"),
                "time_train_s": t3 - t2, "time_sync_s": t4 - t3 - sy.get("check_seconds", 0.0),
                "time_sync_check_s": sy.get("check_seconds"), "time_total_s": t4 - t0,
                "time_overhead_s": (t4 - t1) - inside - _score_seconds(sc),
            })
            store.append_metrics(row)
            progress.update(row)
        final: dict[str, Any] = {"iteration": cfg.iterations, "eval_accuracy": None}
        if do_eval:
            t0 = time.perf_counter()
            last_eval = evaluate(ctx, cfg.iterations)
            final.update({"eval_accuracy": last_eval["accuracy"], "time_eval_s": time.perf_counter() - t0,
                          "policy_version": last_eval["policy_version"]})
            store.append_metrics(final)
            progress.update(final)
    saved = call(ctx.worker.save_final)
    metrics = store.read_metrics()
    store.put_bytes("curves.png", plot_curves(metrics))
    lines = summary_lines(metrics)
    lines.append(f"final policy (version {saved['policy_version']}) saved to {saved['folder']}")
    lines.append(f"total wall time {time.perf_counter() - started:.1f}s; run folder {store.uri}")
    for line in lines:
        print(line)
    return {"run": store.uri, "iterations": cfg.iterations, "final_folder": saved["folder"],
            "final_eval_accuracy": last_eval["accuracy"] if last_eval else None, "summary": lines}


def _score_seconds(sc: dict[str, Any]) -> float:
    return float(sc.get("score_seconds", 0.0))
