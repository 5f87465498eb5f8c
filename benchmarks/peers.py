"""This project against TRL's GRPOTrainer, side by side: same model, task and hyperparameters, one after the other.

Three workloads:

* ``tiny`` (default): the built-in task of ``configs/tiny.yaml`` (32 prompts x 8 samples, 16 new tokens, lr 1e-3
  cosine, clip 0.2, no KL, soft overlong punishment over the last 8 tokens), for the config's ``iterations``.
  Both sides run a greedy evaluation on ``data/arith/eval.jsonl`` every ``eval.interval`` steps; evaluation time is
  not training time. Printed: seconds per step (median over steps 1..; step 0 warms up), training seconds until
  the first greedy evaluation >= ``--target`` (0.8), and the ratios ours / TRL.
* ``reference``: the 24M-parameter Qwen2 shape of ``benchmarks/iteration.py`` (8 prompts x 8 samples x 128 new
  tokens, fp32; the model never emits EOS), a few steps each, plus the standalone vLLM generation + plain torch
  train step that ``iteration.py`` measures (``--no-baselines`` skips them).

* ``smollm2``: the real model, ``configs/smollm2-arith.yaml`` (SmolLM2-135M-Instruct built by ``make model-smollm2``,
  8 prompts x 8 samples, at most 64 new tokens, a worked example before each question, fp32) the same way as
  ``tiny``, plus the engines' floors measured in the same call (``benchmarks/peers_floors.py``: standalone vLLM
  generation, a standalone torch train step, the CPU's fp32 GEMM peak, the weight sync by broadcast and by files),
  and the issue's table of ratios against its goals; the last line sums it up. ``--steps N`` shortens both runs
  (the accuracy rows then compare what N steps reach).

TRL runs in its own venv under ``.cache/peers/`` (created on first use: constraints ``torch==<this venv's
torch>`` and ``transformers<5.20``, then ``pip install trl==TRL_VERSION``; the pip cache makes it about 40 s). What
differs between the two sides (TRL's generation is HF ``generate``, its prompt order and sampling seeds are its
own, its accuracy check is integer equality on the last ``\\boxed{}`` where the project uses math-verify) is printed
with the figures.

    .venv/bin/python benchmarks/peers.py [--workload tiny|reference|smollm2] [--steps N] [--only ours|trl]
        [--no-baselines] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TRL_VERSION = "1.16.0"
DEFAULT_CONFIG = "configs/tiny.yaml"
TRL_VENV = REPO / ".cache/peers/trl-venv"
ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(REPO / ".cache/hf"),
    "TORCH_EXTENSIONS_DIR": str(REPO / ".cache/torch_extensions"), "VLLM_CACHE_ROOT": str(REPO / ".cache/vllm"),
    "PREFECT_HOME": "/tmp/bench-prefect", "PREFECT_LOGGING_LEVEL": "WARNING", "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DS_BUILD_OPS": "0",
}
for _k, _v in ENV_DEFAULTS.items():
    os.environ.setdefault(_k, _v)
# TRL's venv gets the project's loss aggregation under TRL's name for it.
LOSS_TYPES = {"seq_mean_token_mean": "grpo", "token_mean": "dapo"}


# ------------------------------------------------------------------------------------------------ TRL's venv

def ensure_trl_venv() -> Path:
    """TRL's venv, pinned: created once (about 40 s with a warm pip cache), then reused."""
    from importlib.metadata import version

    python = TRL_VENV / "bin/python"
    stamp = TRL_VENV / f".installed-trl-{TRL_VERSION}"
    if stamp.exists():
        return python
    torch_version = version("torch")
    print(f"peers: installing TRL {TRL_VERSION} into {TRL_VENV} (torch=={torch_version}, first use only) ...",
          flush=True)
    TRL_VENV.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    constraints = TRL_VENV.parent / "trl-constraints.txt"
    constraints.write_text(f"torch=={torch_version}\ntransformers<5.20\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c",
                    str(constraints), f"trl=={TRL_VERSION}"], check=True)
    stamp.touch()
    return python


def run_trl(spec: dict, work: Path) -> dict:
    python = ensure_trl_venv()
    spec_path, out_path = work / "trl-spec.json", work / "trl.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    threads = str(os.cpu_count() or 1)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
    started = time.perf_counter()
    proc = subprocess.run([str(python), str(REPO / "benchmarks/peers_trl.py"), "--spec", str(spec_path),
                           "--out", str(out_path)], env=env, cwd=str(work))
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not out_path.exists():
        return {"error": f"TRL run exited {proc.returncode}", "wall_s": wall}
    out = json.loads(out_path.read_text())
    out["wall_s"] = wall
    return out


