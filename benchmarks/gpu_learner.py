"""bf16 training speed (tokens/s, MFU) of the project's DeepSpeed learner on Qwen2 shapes with random weights.

What it measures: ``grpo_core.engine.train.learner.Learner.train_step`` (the code the flow runs), on a random Qwen2 of the
real 0.5B or 1.5B shape (tied embeddings, vocab 151936, SDPA attention) saved HF-style into a temp folder; the
Learner is built exactly as the flow builds it (``LearnerSpec(dtype="bfloat16", fused_kernels=...)``,
``AlgoConfig()`` defaults, ``TrainConfig(zero_stage=...)``: DeepSpeed with a torch AdamW). Each step is one RL-like
batch from ``pack_batch``: ``--sequences`` rows of ``--prompt-len`` random prompt tokens + ``--response-len`` random
response tokens, one mini-batch (one optimizer step per ``train_step``), split into micro-batches of each ``--micro``
size. Per (variant, micro-batch): ``--warmup`` steps, then the median of ``--steps`` steps timed with
``torch.cuda.synchronize``; peak memory is ``torch.cuda.max_memory_allocated`` over the timed steps.

MFU = model FLOPs of a step / step time / peak, two ways:
  * ``6N``: 6 x N x tokens, N = all parameters (the tied embedding counted once: it is the lm_head matmul);
  * ``6N+attn``: adds the attention matmuls, 12 x layers x hidden x seq per token (PaLM's count: the full L x L
    score matrix, not halved for causality).
Peaks: 989 TFLOP/s (H100 SXM dense bf16 datasheet) and the measured ceiling of a large bf16 matmul (``--ceiling``).
The log-softmax over the vocabulary, the entropy metric, norms and activations are counted as no FLOPs: they are
what MFU loses to.

Variants (``--variants``, comma-separated):
  * ``fused``: the Learner exactly as the project runs it: the decoder's hidden states at the response tokens
    through the output layer in chunks (grpo_core/engine/train/output_head.py: the [B, L, V] logits never exist); under
    ZeRO-3, whose forward runs whole, ``token_logprobs_and_entropy`` (grpo_core/engine/train/batch.py: two Triton kernels
    on CUDA, no float32 copy of the logits);
  * ``unfused``: that float32 path forced (``token_logprobs`` + ``entropy_from_logits``), what the learner did
    before the fused function: the baseline;
  * ``fused-torch``: ``token_logprobs_and_entropy`` on its chunked-torch backend (``--chunk-rows`` positions a
    chunk) even on CUDA: what the Triton kernels buy;
  * suffixes: ``+liger`` (``LearnerSpec(fused_kernels=True)``, i.e. ``train.fused_kernels``: Liger's RMSNorm, RoPE
    and SwiGLU kernels; CUDA only, needs liger-kernel), ``+ckpt`` (HF gradient checkpointing, non-reentrant),
    ``+noent`` (no entropy metric: shows its cost; NOT the same metrics).
Each fused path among the variants is first checked against the unfused one on random logits of the shape's
vocabulary (logprobs, entropy, gradients: the ``check`` lines; on a GPU the only test of the Triton kernels at the
real vocabulary size). One Learner is built per ``+liger`` setting (without first) and its variants run on it in
turn; micro-batch sizes are switched on the same engine with DeepSpeed's ``set_train_micro_batch_size`` /
``set_train_batch_size`` (the mini-batch stays ``--sequences``). A variant that runs out of memory is recorded as
OOM and skips its larger micro-batch sizes; a size whose peak memory, extrapolated from the smaller ones, would not
fit (``--mem-guard``) is skipped without trying. ``--engine torch`` replaces DeepSpeed with a plain torch loop (bf16
parameters, fused torch AdamW on them, no fp32 master weights) inside the same ``train_step`` code: the reference
for DeepSpeed's overhead. Variants measured late in a long process can read slower than in a fresh one: compare
like with like.

Run from the repository root on a CUDA machine with the project installed (each call is one process; results are
appended to ``--results`` as JSON lines; ``--summarize`` prints the table of a results file). The README's figures:

    B="python benchmarks/gpu_learner.py --results r.jsonl --sequences 64 --prompt-len 256 --response-len 768"
    $B --shape 0.5b --ceiling --variants unfused@4/8/16,fused-torch@8/16,fused@4/8/16,fused+ckpt@32/64
    $B --shape 0.5b --phases --variants unfused@8,fused-torch+liger@16,fused+liger@16/32
    $B --shape 1.5b --variants unfused@4/8,fused@8,fused+ckpt@16,fused+liger@8/16
    $B --shape 0.5b --zero-stage 3 --variants unfused@8,fused@16
    $B --shape 0.5b --engine torch --phases --variants fused+liger@16/32
    python benchmarks/gpu_learner.py --summarize r.jsonl

``--profile VARIANT:MICRO`` (repeatable) profiles one step of that variant with torch.profiler and writes the top
ops by GPU and CPU time and a breakdown of kernel time by kind to ``--out``; ``--cprofile VARIANT:MICRO`` writes
the Python functions that take the host's time in one step (cProfile); ``--phases`` times one more step per
configuration with a synchronize around each backward and optimizer step (forward / backward / optimizer split).
``--shape tiny --dtype float32 --device cpu`` runs the whole path on a CPU (a smoke test; CI does not run this).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

for _k, _v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

H100_BF16_DENSE_TFLOPS = 989.0

# Qwen2 shapes (Qwen2-0.5B / Qwen2-1.5B configs): hidden, layers, heads, kv heads, intermediate, vocab.
SHAPES = {
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936),
    "1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=1000),  # CPU smoke test
}


# ------------------------------------------------------------------------------------------------ FLOPs

def param_count(s: dict) -> int:
    """All parameters of a tied-embedding Qwen2 (q/k/v have biases, o/MLP do not), the embedding counted once."""
    h, kv = s["hidden"], s["hidden"] // s["heads"] * s["kv_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * s["intermediate"] + 2 * h
    return s["vocab"] * h + s["layers"] * layer + h


def step_flops(s: dict, sequences: int, seq_len: int) -> dict:
    tokens = sequences * seq_len
    n = param_count(s)
    dense = 6.0 * n * tokens
    attn = 12.0 * s["layers"] * s["hidden"] * seq_len * tokens
    return {"params": n, "tokens": tokens, "flops_6n": dense, "flops_attn": dense + attn}


# ------------------------------------------------------------------------------------------------ logprob paths

IMPLS = ("fused", "unfused", "fused-torch")


def logprob_path(impl: str, chunk_rows: int = 1024):
    """-> f(logits, input_ids, temperature, with_entropy) -> (logprobs [B, L-1] with grad, entropy or None), from the
    project's functions (``with_entropy``: the entropy metric, no grad). ``fused`` is the Learner's choice: the
    fused function on CUDA (Triton), the unfused path elsewhere."""
    from unittest import mock

    import torch

    from grpo_core.algo import entropy_from_logits
    from grpo_core.engine.train import batch
    from grpo_core.engine.train.batch import token_logprobs, token_logprobs_and_entropy

    def unfused(logits, ids, temperature, with_entropy):
        logp = token_logprobs(logits, ids, temperature)
        if not with_entropy:
            return logp, None
        with torch.no_grad():
            return logp, entropy_from_logits(logits[:, :-1].float() / temperature)

    def fused(logits, ids, temperature, with_entropy):  # as Learner._forward_logprobs: fused on CUDA only
        if not logits.is_cuda:
            return unfused(logits, ids, temperature, with_entropy)
        return token_logprobs_and_entropy(logits, ids, temperature, with_entropy, chunk_rows)

    def fused_torch(logits, ids, temperature, with_entropy):
        with mock.patch.object(batch, "_triton_available", lambda: False):  # its backend choice, made in forward
            return token_logprobs_and_entropy(logits, ids, temperature, with_entropy, chunk_rows)

    return {"fused": fused, "unfused": unfused, "fused-torch": fused_torch}[impl]


def check_path(impl: str, vocab: int, device: str, dtype, temperatures=(1.0, 0.7)) -> dict:
    """A logprob path vs the unfused one on random logits: logprobs, entropy and d logits for a random upstream
    gradient. Returns the largest errors per temperature."""
    import torch

    new_path, ref_path = logprob_path(impl, chunk_rows=64), logprob_path("unfused")
    out = {}
    gen = torch.Generator(device="cpu").manual_seed(1)
    for T in temperatures:
        B, L = 2, 130
        base = (torch.randn(B, L, vocab, generator=gen) * 3).to(device=device, dtype=dtype)
        ids = torch.randint(0, vocab, (B, L), generator=gen).to(device)
        g = torch.randn(B, L - 1, generator=gen).to(device)
        res = []
        for path in (ref_path, new_path):
            x = base.clone().requires_grad_(True)
            lp, ent = path(x, ids, T, True)
            (lp * g).sum().backward()
            res.append((lp.detach(), ent, x.grad.float()))
        (ref_lp, ref_ent, gref), (lp, ent, gnew) = res
        out[f"T={T}"] = {
            "logp_max_abs": float((lp - ref_lp).abs().max()),
            "entropy_max_abs": float((ent - ref_ent).abs().max()),
            "grad_rel": float((gnew - gref).norm() / gref.norm()),
            "grad_max_abs": float((gnew - gref).abs().max()),
        }
    return out


# ------------------------------------------------------------------------------------------------ model

def build_model(shape_name: str, dtype_name: str, root: Path, device: str) -> Path:
    """A random Qwen2 of the shape, saved with save_pretrained (config + safetensors; the Learner needs no
    tokenizer). Reused if already there."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = SHAPES[shape_name]
    out = root / f"qwen2-{shape_name}-{dtype_name}"
    if (out / "config.json").exists():
        return out
    dtype = getattr(torch, dtype_name)
    config = Qwen2Config(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
        max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=s["vocab"] - 1, pad_token_id=None, use_cache=False,
        attn_implementation="sdpa", dtype=dtype_name)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    n = sum(p.numel() for p in model.parameters())
    if n != param_count(s):
        raise RuntimeError(f"{shape_name}: {n} parameters, the FLOP count assumes {param_count(s)}")
    model.save_pretrained(out)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def make_batch(sequences: int, prompt_len: int, response_len: int, min_response_len: int, vocab: int, seed: int):
    import torch

    from grpo_core.engine.train.batch import pack_batch

    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_response_len, response_len + 1, (sequences,), generator=gen).tolist()
    prompts = [torch.randint(0, vocab, (prompt_len,), generator=gen).tolist() for _ in range(sequences)]
    responses = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lens]
    adv = torch.randn(sequences, generator=gen).tolist()
    return pack_batch(prompts, responses, None, adv, [True] * sequences, pad_id=0)


