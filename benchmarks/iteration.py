"""One GRPO iteration on the reference CPU workload, through the real flow, against standalone baselines.

Workload (docs: STACK.md "A reference CPU workload"): a random ~24M-parameter fp32 Qwen2, 8 prompts x 8 samples x 128
new tokens, on the CPU. The script

1. builds the model (random weights, the tiny model's tokenizer) into a temp folder; nothing comes from a hub;
2. runs ``flows.grpo_train.grpo_train`` for ``--iterations`` iterations (no eval) and reads metrics.parquet: the
   median of each stage over iterations 1.. (iteration 0 includes warm-up) and the engine start-up;
3. times the same work standalone, each in its own process: plain in-process vLLM generation, and a plain torch
   train step (forward + backward + AdamW over 64 sequences, the flow's micro-batching);
4. prints a table and the ratio iteration / (standalone generation + standalone train step).

Random weights emit EOS now and then (one token in ~400 with this vocab): the model is built so it never does (one
residual dimension carries a large positive constant and the EOS embedding has the opposite sign there, so EOS gets a
logit ~40 below the rest); ``--no-force-length`` keeps a plain random model. The mean response length the flow got is
printed either way.

    .venv/bin/python benchmarks/iteration.py [--iterations 4] [--quick] [--micro-batch 16] [--keep]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.workdir import work_folder  # noqa: E402

ENV_DEFAULTS = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    "TORCH_EXTENSIONS_DIR": str(REPO / ".cache/torch_extensions"),
    "PREFECT_HOME": "/tmp/bench-prefect", "PREFECT_LOGGING_LEVEL": "WARNING", "RAY_USAGE_STATS_ENABLED": "0",
    "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": "WARNING", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
for _k, _v in ENV_DEFAULTS.items():
    os.environ.setdefault(_k, _v)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

TRAIN_PATH = REPO / "data/arith/train.jsonl"
RUN_NAME = "bench"


# (hidden, layers, heads, intermediate), prompts, samples, new tokens, micro-batch
FULL = dict(hidden=512, layers=8, heads=8, intermediate=1280, prompts=8, samples=8, new_tokens=128, micro=16)
QUICK = dict(hidden=128, layers=2, heads=4, intermediate=512, prompts=4, samples=4, new_tokens=32, micro=8)


# ------------------------------------------------------------------------------------------------ model

def build_model(out: Path, shape: dict, force_length: bool, seed: int = 0) -> dict:
    """Random fp32 Qwen2 with tied embeddings and the tiny model's tokenizer, saved HF-style under ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from grpo_core.lifecycle.model.tiny import TinySpec, build_tokenizer, read_questions, tokenizer_corpus

    spec = TinySpec()
    tokenizer = build_tokenizer(tokenizer_corpus(read_questions(TRAIN_PATH), spec), spec.vocab_size)
    vocab = len(tokenizer)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["heads"],
        max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
        use_cache=True)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float()
    if force_length:
        # Dimension 0 of every input embedding is +C, EOS's is -C. The residual stream keeps a large positive
        # component there (layers add ~0.2 per step at init), so with tied weights the EOS logit sits ~2*C*h[0]
        # (about 40) below the others. Compute per token is unchanged.
        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            emb[:, 0] = 4.0
            emb[tokenizer.eos_token_id, 0] = -4.0
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "vocab": vocab, "layers": shape["layers"], "hidden": shape["hidden"],
            "heads": shape["heads"], "intermediate": shape["intermediate"], "eos_id": tokenizer.eos_token_id,
            "pad_id": tokenizer.pad_token_id}


def encode_prompts(model_dir: Path, n: int) -> list[list[int]]:
    """The first ``n`` train prompts, templated and tokenised exactly as the flow does."""
    from transformers import AutoTokenizer

    from grpo_core.data.readers import read_prompts
    from grpo_core.pipeline.prompts import PromptTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = PromptTokenizer(tok, "boxed", None, 512)
    rows = read_prompts(str(TRAIN_PATH)).rows[:n]
    return [enc.encode(r, str(TRAIN_PATH))["prompt_token_ids"] for r in rows]