# ------------------------------------------------------------------------------------------------ ours

def run_ours(config_path: str | None, overrides: list[str], work: Path) -> dict:
    """``grpo train`` as a user runs it (its own process), then its metrics.parquet."""
    import pyarrow.parquet as pq

    run_name = "peers"
    args = [str(REPO / ".venv/bin/grpo"), "train", "--config", config_path,
            "--set", f"run_name={run_name}", "--set", f"storage.root={work / 'runs'}"]
    for o in overrides:
        args += ["--set", o]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=str(REPO), env=dict(os.environ))
    wall = time.perf_counter() - started
    metrics_path = work / "runs" / run_name / "metrics.parquet"
    out: dict = {"wall_s": wall}
    if proc.returncode != 0:
        out["error"] = f"grpo train exited {proc.returncode}"
    if metrics_path.exists():
        out["metrics"] = pq.read_table(metrics_path).to_pylist()
    return out


def ours_summary(rows: list[dict], target: float) -> dict:
    """Per-iteration training seconds (the iteration's wall time less its evaluation), the greedy evaluations with
    the training seconds before each (the row of iteration k evaluates the policy after k updates)."""
    steps, evals, trained = [], [], 0.0
    for r in sorted(rows, key=lambda r: r["iteration"]):
        if r.get("eval_accuracy") is not None:
            evals.append({"step": r["iteration"], "accuracy": r["eval_accuracy"], "train_seconds": trained})
        if r.get("time_total_s") is None:
            continue
        seconds = r["time_total_s"] - (r.get("time_eval_s") or 0.0)
        steps.append({"step": r["iteration"] + 1, "seconds": seconds})
        trained += seconds
    return summarise(steps, evals, target)


def summarise(steps: list[dict], evals: list[dict], target: float) -> dict:
    steady = [s["seconds"] for s in steps[1:]] or [s["seconds"] for s in steps]
    hit = next((e for e in evals if e["accuracy"] >= target), None)
    return {"step_s": statistics.median(steady) if steady else None, "first_step_s": steps[0]["seconds"] if steps
            else None, "train_s": sum(s["seconds"] for s in steps), "n_steps": len(steps),
            "target_step": hit["step"] if hit else None, "target_s": hit["train_seconds"] if hit else None,
            "final_eval": evals[-1]["accuracy"] if evals else None,
            "best_eval": max((e["accuracy"] for e in evals), default=None),
            "evals": [(e["step"], round(e["accuracy"], 3)) for e in evals]}


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------------------------------------------ workloads

def config_workload(args, work: Path, name: str = "tiny") -> dict:
    """Both sides on a project config (``tiny``, ``smollm2``)."""
    from grpo_core.config import load_config
    from grpo_core.data.prompts import DEFAULT_SYSTEM_PROMPTS

    overrides = list(args.overrides) + ([f"iterations={args.steps}"] if args.steps else [])
    cfg = load_config(str(REPO / args.config), overrides)
    a, ro, tr = cfg.algo, cfg.rollout, cfg.train
    if a.loss_agg_mode not in LOSS_TYPES:
        raise SystemExit(f"peers: algo.loss_agg_mode={a.loss_agg_mode} has no TRL loss_type here")
    spec = {
        "model_dir": str((REPO / cfg.model.path).resolve()), "train_path": str(REPO / cfg.data.train_path),
        "eval_path": str(REPO / cfg.data.eval_path) if cfg.data.eval_path else None,
        "system_prompt": DEFAULT_SYSTEM_PROMPTS[cfg.reward.type] if cfg.data.system_prompt is None
        else cfg.data.system_prompt,
        "seed": cfg.seed, "steps": cfg.iterations, "lr": tr.lr, "lr_schedule": tr.lr_schedule,
        "grad_clip": tr.grad_clip or 0.0, "micro_batch": cfg.micro_batch_size, "grad_accum": cfg.grad_accum_steps,
        "samples": ro.samples_per_prompt, "max_new_tokens": ro.max_new_tokens, "clip": a.clip_eps_low,
        "loss_type": LOSS_TYPES[a.loss_agg_mode], "eval_interval": cfg.eval.interval,
        "soft_overlong_cache": a.soft_overlong_cache_length if a.soft_overlong else 0,
        "few_shot": [t.model_dump() for t in cfg.data.few_shot],
        "output_dir": str(work / "trl-out"),
    }
    result: dict = {"workload": name, "config": args.config, "overrides": overrides, "spec": spec, "cfg": cfg,
                    "differences": [
                        "generation: TRL uses HF generate in the training process; the project vLLM in a Ray actor",
                        "prompt order and sampling seeds: each side's own (same data set, same batch shape)",
                        "accuracy: TRL side checks the last \\boxed{} as a number; the project uses math-verify",
                        f"clip: TRL epsilon={a.clip_eps_low} (symmetric); project clip_eps_low/high="
                        f"{a.clip_eps_low}/{a.clip_eps_high}",
                        "soft overlong: TRL's get_soft_overlong_punishment reward vs the project's algo.soft_overlong "
                        "(the same formula, added to the reward on both sides)"]}
    if args.only in (None, "trl"):
        print(f"peers: TRL {TRL_VERSION} GRPOTrainer, {cfg.iterations} steps ...", flush=True)
        result["trl"] = run_trl(spec, work)
    if args.only in (None, "ours"):
        print(f"peers: grpo train --config {args.config}, {cfg.iterations} iterations ...", flush=True)
        result["ours"] = run_ours(str(REPO / args.config), overrides, work)
    return result