# ------------------------------------------------------------------------------------------------ engines

class PlainEngine:
    """Stands in for the DeepSpeed engine inside Learner.train_step: the module itself, loss.backward(), and at
    each accumulation boundary grad clipping + a fused torch AdamW step on the (bf16) parameters."""

    def __init__(self, module, optimizer, scheduler, grad_clip, grad_accum_steps, device):
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler
        self.grad_clip, self.gas, self.device = grad_clip, grad_accum_steps, device
        self.micro_steps, self._norm = 0, None

    def __call__(self, **kw):
        return self.module(**kw)

    def train(self):
        self.module.train()

    def eval(self):
        self.module.eval()

    def backward(self, loss, scale_wrt_gas=False):
        loss.backward()

    def step(self):
        import torch

        self.micro_steps += 1
        if self.micro_steps % self.gas:
            return
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.grad_clip:
            self._norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()

    def get_global_grad_norm(self):
        return None if self._norm is None else float(self._norm)


def make_learner(args, model_dir: Path, micro: int, liger: bool):
    import torch

    from grpo_core.config import AlgoConfig, TrainConfig
    from grpo_core.engine.train.ds_engine import lr_lambda
    from grpo_core.engine.train.learner import Learner, LearnerSpec, _apply_fused_kernels

    gas = args.sequences // micro
    spec = LearnerSpec(model_path=str(model_dir), dtype=args.dtype, seed=0, total_steps=1000,
                       max_new_tokens=args.response_len, fused_kernels=liger)
    algo = AlgoConfig()
    train = TrainConfig(zero_stage=args.zero_stage, micro_batch_size=micro, mini_batch_size=args.sequences)
    if args.engine == "deepspeed":
        return Learner(spec, algo, train, micro_batch_size=micro, grad_accum_steps=gas)
    # plain torch: the same Learner object (so the same train_step code), without DeepSpeed
    from transformers import AutoModelForCausalLM

    learner = Learner.__new__(Learner)
    started = time.perf_counter()
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device)
    model.config.use_cache = False
    if spec.fused_kernels and torch.cuda.is_available():  # as Learner.__init__ does
        _apply_fused_kernels(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=train.lr, betas=train.betas, weight_decay=train.weight_decay,
                            fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(train, spec.total_steps))
    learner.spec, learner.algo, learner.train_cfg = spec, algo, train
    learner.engine = PlainEngine(model, opt, sched, train.grad_clip, gas, device)
    learner.optimizer, learner.scheduler, learner.device, learner.ref_model = opt, sched, device, None
    learner.micro_batch_size, learner.grad_accum_steps, learner.version = micro, gas, 0
    learner.init_seconds = time.perf_counter() - started
    return learner


