"""`grpo eval`: a model folder, a run's final policy or one of its checkpoints, evaluated offline on the config's
named eval sets, with the same prompts, scoring and metrics as the evaluations during training
(grpo_core/pipeline/evaluation.py), on a vLLM engine of its own (no Ray, no Prefect).

Output: a table of ``eval/<name>/...`` metrics on stdout, and under ``--out`` one ``eval-<name>.parquet`` of scored
responses per set plus ``metrics.json``.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from grpo_core.config import GRPOConfig
from grpo_core.data.schemas import sample_rows
from grpo_core.pipeline.evaluation import GREEDY, SAMPLED, EvalScorers, load_eval_sets, score_responses, set_metrics

SEED_OFFSET = 10**6  # sampled eval seeds start here (as in training), so they never equal a rollout group's


class EvalError(ValueError):
    """What to evaluate cannot be found or loaded; the message says which folder and why."""


@dataclass
class Policy:
    folder: str          # a local HF model folder
    described: str       # where it came from, for the report
    policy_version: int  # the run's learner step of these weights (0 for a plain model folder)


def resolve_policy(stack: ExitStack, *, model: str | None = None, run: str | None = None,
                   checkpoint: str | None = None, root: str = "runs",
                   storage_options: dict | None = None) -> Policy:
    """The local HF folder of ``--model`` or of a run's ``final/`` / ``--checkpoint iter-N``. A folder in remote
    storage is downloaded, a LoRA adapter merged into its base (into temporary folders that `stack` removes)."""
    if (model is None) == (run is None):
        raise EvalError("give exactly one of --model DIR and --run RUN")
    if model is not None:
        if checkpoint is not None:
            raise EvalError("--checkpoint picks a checkpoint of --run; it has no meaning with --model")
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise EvalError(f"--model {model}: not an HF model folder (no config.json)")
        return Policy(model, model, 0)
    from grpo_core.run.status import NotARunFolder, locate_run
    from grpo_core.run.storage import RunStore
    from grpo_core.weights.lora import ADAPTER_CONFIG, ExportError, export_merged, policy_folder

    try:
        store = RunStore(*locate_run(run, root), storage_options)
    except NotARunFolder as err:
        raise EvalError(f"--run {run!r}: {err} (try --run {err.name} --root {err.root})") from None
    except ValueError as err:  # a name RunStore refuses ("..")
        raise EvalError(f"--run {run!r}: {err}") from None
    if store.read_config() is None:
        raise EvalError(f"{store.uri}: no run there (no config.json)")
    try:
        rel = policy_folder(store, checkpoint)
    except ExportError as err:
        raise EvalError(str(err)) from None
    files = store.list_files(rel)
    version = 0  # the learner step of these weights: final/'s manifest or a checkpoint's state.json holds it
    for name in ("MANIFEST.json", "state.json"):
        if name in files:
            version = int(json.loads(store.get_bytes(f"{rel}/{name}")).get("policy_version", version))
    if ADAPTER_CONFIG in files:  # LoRA: base + adapter merged, as `grpo export --merge` writes it
        out = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="grpo-eval-")), "merged")
        export_merged(store, out, checkpoint=checkpoint)
        return Policy(out, f"{store.url(rel)} (LoRA adapter merged into its base)", version)
    folder = store.local_path(rel)
    if folder is None:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="grpo-eval-"))
        for name in files:
            if "/" not in name:
                store.get_file(f"{rel}/{name}", os.path.join(folder, name))
    return Policy(folder, store.url(rel), version)


def evaluate_offline(cfg: GRPOConfig, policy: Policy, out_dir: str | None,
                     log: Callable[[str], None] = print) -> dict[str, Any]:
    """Generate on every eval set of `cfg` with `policy`, score, write ``out_dir`` (if given); returns
    ``{"metrics": {...}, "sets": {name: rows}, "seconds": ...}``."""
    from transformers import AutoTokenizer

    from grpo_core.engine.roles.sampler import sampling_seed
    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler

    started = time.perf_counter()
    if not cfg.eval_sets():
        raise EvalError("the config names no eval set: set eval.datasets (or data.eval_path)")
    tokenizer = AutoTokenizer.from_pretrained(policy.folder)
    sets = load_eval_sets(cfg, tokenizer, cfg.storage.options or None)
    for s in sets:
        if s.skipped:
            log(f"skipped {len(s.skipped)} bad rows of {s.source} (data.on_bad_row=skip); first: {s.skipped[0]}")
    ro = cfg.rollout
    sampler = VLLMSampler(SamplerSpec(
        model_path=policy.folder, dtype=cfg.model.dtype, seed=cfg.seed, kv_cache_mb=ro.kv_cache_mb,
        max_model_len=cfg.data.max_prompt_tokens + ro.max_new_tokens, enforce_eager=ro.enforce_eager,
        gpu_memory_utilization=ro.gpu_memory_utilization, tensor_parallel_size=ro.tensor_parallel_size,
        share_prompt_prefill=ro.share_prompt_prefill))  # the same KV layout as the run's samplers
    scorers = EvalScorers(cfg, sets)
    metrics: dict[str, float] = {}
    rows: dict[str, int] = {}
    try:
        for eval_set in sets:
            spec, token_lists = eval_set.spec, [p["prompt_token_ids"] for p in eval_set.prompts]
            tables = {}
            if spec.greedy:
                groups = [[s] for s in sampler.generate_greedy(token_lists, max_tokens=ro.max_new_tokens)]
                tables[GREEDY] = sample_rows(0, eval_set.prompts, groups, 0, policy.policy_version, 0)
            if spec.samples:
                seeds = [sampling_seed(cfg.seed, 0, SEED_OFFSET + i) for i in range(len(token_lists))]
                groups = sampler.generate(token_lists, n=spec.samples, max_tokens=ro.max_new_tokens,
                                          temperature=ro.temperature, top_p=ro.top_p, seeds=seeds)
                tables[SAMPLED] = sample_rows(0, eval_set.prompts, groups, 0, policy.policy_version, 0)
            scorer = scorers.for_type(spec.reward_type)
            tables = {mode: score_responses(t, scorer, mode) for mode, t in tables.items()}
            metrics.update(set_metrics(eval_set, tables.get(GREEDY), tables.get(SAMPLED)))
            scored = pa.concat_tables(list(tables.values()), promote_options="default")
            rows[eval_set.name] = scored.num_rows
            if out_dir is not None:
                os.makedirs(out_dir, exist_ok=True)
                pq.write_table(scored, os.path.join(out_dir, eval_set.file_name))
    finally:
        scorers.close()
    result = {"policy": policy.described, "policy_version": policy.policy_version, "metrics": metrics,
              "rows": rows, "seconds": time.perf_counter() - started}
    if out_dir is not None:
        with open(os.path.join(out_dir, "metrics.json"), "w") as handle:
            json.dump(result, handle, indent=1)
    return result


def metrics_table(metrics: dict[str, float]) -> list[tuple[str, str, str]]:
    """(set, metric, value) rows for printing, in the config's set order."""
    out = []
    for key, value in metrics.items():
        _, name, metric = key.split("/", 2)
        shown = f"{value:.0f}" if metric in ("prompts", "unscored") else f"{value:.4f}"
        out.append((name, metric, shown))
    return out