def smollm2_workload(args, work: Path) -> dict:
    """The ``tiny`` comparison on SmolLM2-135M-Instruct, then the floors and the sync by transport."""
    import pyarrow.parquet as pq

    from benchmarks.peers_floors import run_floors, sync_runs

    if args.config == DEFAULT_CONFIG:
        args.config = "configs/smollm2-arith.yaml"
    model = REPO / ".cache/models/smollm2/grpo_build.json"
    if not model.exists():
        raise SystemExit(f"peers: {model.parent} is not built; run `make model-smollm2` first")
    result = config_workload(args, work, "smollm2")
    ours = result.get("ours", {})
    rows = [r for r in ours.get("metrics", []) if r.get("time_total_s") is not None]
    # What the learner trained on: every sequence, prompt and response ("logical" tokens, what a plain loop
    # computes), and what it had to compute with each group's prompt once (train.pack_prompts; the FLOP count).
    # Iteration 0's prompts, group by group (what its seeds were given for), are the floors' prompts.
    logical, packed, first_prompts = {}, {}, None
    for r in rows:
        path = work / "runs" / "peers" / f"iter-{r['iteration']:06d}" / "rollouts.parquet"
        if path.exists():
            t = pq.read_table(path, columns=["group_id", "prompt_token_ids", "response_token_ids"]).to_pydict()
            prompts = dict(zip(t["group_id"], t["prompt_token_ids"]))
            responses = sum(map(len, t["response_token_ids"]))
            logical[r["iteration"]] = sum(map(len, t["prompt_token_ids"])) + responses
            packed[r["iteration"]] = sum(map(len, prompts.values())) + responses
            if r["iteration"] == 0:
                first_prompts = [p for _, p in sorted(prompts.items())]
    result["learner_tokens"], result["learner_tokens_packed"] = logical, packed
    if not args.no_baselines and rows:
        response_mean = statistics.mean(r["response_length_mean"] for r in rows)
        result["floors"] = run_floors(result["cfg"], response_mean, work, prompts=first_prompts)
        result["sync"] = sync_runs(str(REPO / args.config), result["overrides"], work, run_ours)
    return result