def set_micro(learner, args, micro: int) -> None:
    """Switch the micro-batch size (same mini-batch) on a live learner; call between train_steps only."""
    gas = args.sequences // micro
    learner.micro_batch_size, learner.grad_accum_steps = micro, gas
    engine = learner.engine
    if isinstance(engine, PlainEngine):
        engine.gas, engine.micro_steps = gas, 0
        return
    engine.set_train_micro_batch_size(micro)
    engine.set_train_batch_size(args.sequences)
    engine.micro_steps = 0  # the next micro-batch starts an accumulation window
    opt = getattr(engine, "optimizer", None)
    if hasattr(opt, "gradient_accumulation_steps"):
        opt.gradient_accumulation_steps = gas


def release(learner) -> None:
    """Drop a learner's engine, optimizer and model so the next one has the memory (gc + empty_cache after)."""
    destroy = getattr(learner.engine, "destroy", None)
    if destroy is not None:
        destroy()
    if learner.train_cfg.zero_stage == 3 and destroy is not None:
        # ZeRO-3 keeps the model, and through its hooks the engine, in module globals: a stack and a class-level
        # lru_cache (behind an NVTX wrapper)
        try:
            from deepspeed.runtime.zero import parameter_offload
            from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

            parameter_offload.FWD_MODULE_STACK.clear()
            cached = PartitionedParameterCoordinator._PartitionedParameterCoordinator__params_to_release
            while not hasattr(cached, "cache_clear"):
                cached = cached.__closure__[0].cell_contents
            cached.cache_clear()
        except Exception as exc:  # noqa: BLE001 - another DeepSpeed version
            print(f"ZeRO-3 globals not cleared ({exc!r}): the released engine may stay in memory", flush=True)
    learner.__dict__.clear()