def kv_cache_mb(info: dict, sequences: int, tokens_per_seq: int) -> int:
    head_dim = info["hidden"] // info["heads"]
    need = 2 * info["layers"] * info["heads"] * head_dim * 4 * sequences * tokens_per_seq
    return max(64, int(math.ceil(1.5 * need / 2**20)))


# ------------------------------------------------------------------------------------------------ flow

def run_flow(model_dir: Path, root: Path, shape: dict, iterations: int, kv_mb: int,
             checkpoint_interval: int = 0, overrides: list[str] | None = None) -> dict:
    import pyarrow.parquet as pq

    import flows.grpo_train as gt
    from grpo_core.config import merge_trees, parse_overrides
    from grpo_core.run.storage import RunStore

    captured: dict = {"lines": []}

    def _print(*args, **kwargs):  # the flow's prints go to Prefect's logger (silenced at WARNING): keep them here
        text = " ".join(str(a) for a in args)
        captured["lines"].append(text)
        if text.startswith("engines ready in ") and "ready_at" not in captured:
            captured["ready_at"] = time.perf_counter()
        print(f"  [flow] {text}", file=sys.__stdout__, flush=True)

    gt.print = _print
    config = {
        "run_name": RUN_NAME, "seed": 0, "iterations": iterations,
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {"train_path": str(TRAIN_PATH), "max_prompt_tokens": 512},
        "rollout": {"prompts_per_iteration": shape["prompts"], "samples_per_prompt": shape["samples"],
                    "max_new_tokens": shape["new_tokens"], "kv_cache_mb": kv_mb},
        "eval": {"interval": 0},
        "reward": {"num_workers": 2},
        "train": {"micro_batch_size": shape["micro"]},
        "storage": {"root": str(root)},
        "checkpoint": {"interval": checkpoint_interval},
    }
    config = merge_trees(config, parse_overrides(overrides or []))
    t0 = time.perf_counter()
    error = None
    try:
        gt.grpo_train(config=config)
    except BaseException:  # noqa: BLE001 - a benchmark reports the failure and goes on to the baselines
        error = traceback.format_exc()
    finally:
        del gt.print
    total = time.perf_counter() - t0
    out: dict = {"config": config, "total_s": total, "error": error, "lines": captured["lines"]}
    if "ready_at" in captured:  # includes the Prefect flow-run start (ephemeral API) and config checks
        out["call_to_engines_ready_s"] = captured["ready_at"] - t0
    for line in captured["lines"]:
        if line.startswith("engines ready in "):
            out["engines_ready_line"] = line
            try:
                out["engines_ready_s"] = float(line.split()[3].rstrip("s"))
            except (IndexError, ValueError):
                pass
    metrics_path = root / RUN_NAME / "metrics.parquet"
    if metrics_path.exists():
        out["metrics"] = pq.read_table(metrics_path).to_pylist()
        store = RunStore(str(root), RUN_NAME)
        engine = []
        for row in out["metrics"]:
            it = row["iteration"]
            ro = store.entry(it, "rollouts.parquet")
            tr = store.entry(it, "train.json")
            engine.append({"iteration": it,
                           "rollout_engine_s": ro.meta.get("seconds") if ro else None,
                           "train_engine_s": store.get_json(it, "train.json").get("seconds") if tr else None})
        out["engine"] = engine
    return out


# ------------------------------------------------------------------------------------------------ baselines