def reference_workload(args, work: Path) -> dict:
    import benchmarks.iteration as bi

    shape = dict(bi.FULL)
    steps = args.steps or 4
    info = bi.build_model(work / "model", shape, force_length=True)
    prompts = bi.encode_prompts(work / "model", shape["prompts"])
    kv_mb = bi.kv_cache_mb(info, shape["prompts"] * shape["samples"], max(map(len, prompts)) + shape["new_tokens"]
                           + 16)
    # The reference workload's train split: its first `prompts` rows (TRL shuffles; every prompt is a question of
    # the same few tokens, so which ones does not change the work).
    spec = {"model_dir": str(work / "model"), "train_path": str(bi.TRAIN_PATH), "eval_path": None,
            "system_prompt": "Please reason step by step, and put your final answer within \\boxed{}.",
            "seed": 0, "steps": steps, "lr": 1e-5, "lr_schedule": "constant", "grad_clip": 1.0,
            "micro_batch": shape["micro"], "grad_accum": shape["prompts"] * shape["samples"] // shape["micro"],
            "samples": shape["samples"], "max_new_tokens": shape["new_tokens"], "clip": 0.2, "loss_type": "grpo",
            "eval_interval": 0, "soft_overlong_cache": 0, "output_dir": str(work / "trl-out")}
    result: dict = {"workload": "reference", "info": info, "shape": shape, "spec": spec, "differences": [
        "generation: TRL uses HF generate in the training process; the project vLLM in a Ray actor",
        "both sides generate new_tokens per response (the model is built never to emit EOS)",
        "TRL steps include its HF generate; the project's iteration is rollout + score + train + sync + sync check"]}
    if args.only in (None, "trl"):
        print(f"peers: TRL {TRL_VERSION} GRPOTrainer on the reference workload, {steps} steps ...", flush=True)
        result["trl"] = run_trl(spec, work)
    if args.only in (None, "ours"):
        print(f"peers: grpo_train flow on the reference workload, {steps} iterations ...", flush=True)
        flow = bi.run_flow(work / "model", work / "runs", shape, steps, kv_mb, 0, args.overrides)
        result["ours"] = {k: v for k, v in flow.items() if k in ("metrics", "engine", "error", "total_s",
                                                                 "engines_ready_s")}
        if not args.no_baselines:
            base = {"model_dir": str(work / "model"), "prompts": prompts, "samples": shape["samples"],
                    "new_tokens": shape["new_tokens"], "kv_mb": kv_mb, "max_model_len": 512 + shape["new_tokens"],
                    "micro": shape["micro"], "pad_id": info["pad_id"], "repeats": 2}
            (work / "baseline.json").write_text(json.dumps(base))
            print("peers: standalone vLLM generation and torch train step ...", flush=True)
            result["standalone_gen"] = bi.run_baseline("vllm", work / "baseline.json", work / "vllm.json")
            result["standalone_train"] = bi.run_baseline("train", work / "baseline.json", work / "train.json")
    return result


# ------------------------------------------------------------------------------------------------ report