def module_of(learner):
    return learner.engine.module


# ------------------------------------------------------------------------------------------------ variants

def parse_variant(v: str) -> dict:
    """``impl[+flag...][@m1/m2...]``: the micro-batch sizes after ``@`` replace ``--micro`` for this variant."""
    name, _, micros = v.partition("@")
    impl, *flags = name.split("+")
    if impl not in IMPLS or not set(flags) <= {"ckpt", "noent", "liger"}:
        raise SystemExit(f"unknown variant {v!r}: {'|'.join(IMPLS)} with optional +ckpt +noent +liger")
    return {"name": name, "impl": impl, "ckpt": "ckpt" in flags, "noent": "noent" in flags,
            "liger": "liger" in flags, "micros": sorted(int(m) for m in micros.split("/")) if micros else None}


def apply_variant(learner, var: dict, chunk_rows: int) -> None:
    """Point the learner's _forward_logprobs at the variant's logprob path (``fused``: the Learner's own) and set
    gradient checkpointing."""
    import types

    import torch

    from grpo_core.engine.train.learner import Learner

    learner.__dict__.pop("_forward_logprobs", None)  # back to the class's method
    if var["impl"] != "fused" or var["noent"]:
        path, noent = logprob_path(var["impl"], chunk_rows), var["noent"]

        def forward_logprobs(self, model, mb, entropy="none", temperature=None, pack=False):
            if entropy == "loss":  # the entropy bonus (off in AlgoConfig's defaults): the Learner's own
                return Learner._forward_logprobs(self, model, mb, entropy, temperature, pack)
            ids = mb.input_ids.to(self.device)
            out = model(input_ids=ids, attention_mask=mb.attention_mask.to(self.device))
            temp = self.spec.temperature if temperature is None else temperature
            logp, ent = path(out.logits, ids, temp, entropy == "metric" and not noent)
            if entropy == "none":
                return logp, None
            return logp, torch.zeros_like(logp) if ent is None else ent

        learner._forward_logprobs = types.MethodType(forward_logprobs, learner)
    module = module_of(learner)
    if var["ckpt"]:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif getattr(module, "is_gradient_checkpointing", False):
        module.gradient_checkpointing_disable()
    module.train()