def baseline_vllm(model_dir: str, prompts: list[list[int]], samples: int, new_tokens: int, kv_mb: int,
                  max_model_len: int, repeats: int, ignore_eos: bool = True, engine: dict | None = None,
                  seeds: list[int] | None = None) -> dict:
    """``engine``: more of vLLM's engine arguments (the smollm2 floor gives the sampler's own: prefix caching with
    its block size, no chunked prefill). ``seeds``: also time the requests the flow's sampler makes of its first
    iteration (a seed per prompt, which exact resume needs, and each token's logprob, which the off-policy checks
    need): the same tokens as that iteration, so the two times compare the same work."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams, TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=model_dir, enforce_eager=True, distributed_executor_backend="uni",
              kv_cache_memory_bytes=kv_mb * 2**20, dtype="float32", max_model_len=max_model_len, seed=0,
              **(engine or {}))
    load = time.perf_counter() - t0
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]

    def timed(params, fresh_cache: bool = False) -> tuple[float, int]:
        if fresh_cache:
            llm.reset_prefix_cache()  # as the sampler does before each batch
        started = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        return time.perf_counter() - started, sum(len(c.token_ids) for o in outs for c in o.outputs)

    def sampling(**extra):
        return SamplingParams(n=samples, max_tokens=new_tokens, temperature=1.0, ignore_eos=ignore_eos, **extra)

    warm, _ = timed(sampling())
    plain = [timed(sampling()) for _ in range(repeats)]
    with_lp = [timed(sampling(logprobs=0)) for _ in range(repeats)]
    out = {"load_s": load, "warmup_s": warm, "generate_s": statistics.median(t for t, _ in plain),
           "generate_all_s": [t for t, _ in plain], "tokens": plain[0][1],
           "generate_logprobs_s": statistics.median(t for t, _ in with_lp)}
    if seeds is not None:
        from grpo_core.engine.rollout.sampler import _FAST_LOGPROBS

        requests = [sampling(seed=seed, **_FAST_LOGPROBS) for seed in seeds]
        flow = [timed(requests, fresh_cache=True) for _ in range(repeats)]
        out.update(generate_flow_s=statistics.median(t for t, _ in flow), generate_flow_all_s=[t for t, _ in flow],
                   tokens_flow=flow[0][1])
    return out


def baseline_train(model_dir: str, prompts: list[list[int]], samples: int, new_tokens: int, micro: int,
                   pad_id: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    vocab = model.config.vocab_size
    seqs = [p + torch.randint(3, vocab, (new_tokens,)).tolist() for p in prompts for _ in range(samples)]
    n, width = len(seqs), max(map(len, seqs))
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1))
    for i, (s, p) in enumerate(zip(seqs, [p for p in prompts for _ in range(samples)])):
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        mask[i, len(p) - 1:len(s) - 1] = 1.0
    adv = torch.randn(n)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> float:
        started = time.perf_counter()
        denom = mask.sum()
        for i in range(0, n, micro):
            sl = slice(i, i + micro)
            logits = model(input_ids=ids[sl], attention_mask=attn[sl]).logits[:, :-1].float()
            logp = logits.gather(-1, ids[sl, 1:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
            loss = -(logp * adv[sl, None] * mask[sl]).sum() / denom
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    warm = step()
    times = [step() for _ in range(repeats)]
    return {"warmup_s": warm, "step_s": statistics.median(times), "step_all_s": times, "sequences": n,
            "tokens_per_seq_max": width, "threads": torch.get_num_threads()}


def baseline_gemm(size: int, repeats: int, dtype: str = "float32") -> dict:
    """This CPU's matrix-multiply rate with the threads the engines get: the peak a learner's FLOP/s is a share
    of (a square ``size`` GEMM in ``dtype``, median of ``repeats`` after one warm-up)."""
    import torch

    a, b = (torch.randn(size, size, dtype=getattr(torch, dtype)) for _ in range(2))
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return {"size": size, "seconds": seconds, "gflops": 2 * size**3 / seconds / 1e9, "threads": torch.get_num_threads()}


def run_baseline(kind: str, args_json: Path, out_json: Path) -> dict:
    env = dict(os.environ)
    threads = str(os.cpu_count() or 1)  # what the flow's policy actor gets (cluster.torch_threads default)
    env.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_HOST_IP": "127.0.0.1"})
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_baseline", kind, "--_args", str(args_json),
           "--_out", str(out_json)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True)
    if proc.returncode != 0 or not out_json.exists():
        return {"error": f"exit {proc.returncode}\n{proc.stderr[-4000:]}", "wall_s": time.perf_counter() - started}
    out = json.loads(out_json.read_text())
    out["wall_s"] = time.perf_counter() - started
    return out


def baseline_main(args) -> None:
    spec = json.loads(Path(args._args).read_text())
    if args._baseline == "vllm":
        out = baseline_vllm(spec["model_dir"], spec["prompts"], spec["samples"], spec["new_tokens"], spec["kv_mb"],
                            spec["max_model_len"], spec["repeats"], spec.get("ignore_eos", True), spec.get("engine"),
                            spec.get("seeds"))
    elif args._baseline == "gemm":
        out = baseline_gemm(spec.get("gemm_size", 2048), spec["repeats"])
    else:
        out = baseline_train(spec["model_dir"], spec["prompts"], spec["samples"], spec["new_tokens"],
                             spec["micro"], spec["pad_id"], spec["repeats"])
    Path(args._out).write_text(json.dumps(out))


# ------------------------------------------------------------------------------------------------ report

def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _fmt(v, width: int = 9) -> str:
    return f"{v:{width}.3f}" if isinstance(v, (int, float)) else f"{'n/a':>{width}}"


def report(argv: list[str], info: dict, shape: dict, flow: dict, gen: dict, trn: dict, build_s: float) -> None:
    print()
    print("=" * 78)
    print("command:   " + " ".join([Path(sys.executable).name] + argv))
    print(f"machine:   {os.cpu_count()} CPU cores (os.cpu_count), load avg {os.getloadavg()[0]:.2f} at the end")
    print(f"model:     random Qwen2, {info['params']:,} parameters ({info['params'] / 1e6:.2f}M), fp32, vocab "
          f"{info['vocab']}, hidden {info['hidden']}, {info['layers']} layers, {info['heads']} heads x "
          f"{info['hidden'] // info['heads']}, intermediate {info['intermediate']}, tied embeddings "
          f"(built in {build_s:.1f}s)")
    print(f"workload:  {shape['prompts']} prompts x {shape['samples']} samples x {shape['new_tokens']} new tokens, "
          f"micro-batch {shape['micro']}, {flow['config']['iterations']} iterations "
          f"(medians over iterations 1..{flow['config']['iterations'] - 1})")
    if flow.get("error"):
        print("FLOW FAILED:\n" + flow["error"])
    rows = [r for r in flow.get("metrics", []) if r.get("time_total_s") is not None]
    steady = [r for r in rows if r["iteration"] >= 1] or rows
    if rows:
        lengths = [r.get("response_length_mean") for r in steady]
        trunc = [r.get("truncated_frac") for r in steady]
        print(f"responses: mean length {statistics.mean(lengths):.1f} tokens, truncated (hit max) "
              f"{statistics.mean(trunc):.3f}; sync_logprob_max_diff "
              f"{max((r.get('sync_logprob_max_diff') or 0.0) for r in rows):.2e}")
    print("-" * 78)
    print(f"{'stage':<44}{'median s':>10}{'iter 0 s':>10}")
    first = rows[0] if rows else {}
    for label, key in (("rollout (sample, incl. task + Ray)", "time_rollout_s"),
                       ("score (reward processes + advantages)", "time_score_s"),
                       ("train (policy update task)", "time_train_s"),
                       ("sync (weights learner -> sampler)", "time_sync_s"),
                       ("sync check (logprob comparison)", "time_sync_check_s"),
                       ("checkpoint (copy to memory; write is async)", "time_checkpoint_s"),
                       ("iteration (wall)", "time_total_s"),
                       ("orchestration overhead (time_overhead_s)", "time_overhead_s")):
        print(f"{label:<44}{_fmt(_median(steady, key), 10)}{_fmt(first.get(key), 10)}")
    eng = [e for e in flow.get("engine", []) if e["iteration"] >= 1] or flow.get("engine", [])
    if eng:
        print(f"{'  inside actor: vLLM generate only':<44}{_fmt(_median(eng, 'rollout_engine_s'), 10)}")
        print(f"{'  inside actor: learner.train_step only':<44}{_fmt(_median(eng, 'train_engine_s'), 10)}")
    it_med = _median(steady, "time_total_s")
    print("-" * 78)
    print(f"{'engine start-up (flow: engines ready in)':<44}{_fmt(flow.get('engines_ready_s'), 10)}")
    print(f"{'flow call -> engines ready':<44}{_fmt(flow.get('call_to_engines_ready_s'), 10)}")
    print(f"{'whole flow call':<44}{_fmt(flow.get('total_s'), 10)}")
    if flow.get("engines_ready_line"):
        print(f"  ({flow['engines_ready_line']})")
    print("-" * 78)
    g = gen.get("generate_s")
    t = trn.get("step_s")
    print(f"{'standalone vLLM generate (ignore_eos)':<44}{_fmt(g, 10)}"
          + (f"   {gen['tokens']} tokens, {gen['tokens'] / g:.0f} tok/s, load {gen['load_s']:.1f}s" if g else ""))
    print(f"{'standalone vLLM generate + logprobs=0':<44}{_fmt(gen.get('generate_logprobs_s'), 10)}")
    print(f"{'standalone train step (torch AdamW)':<44}{_fmt(t, 10)}"
          + (f"   {trn['sequences']} seqs x <= {trn['tokens_per_seq_max']} tokens, {trn['threads']} threads"
             if t else ""))
    if gen.get("error"):
        print("vLLM baseline failed: " + gen["error"])
    if trn.get("error"):
        print("train baseline failed: " + trn["error"])
    if it_med and g and t:
        print(f"{'iteration / (standalone gen + train step)':<44}{it_med / (g + t):10.3f}"
              f"   ({it_med:.2f} / ({g:.2f} + {t:.2f}))")
    print("=" * 78)
    if rows:
        print("per iteration: " + "; ".join(
            f"it{r['iteration']}: iter {r['time_total_s']:.2f} roll {r['time_rollout_s']:.2f} "
            f"score {r['time_score_s']:.2f} train {r['time_train_s']:.2f} sync {r['time_sync_s']:.3f} "
            f"check {(r.get('time_sync_check_s') or 0):.3f} ovh {r['time_overhead_s']:.3f}" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None, help="flow iterations (default 4; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="small model, 4x4 prompts x samples, 32 tokens")
    parser.add_argument("--micro-batch", type=int, default=None, help="train.micro_batch_size (default 16)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats of each standalone baseline")
    parser.add_argument("--no-force-length", action="store_true", help="let the random model emit EOS")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (model, run folder)")
    parser.add_argument("--checkpoint-interval", type=int, default=0,
                        help="checkpoint.interval of the flow (default 0: none, the figures of docs/benchmarks.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override of the flow, e.g. --set cluster.placement=split (repeatable)")
    parser.add_argument("--no-baselines", action="store_true", help="time the flow only")
    parser.add_argument("--_baseline", choices=["vllm", "train", "gemm"], help=argparse.SUPPRESS)
    parser.add_argument("--_args", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._baseline:
        baseline_main(args)
        return

    shape = dict(QUICK if args.quick else FULL)
    if args.micro_batch:
        shape["micro"] = args.micro_batch
    iterations = args.iterations or (3 if args.quick else 4)
    with work_folder("bench-iteration-", args.keep) as work:
        t0 = time.perf_counter()
        info = build_model(work / "model", shape, force_length=not args.no_force_length)
        build_s = time.perf_counter() - t0
        print(f"model: {info['params']:,} parameters, vocab {info['vocab']} -> {work / 'model'}", flush=True)
        prompts = encode_prompts(work / "model", shape["prompts"])
        max_prompt = max(map(len, prompts))
        kv_mb = kv_cache_mb(info, shape["prompts"] * shape["samples"], max_prompt + shape["new_tokens"] + 16)
        print(f"prompts: {shape['prompts']} of {min(map(len, prompts))}-{max_prompt} tokens; KV cache {kv_mb} MiB",
              flush=True)

        print(f"flow: grpo_train, {iterations} iterations ...", flush=True)
        flow = run_flow(work / "model", work / "runs", shape, iterations, kv_mb, args.checkpoint_interval,
                        args.overrides)
        if flow.get("error"):
            print(flow["error"], flush=True)

        spec = {"model_dir": str(work / "model"), "prompts": prompts, "samples": shape["samples"],
                "new_tokens": shape["new_tokens"], "kv_mb": kv_mb, "max_model_len": 512 + shape["new_tokens"],
                "micro": shape["micro"], "pad_id": info["pad_id"], "repeats": args.repeats}
        spec_path = work / "baseline.json"
        spec_path.write_text(json.dumps(spec))
        gen, trn = {}, {}
        if not args.no_baselines:
            print("baseline: standalone vLLM generation ...", flush=True)
            gen = run_baseline("vllm", spec_path, work / "vllm.json")
            print("baseline: standalone torch train step ...", flush=True)
            trn = run_baseline("train", spec_path, work / "train.json")
        report(sys.argv, info, shape, flow, gen, trn, build_s)


if __name__ == "__main__":
    main()