def _f(v, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "n/a"


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "n/a"


def report(result: dict, target: float) -> None:
    print()
    print("=" * 88)
    print("command:  " + " ".join([Path(sys.executable).name] + sys.argv))
    print(f"machine:  {os.cpu_count()} CPU cores, load avg {os.getloadavg()[0]:.2f} (1 min) at the end; "
          "figures measured while other jobs ran are noisy")
    print(f"workload: {result['workload']}" + (f" ({result['config']} {' '.join(result['overrides'])})"
                                                if result["workload"] == "tiny" else ""))
    trl, ours = result.get("trl", {}), result.get("ours", {})
    if trl.get("error"):
        print("TRL FAILED: " + trl["error"])
    if ours.get("error"):
        print("OURS FAILED: " + str(ours["error"])[-3000:])
    rows = [r for r in ours.get("metrics", []) if r.get("time_total_s") is not None]
    if result["workload"] in ("tiny", "smollm2"):
        t = summarise(trl.get("steps", []), trl.get("evals", []), target) if trl.get("steps") else {}
        o = ours_summary(ours.get("metrics", []), target) if rows else {}
        print("-" * 88)
        print(f"{'':<40}{'grpo-flow':>14}{'TRL ' + trl.get('trl_version', TRL_VERSION):>14}{'ratio':>10}")
        for label, key in (("seconds per step (median, steps 2..)", "step_s"), ("first step s", "first_step_s"),
                           ("training s, all steps (no eval)", "train_s"),
                           (f"step of first greedy eval >= {target}", "target_step"),
                           (f"training s to greedy eval >= {target}", "target_s"),
                           ("best greedy eval", "best_eval"), ("final greedy eval", "final_eval")):
            ratio = _ratio(o.get(key), t.get(key)) if key in ("step_s", "train_s", "target_s") else ""
            print(f"{label:<40}{_f(o.get(key)):>14}{_f(t.get(key)):>14}{ratio:>10}")
        print(f"{'wall of the whole call s (incl. start-up)':<40}{_f(ours.get('wall_s'), '.1f'):>14}"
              f"{_f(trl.get('wall_s'), '.1f'):>14}")
        print(f"evals ours: {o.get('evals')}")
        print(f"evals TRL:  {t.get('evals')}")
    else:
        steps = [s["seconds"] for s in trl.get("steps", [])[1:]] or [s["seconds"] for s in trl.get("steps", [])]
        t_step = statistics.median(steps) if steps else None
        steady = [r for r in rows if r["iteration"] >= 1] or rows
        o_step = _median(steady, "time_total_s")
        gen, trn = result.get("standalone_gen", {}), result.get("standalone_train", {})
        g, s = gen.get("generate_s"), trn.get("step_s")
        print("-" * 88)
        print(f"{'seconds per step (median, steps 2..)':<44}{'grpo-flow':>12}{_f(o_step):>10}   TRL {_f(t_step)}"
              f"   ratio {_ratio(o_step, t_step)}")
        if g and s:
            print(f"{'standalone vLLM generate + torch train step':<44}{'':>12}{_f(g + s):>10}   "
                  f"({_f(g)} + {_f(s)}); iteration / standalone {_ratio(o_step, g + s)}")
        print(f"TRL peak RSS {_f(trl.get('peak_rss_gib'), '.2f')} GiB; steps {[round(x, 2) for x in steps]}")
    if rows:
        steady = [r for r in rows if r["iteration"] >= 1] or rows
        print("-" * 88)
        print("grpo-flow stage medians (iterations 1..): " + ", ".join(
            f"{k[5:-2]} {_f(_median(steady, k))}" for k in (
                "time_rollout_s", "time_score_s", "time_train_s", "time_sync_s", "time_sync_check_s",
                "time_overhead_s", "time_total_s")))
    print("differences: " + "; ".join(result["differences"]))
    if result["workload"] == "smollm2":
        goals_table(result, rows)
    print("=" * 88)


def goals_table(result: dict, rows: list[dict]) -> None:
    """The issue's figures against their goals, then one summary line."""
    trl = result.get("trl", {})
    t = summarise(trl.get("steps", []), trl.get("evals", []), 1.0) if trl.get("steps") else {}
    o = ours_summary(result.get("ours", {}).get("metrics", []), 1.0) if rows else {}
    steady = [r for r in rows if r["iteration"] >= 1] or rows
    floors, sync = result.get("floors", {}), result.get("sync", {})
    gen, trn, gemm = floors.get("gen", {}), floors.get("train", {}), floors.get("gemm", {})
    lines, summary = [], []

    def add(label: str, value, goal: str, key: str, fmt: str = ".2f", suffix: str = "x") -> None:
        shown = format(value, fmt) + suffix if isinstance(value, (int, float)) else "n/a"
        lines.append(f"{label:<62}{shown:>10}   {goal}")
        summary.append(f"{key} {shown}")

    # 1. seconds per iteration against TRL's step
    add("s per iteration / TRL s per step (median, steps 2..)",
        o.get("step_s") / t["step_s"] if o.get("step_s") and t.get("step_s") else None, "goal <= 0.5x", "step")
    # 2. training time to the best held-out greedy accuracy TRL reached
    best = t.get("best_eval")
    if best is not None and best > 0:
        oh = ours_summary(result["ours"].get("metrics", []), best)
        th = summarise(trl["steps"], trl["evals"], best)
        ratio = oh["target_s"] / th["target_s"] if oh.get("target_s") is not None and th.get("target_s") else None
        add(f"training s to TRL's best greedy eval {best:.3f}: ours / TRL"
            + ("" if oh.get("target_s") is not None else " (ours never reached it)"), ratio, "goal <= 0.5x", "to-acc")
    else:
        add("training s to TRL's best greedy eval (TRL reached none)", None, "goal <= 0.5x", "to-acc")
    # 3. the engines' floor
    floor = (gen.get("generate_s") or 0) + (trn.get("step_s") or 0) if gen.get("generate_s") and trn.get("step_s") \
        else None
    add(f"iteration / (standalone generate {_f(gen.get('generate_s'))} + train step {_f(trn.get('step_s'))} s)",
        o.get("step_s") / floor if o.get("step_s") and floor else None, "goal <= 1.05x", "floor")
    # 4. learner tokens/s against a plain torch loop; 5. its FLOP/s against the GEMM peak
    tokens = result.get("learner_tokens", {})
    rates = [tokens[r["iteration"]] / r["time_train_s"] for r in steady if r["iteration"] in tokens
             and r.get("time_train_s")]
    ours_rate = statistics.median(rates) if rates else None
    torch_rate = floors.get("train_tokens") / trn["step_s"] if trn.get("step_s") else None
    add(f"learner tokens/s {_f(ours_rate, '.0f')} / plain torch loop {_f(torch_rate, '.0f')}",
        ours_rate / torch_rate if ours_rate and torch_rate else None, "goal >= 0.9x", "learner")
    packed = result.get("learner_tokens_packed", {})
    packed_rates = [packed[r["iteration"]] / r["time_train_s"] for r in steady if r["iteration"] in packed
                    and r.get("time_train_s")]
    params = floors.get("params")
    flops = 6 * params * statistics.median(packed_rates) if packed_rates and params else None
    add(f"learner GFLOP/s {_f(flops / 1e9 if flops else None, '.1f')} (6 x {_f(params / 1e6 if params else None, '.1f')}M"
        f" x tokens/s, each group's prompt once) / fp32 GEMM peak {_f(gemm.get('gflops'), '.1f')}",
        100 * flops / 1e9 / gemm["gflops"] if flops and gemm.get("gflops") else None, "report; goal >= 30%", "mfu",
        ".1f", "%")
    # 6. weight sync
    inproc = _median(steady, "time_sync_s")
    add(f"sync in-process {_f(inproc)} s / iteration {_f(o.get('step_s'))} s",
        100 * inproc / o["step_s"] if inproc and o.get("step_s") else None, "goal <= 5%", "sync-inproc", ".1f", "%")
    for transport in ("broadcast", "files"):
        add(f"sync by {transport} (split placement), s", sync.get(transport, {}).get("sync_s"), "report",
            f"sync-{transport}", ".2f", "s")
    # 7. sampler tokens/s through the flow against standalone vLLM
    flow_rates = [r["rollout_tokens"] / r["time_rollout_s"] for r in steady if r.get("rollout_tokens")
                  and r.get("time_rollout_s")]
    flow_rate = statistics.median(flow_rates) if flow_rates else None
    alone = gen["tokens"] / gen["generate_s"] if gen.get("tokens") and gen.get("generate_s") else None
    add(f"sampler tokens/s in the flow {_f(flow_rate, '.0f')} / standalone vLLM {_f(alone, '.0f')}",
        flow_rate / alone if flow_rate and alone else None, "goal >= 0.95x", "sampler")
    # the same work: iteration 0's prompts, weights, seeds and logprobs, so the same tokens
    first = next((r for r in rows if r["iteration"] == 0 and r.get("rollout_tokens") and r.get("time_rollout_s")),
                 None)
    same = gen.get("tokens_flow") / gen["generate_flow_s"] if gen.get("tokens_flow") and gen.get("generate_flow_s") \
        else None
    rate0 = first["rollout_tokens"] / first["time_rollout_s"] if first else None
    add(f"  iteration 0 in the flow {_f(rate0, '.0f')} / vLLM given its requests {_f(same, '.0f')} (tokens "
        f"{first['rollout_tokens'] if first else 'n/a'} / {gen.get('tokens_flow', 'n/a')})",
        rate0 / same if rate0 and same else None, "goal >= 0.95x", "sampler-same")
    print("-" * 88)
    print("goals (issue 21), fp32 on this CPU:")
    for line in lines:
        print("  " + line)
    print("summary: smollm2 " + " | ".join(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["tiny", "reference", "smollm2"], default="tiny")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="tiny and smollm2 workloads: the project's config (smollm2: configs/smollm2-arith.yaml)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps of each side (tiny: the config's iterations; reference: 4)")
    parser.add_argument("--target", type=float, default=0.8, help="greedy eval accuracy to reach (tiny)")
    parser.add_argument("--only", choices=["ours", "trl"], default=None, help="run one side only")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override of the project's side (repeatable)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="reference, smollm2: skip the standalone baselines (and smollm2's sync runs)")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args()
    from benchmarks.workdir import work_folder

    with work_folder("bench-peers-", args.keep) as work:
        workloads = {"tiny": config_workload, "reference": reference_workload, "smollm2": smollm2_workload}
        result = workloads[args.workload](args, work)
        report(result, args.target)
        if args.json:
            Path(args.json).write_text(json.dumps(result, default=str, indent=1))


if __name__ == "__main__":
    main()