# ------------------------------------------------------------------------------------------------ profile

KERNEL_KINDS = [  # first match wins
    ("logprob-triton", re.compile(r"_lp_(fwd|bwd)_kernel")),
    ("liger", re.compile(r"rms_norm|rope|swiglu", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("reduce/softmax", re.compile(r"reduce|softmax|logsumexp|scan", re.I)),
    ("copy/fill", re.compile(r"copy|memcpy|memset|fill|cat|gather|scatter|index", re.I)),
]


def profile_step(learner, batch, path: Path, sync) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    sync()
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        learner.train_step(batch)
        sync()
    wall = time.perf_counter() - t0
    ka = prof.key_averages()
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    try:
        table = ka.table(sort_by=sort, row_limit=40, max_name_column_width=90)
    except Exception:  # noqa: BLE001 - newer torch names it device_time_total
        table = ka.table(sort_by="device_time_total", row_limit=40, max_name_column_width=90)
    kinds: dict[str, float] = {}
    top: list[tuple[str, float, int]] = []
    for e in ka:
        dev_type = str(getattr(e, "device_type", ""))
        if "CUDA" not in dev_type:
            continue
        us = float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))
        kind = next((k for k, rx in KERNEL_KINDS if rx.search(e.key)), "elementwise/other")
        kinds[kind] = kinds.get(kind, 0.0) + us
        top.append((e.key, us, e.count))
    busy = sum(kinds.values()) / 1e6
    top.sort(key=lambda x: -x[1])
    lines = [f"profiled step: wall {wall:.3f} s (profiler on), GPU kernel time {busy:.3f} s "
             f"({100 * busy / wall:.0f}% busy)", "kernel time by kind:"]
    for k, us in sorted(kinds.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:20s} {us / 1e3:9.1f} ms  {100 * us / 1e6 / max(busy, 1e-9):5.1f}%")
    lines.append("top kernels:")
    for name, us, count in top[:25]:
        lines.append(f"  {us / 1e3:9.1f} ms  x{count:<6d} {name[:150]}")
    text = "\n".join(lines)
    cpu_table = ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=90)
    path.write_text(text + "\n\n" + table + "\n\nby CPU self time:\n" + cpu_table + "\n")
    print(text, flush=True)
    return {"wall_s": wall, "gpu_busy_s": busy, "kinds_ms": {k: v / 1e3 for k, v in kinds.items()},
            "top": [(n[:120], us / 1e3, c) for n, us, c in top[:12]]}


def cprofile_step(learner, batch, path: Path, sync) -> float:
    """One step under cProfile (Python-side time: DeepSpeed hooks, HF module code, our loop); top functions."""
    import cProfile
    import io
    import pstats

    sync()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    learner.train_step(batch)
    sync()
    prof.disable()
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    buf.write(f"cProfile of one step: wall {wall:.3f} s (cProfile on)\n\n--- by internal time\n")
    stats.sort_stats("tottime").print_stats(45)
    buf.write("\n--- by cumulative time\n")
    stats.sort_stats("cumulative").print_stats(60)
    path.write_text(buf.getvalue())
    return wall


def phase_step(learner, batch, sync) -> dict:
    """One step with a synchronize around every engine.backward / engine.step call: seconds in backward (DeepSpeed's
    gradient hooks included), in the optimizer step (the accumulation boundary), in the other engine.step calls,
    and the rest (forward, logprobs, loss, metrics). The syncs stop CPU/GPU overlap, so the parts add up to more
    than a normal step."""
    engine = learner.engine
    acc = {"backward_s": 0.0, "optimizer_step_s": 0.0, "other_step_s": 0.0}
    orig_backward, orig_step = engine.backward, engine.step

    def backward(loss, **kw):
        sync()
        t = time.perf_counter()
        out = orig_backward(loss, **kw)
        sync()
        acc["backward_s"] += time.perf_counter() - t
        return out

    def step(*a, **kw):
        boundary = getattr(engine, "is_gradient_accumulation_boundary", lambda: engine.micro_steps % engine.gas
                           == engine.gas - 1)()
        sync()
        t = time.perf_counter()
        out = orig_step(*a, **kw)
        sync()
        acc["optimizer_step_s" if boundary else "other_step_s"] += time.perf_counter() - t
        return out

    engine.backward, engine.step = backward, step
    try:
        sync()
        t0 = time.perf_counter()
        learner.train_step(batch)
        sync()
        total = time.perf_counter() - t0
    finally:
        del engine.backward, engine.step
    acc["total_s"] = total
    acc["rest_s"] = total - sum(v for k, v in acc.items() if k != "total_s")
    return acc


# ------------------------------------------------------------------------------------------------ matmul ceiling

def matmul_ceiling(n: int = 8192, iters: int = 20) -> float:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


# ------------------------------------------------------------------------------------------------ run

def run(args) -> list[dict]:
    import torch

    variants = [parse_variant(v) for v in args.variants.split(",")]
    micros = sorted(int(m) for m in str(args.micro).split(","))
    for var in variants:
        var["micros"] = var["micros"] or micros
        for m in var["micros"]:
            if args.sequences % m:
                raise SystemExit(f"micro-batch {m} ({var['name']}) does not divide --sequences {args.sequences}")

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = _Rows(args.results)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    try:
        import deepspeed
        import transformers
        env.update(deepspeed=deepspeed.__version__, transformers=transformers.__version__)
    except Exception:  # noqa: BLE001
        pass
    print(f"env: {env}", flush=True)
    if args.ceiling and cuda:
        ceiling = matmul_ceiling()
        print(f"bf16 matmul 8192^3: {ceiling:.0f} TFLOP/s", flush=True)
        rows.append({"kind": "ceiling", "tflops": ceiling, **env})

    s = SHAPES[args.shape]
    t0 = time.perf_counter()
    model_dir = build_model(args.shape, args.dtype, Path(args.model_root), args.device)
    print(f"model {args.shape}: {param_count(s):,} parameters -> {model_dir} ({time.perf_counter() - t0:.1f} s)",
          flush=True)
    batch = make_batch(args.sequences, args.prompt_len, args.response_len, args.min_response_len or
                       args.response_len, s["vocab"], seed=0)
    fl = step_flops(s, args.sequences, batch.input_ids.shape[1])
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32

    for impl in sorted({v["impl"] for v in variants} - {"unfused"}):
        try:
            chk = check_path(impl, s["vocab"], args.device, dtype)
            print(f"check {impl} vs unfused: {json.dumps(chk)}", flush=True)
            rows.append({"kind": "check", "impl": impl, "shape": args.shape, "dtype": args.dtype, **chk})
        except Exception:  # noqa: BLE001
            print(f"check {impl} FAILED:\n{traceback.format_exc()}", flush=True)
            rows.append({"kind": "check", "impl": impl, "error": traceback.format_exc()[-2000:]})

    profiles = {tuple(p.split(":")) for p in (args.profile or [])}
    cprofiles = {tuple(p.split(":")) for p in (args.cprofile or [])}
    for liger in sorted({v["liger"] for v in variants}):  # one Learner per setting, without Liger first
        group = [v for v in variants if v["liger"] == liger]
        t0 = time.perf_counter()
        try:
            learner = make_learner(args, model_dir, group[0]["micros"][0], liger)
        except Exception:  # noqa: BLE001 - e.g. liger-kernel missing
            print(f"learner (liger {liger}) FAILED:\n{traceback.format_exc()}", flush=True)
            for var in group:
                rows.append({"kind": "step", "shape": args.shape, "variant": var["name"],
                             "error": traceback.format_exc()[-3000:]})
            continue
        print(f"learner ({args.engine}, zero {args.zero_stage if args.engine == 'deepspeed' else '-'}, liger "
              f"{liger}): {time.perf_counter() - t0:.1f} s; attn {module_of(learner).config._attn_implementation}, "
              f"dtype {next(module_of(learner).parameters()).dtype}", flush=True)
        for var in group:
            apply_variant(learner, var, args.chunk_rows)
            measured: list[tuple[int, float]] = []  # (micro, peak bytes) of this variant
            for micro in var["micros"]:
                row = {"kind": "step", "shape": args.shape, "engine": args.engine,
                       "zero": args.zero_stage if args.engine == "deepspeed" else None, "variant": var["name"],
                       "micro": micro, "sequences": args.sequences, "seq_len": batch.input_ids.shape[1],
                       "tokens": fl["tokens"], "real_tokens": int(batch.attention_mask.sum()),
                       "params": fl["params"], "dtype": args.dtype, **env}
                predicted = predict_peak(measured, micro, torch.cuda.memory_allocated() if cuda else 0)
                if cuda and args.mem_guard and predicted is not None:
                    total = torch.cuda.get_device_properties(0).total_memory
                    if predicted > args.mem_guard * total:
                        row["error"] = f"skipped: predicted peak {predicted / 2**30:.0f} GiB > " \
                                       f"{args.mem_guard:.2f} x {total / 2**30:.0f} GiB"
                        print(f"{args.shape} {var['name']} micro {micro}: {row['error']}", flush=True)
                        rows.append(row)
                        break
                try:
                    set_micro(learner, args, micro)
                    for _ in range(args.warmup):
                        learner.train_step(batch)
                    sync()
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    times, losses = [], []
                    for _ in range(args.steps):
                        sync()
                        t = time.perf_counter()
                        out = learner.train_step(batch)
                        sync()
                        times.append(time.perf_counter() - t)
                        losses.append(out["loss"])
                    step = statistics.median(times)
                    peak = torch.cuda.max_memory_allocated() if cuda else None
                    row.update(step_s=step, step_times=times, tokens_per_s=fl["tokens"] / step,
                               tflops_6n=fl["flops_6n"] / step / 1e12, tflops_attn=fl["flops_attn"] / step / 1e12,
                               peak_gib=peak / 2**30 if cuda else None,
                               reserved_gib=torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
                               loss=losses, entropy=out.get("entropy"), grad_norm=out.get("grad_norm"))
                    if cuda:
                        measured.append((micro, float(peak)))
                    row["mfu_6n"] = row["tflops_6n"] / H100_BF16_DENSE_TFLOPS
                    row["mfu_attn"] = row["tflops_attn"] / H100_BF16_DENSE_TFLOPS
                    print(f"{args.shape} {row['engine']} z{row['zero']} {var['name']:>18s} micro {micro:3d}: "
                          f"{step:.3f} s/step  {row['tokens_per_s']:,.0f} tok/s  {row['tflops_6n']:.0f} TFLOP/s "
                          f"(6N) MFU {100 * row['mfu_6n']:.1f}% / {100 * row['mfu_attn']:.1f}% (attn)  "
                          f"peak {row['peak_gib'] or 0:.1f} GiB  loss {losses[-1]:.4f}", flush=True)
                    tag = f"{args.shape}-{args.engine}-z{args.zero_stage}-{var['name'].replace('+', '_')}-m{micro}"
                    if (var["name"], str(micro)) in profiles:
                        row["profile"] = profile_step(learner, batch, Path(args.out) / f"prof-{tag}.txt", sync)
                    if args.phases:
                        row["phases"] = phase_step(learner, batch, sync)
                        print("  phases (synchronized): " +
                              "  ".join(f"{k} {v:.3f}" for k, v in row["phases"].items()), flush=True)
                    if (var["name"], str(micro)) in cprofiles:
                        row["cprofile_wall_s"] = cprofile_step(learner, batch, Path(args.out) / f"cprof-{tag}.txt",
                                                               sync)
                except torch.cuda.OutOfMemoryError:
                    row["error"] = "OOM"
                    print(f"{args.shape} {var['name']} micro {micro}: OOM", flush=True)
                except Exception:  # noqa: BLE001 - record and go on with the next variant
                    row["error"] = traceback.format_exc()[-3000:]
                    print(f"{args.shape} {var['name']} micro {micro}: FAILED\n{row['error']}", flush=True)
                rows.append(row)
                if "error" in row:
                    try:
                        learner.engine.optimizer.zero_grad()
                    except Exception:  # noqa: BLE001
                        pass
                    gc.collect()
                    if cuda:
                        torch.cuda.empty_cache()
                    break  # larger micro-batches of this variant would fail too
        release(learner)
        del learner
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            print(f"learner released: {torch.cuda.memory_allocated() / 2**30:.1f} GiB still allocated", flush=True)
    return rows


def predict_peak(measured: list[tuple[int, float]], micro: int, idle: float) -> float | None:
    """Peak memory at ``micro`` by a straight line through the last two (micro, peak) points of the variant, or
    through (0, memory held between steps) and the last point."""
    if not measured:
        return None
    m1, p1 = measured[-1]
    m0, p0 = measured[-2] if len(measured) > 1 else (0, idle)
    slope = (p1 - p0) / max(1, m1 - m0)
    return p1 + slope * (micro - m1)


class _Rows(list):
    """A list of result rows that also appends each row to the results file as it comes (a killed run keeps them)."""

    def __init__(self, path: str | None):
        super().__init__()
        self.path = path

    def append(self, row: dict) -> None:
        super().append(row)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


# ------------------------------------------------------------------------------------------------ table

def table(rows: list[dict]) -> str:
    ceiling = next((r["tflops"] for r in rows if r.get("kind") == "ceiling"), None)
    head = ("| shape | engine | variant | micro | tokens/step | step s | tokens/s | TFLOP/s 6N | MFU 6N | MFU 6N+attn"
            + (f" | MFU 6N vs matmul {ceiling:.0f}" if ceiling else "") + " | peak GiB |")
    out = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        if r.get("kind") != "step":
            continue
        eng = r.get("engine", "?") + (f" z{r['zero']}" if r.get("zero") is not None else "")
        if "error" in r:
            out.append(f"| {r.get('shape')} | {eng} | {r.get('variant')} | {r.get('micro')} | {r.get('tokens')} | "
                       f"{r['error'].splitlines()[-1][:60]} |")
            continue
        cells = [r["shape"], eng, r["variant"], str(r["micro"]), f"{r['tokens']}", f"{r['step_s']:.3f}",
                 f"{r['tokens_per_s']:,.0f}", f"{r['tflops_6n']:.0f}", f"{100 * r['mfu_6n']:.1f}%",
                 f"{100 * r['mfu_attn']:.1f}%"]
        if ceiling:
            cells.append(f"{100 * r['tflops_6n'] / ceiling:.1f}%")
        cells.append(f"{r['peak_gib']:.1f}" if r.get("peak_gib") is not None else "-")
        out.append("| " + " | ".join(cells) + " |")
    extra = []
    if ceiling:
        extra.append(f"bf16 matmul ceiling (8192^3): {ceiling:.0f} TFLOP/s; "
                     f"the MFU columns use {H100_BF16_DENSE_TFLOPS:.0f}")
    for r in rows:
        if r.get("kind") == "check" and "error" not in r:
            worst = {k: max(v[k] for v in r.values() if isinstance(v, dict)) for k in
                     ("logp_max_abs", "entropy_max_abs", "grad_rel")}
            extra.append(f"check {r['impl']} ({r.get('shape')}, {r.get('dtype')}) vs unfused: "
                         + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    return "\n".join(out + list(dict.fromkeys(extra)))  # one line per distinct check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--engine", choices=["deepspeed", "torch"], default="deepspeed")
    parser.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=2)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test")
    parser.add_argument("--variants", default="fused",
                        help="comma-separated, see above; VARIANT@M1/M2 gives that variant its own micro sizes")
    parser.add_argument("--micro", default="8", help="comma-separated micro-batch sizes (sequences)")
    parser.add_argument("--sequences", type=int, default=64, help="sequences per step (= one mini-batch)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=768)
    parser.add_argument("--min-response-len", type=int, default=0,
                        help="draw response lengths in [this, --response-len] (right-padded); 0: all full length")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=1024, help="positions per chunk in the fused-torch path")
    parser.add_argument("--ceiling", action="store_true", help="also time a 8192^3 bf16 matmul")
    parser.add_argument("--mem-guard", type=float, default=0.92,
                        help="skip a micro-batch size whose peak memory, extrapolated from the variant's smaller "
                             "sizes, exceeds this fraction of the GPU (0: try everything)")
    parser.add_argument("--profile", action="append", metavar="VARIANT:MICRO", help="profile one step of it")
    parser.add_argument("--phases", action="store_true",
                        help="one more step per config, synchronized around backward and optimizer step: the split")
    parser.add_argument("--cprofile", action="append", metavar="VARIANT:MICRO",
                        help="one step of it under cProfile (Python time: DeepSpeed hooks, module code)")
    parser.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "gpu-learner-models"))
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "gpu-learner-out"),
                        help="folder for profile files")
    parser.add_argument("--results", default=None, help="append result rows to this JSON-lines file")
    parser.add_argument("--summarize", metavar="RESULTS", help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.summarize:
        rows = [json.loads(line) for line in Path(args.summarize).read_text().splitlines() if line.strip()]
        print(table(rows))
        return
    if args.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --device cpu --dtype float32 --shape tiny for a smoke test")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.model_root).mkdir(parents=True, exist_ok=True)
    rows = run(args)
    print()
    print(table(rows))


if __name__ == "__main__":
    main()

