"""The vLLM sampler engine: G samples per prompt with their logprobs, scoring of given tokens, weight updates.

One class wraps one vLLM ``LLM``. It runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor):
a tiny model loads in about 2 s instead of 12-18 s, and new weights reach the worker as tensors without a copy
through a pipe. The sampler knows which policy version it serves; every sample it returns carries that version.
With LoRA (``SamplerSpec.max_lora_rank``) the weights stay the base model's and each policy version is a peft
adapter that every request goes through (``load_adapter``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Iterable

import torch

from grpo_core.engine.rollout.model_class import inspect_in_process
from grpo_core.engine.weights_digest import WeightsDigest, adapter_digest


@dataclass
class Sample:
    """One sampled response. ``logprobs[i]`` is the sampler's log-probability of ``token_ids[i]``."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str


@dataclass(frozen=True)
class SamplerSpec:
    model_path: str
    dtype: str = "float32"
    seed: int = 0
    kv_cache_mb: int = 64
    max_model_len: int = 1024
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    weight_transfer_backend: str | None = None  # a vLLM weight-transfer engine in the workers (broadcast, cuda_ipc)
    max_lora_rank: int | None = None  # serve base + LoRA adapters up to this rank (vLLM's enable_lora); None: no LoRA
    lora_target_modules: tuple[str, ...] | None = None  # the layers adapters may touch (None: every one vLLM wraps)
    share_prompt_prefill: bool = True  # prefill each prompt once for its n samples (see _fresh_prefix_cache)


class VLLMSampler:
    def __init__(self, spec: SamplerSpec):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        kwargs = dict(
            model=spec.model_path,
            dtype=spec.dtype,
            seed=spec.seed,
            enforce_eager=spec.enforce_eager,
            max_model_len=spec.max_model_len,
            # One worker in this process ("uni"); tensor parallelism needs vLLM's own worker processes ("mp").
            distributed_executor_backend="uni" if spec.tensor_parallel_size == 1 else "mp",
            tensor_parallel_size=spec.tensor_parallel_size,
            worker_extension_cls="grpo_core.engine.rollout.worker_ext.WeightReceiver",
            # Logprobs after temperature/top-p: the distribution the tokens were actually drawn from, which is what
            # the learner's importance ratios are measured against.
            logprobs_mode="processed_logprobs",
            # Prefix caching is what lets a prompt's n samples share its prefill (`generate`). On CPU vLLM's
            # attention takes blocks of a multiple of 32 tokens; its default, 128, would cache no prompt shorter.
            enable_prefix_caching=spec.share_prompt_prefill,
            # Per-request seeds make sampling reproducible (resume reaches the same weights). On CPU, vLLM 0.32
            # crashes when a seeded request's prefill is split across steps ("CPU Generator does not use
            # offset"), so prompts are never split.
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(8192, spec.max_model_len),
        )
        if spec.weight_transfer_backend is not None:  # the caller registered our backends (gloo) with vLLM
            kwargs["weight_transfer_config"] = {"backend": spec.weight_transfer_backend}
        if spec.max_lora_rank is not None:
            # Two adapter slots: the new version is added before the old one is removed.
            kwargs.update(enable_lora=True, max_lora_rank=spec.max_lora_rank, max_loras=2, max_cpu_loras=2)
            if spec.lora_target_modules:
                # Only these layers get LoRA wrappers. Left to itself vLLM also wraps the output layer of a model
                # whose lm_head it supports, and its CPU path then fails on prompt logprobs (the wrapper indexes
                # adapters per sampled token, the logits are per prompt position: "einsum(): subscript b has size
                # 4 ... 102"). Adapters never target the output layer here (config.LoraTarget).
                kwargs["lora_target_modules"] = list(spec.lora_target_modules)
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = spec.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = spec.kv_cache_mb * 2**20
            if spec.share_prompt_prefill:
                kwargs["block_size"] = CPU_PREFIX_BLOCK
        started = time.perf_counter()
        inspect_in_process(spec.model_path)
        self.llm = LLM(**kwargs)
        self.load_seconds = time.perf_counter() - started
        self.spec = spec
        self.version = 0
        # LoRA: the adapter every request goes through (None: the base model, which is also version 0's policy,
        # since peft initialises B = 0); each load gets a new id, as vLLM caches adapters by id.
        self._lora = None
        self._lora_ids = 0
        # With tied embeddings the output layer IS the embedding: vLLM has no separate lm_head weight to load.
        self._tied = bool(getattr(self.llm.llm_engine.model_config.hf_config, "tie_word_embeddings", False))
        self._tokenizer = self.llm.get_tokenizer()
        # The digest of the weights (or LoRA adapter) last handed to the engine's loader; None until the first load
        # (the model folder it was built from).
        self.served: WeightsDigest | None = None

    def generate(self, prompts: list[list[int]], *, n: int, max_tokens: int | list[int], temperature: float = 1.0,
                 top_p: float = 1.0, seeds: list[int] | None = None) -> list[list[Sample]]:
        """Sample ``n`` responses for each tokenised prompt. ``seeds[i]`` makes prompt i reproducible (vLLM gives
        its n children ``seed + k``); ``max_tokens`` one for all or one per prompt."""
        from vllm import SamplingParams, TokensPrompt

        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
        widths = per_prompt(max_tokens, len(prompts))
        self._fresh_prefix_cache()
        params = [
            SamplingParams(n=n, max_tokens=widths[i], temperature=temperature, top_p=top_p,
                           seed=None if seeds is None else seeds[i], **_FAST_LOGPROBS)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False,
                                    lora_request=self._lora)
        return self._samples([out.outputs for out in outputs])

    def _fresh_prefix_cache(self) -> None:
        """Empty the prefix cache before a batch when prompts share their prefill.

        With prefix caching vLLM computes a prompt's full KV blocks once for its n samples: blocks are registered
        when the first sample is scheduled, and the others, in the same step, read them (on the tiny task prefill
        was 58% of the rollout, 8 times over). Emptying the cache first makes what a batch reads depend on that
        batch and the current weights only, never on what ran before (evaluation, earlier batches), so a resumed
        run samples exactly what the uninterrupted one did."""
        if self.spec.share_prompt_prefill and not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running)")

    def generate_greedy(self, prompts: list[list[int]], *, max_tokens: int | list[int]) -> list[Sample]:
        from vllm import SamplingParams, TokensPrompt

        params = [SamplingParams(n=1, max_tokens=w, temperature=0.0, **_FAST_LOGPROBS)
                  for w in per_prompt(max_tokens, len(prompts))]
        self._fresh_prefix_cache()
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False,
                                    lora_request=self._lora)
        return [group[0] for group in self._samples([out.outputs[:1] for out in outputs])]

    def score_tokens(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """Log-probabilities the sampler assigns to ``seq[prompt_len:]`` of each sequence (temperature 1)."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, flat_logprobs=True,
                                detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False,
                                    lora_request=self._lora)
        result = []
        for seq, start, out in zip(sequences, prompt_lens, outputs):
            entries = out.prompt_logprobs  # entry i holds {token_id: Logprob} for seq[i]; entry 0 is None
            result.append([entries[i][seq[i]].logprob for i in range(start, len(seq))])
        return result

    def load_adapter(self, adapter_dir: str, version: int) -> float:
        """Serve base + the peft adapter in ``adapter_dir`` (``adapter_model.safetensors`` + ``adapter_config.json``)
        as policy ``version`` from now on. Returns seconds.

        vLLM reads the folder during this call (``add_lora`` loads it into the engine's adapter cache), so the
        caller may delete it afterwards. Each load gets a new LoRA id: vLLM caches adapters by id, and a reused id
        would keep serving the old tensors. The previous adapter is removed once the new one is in."""
        from vllm.lora.request import LoRARequest

        if self.spec.max_lora_rank is None:
            raise RuntimeError("this sampler was built without LoRA (SamplerSpec.max_lora_rank); it cannot serve "
                               "an adapter")
        started = time.perf_counter()
        served = adapter_digest(adapter_dir)
        self._lora_ids += 1
        request = LoRARequest(lora_name=f"policy-v{version}-{self._lora_ids}", lora_int_id=self._lora_ids,
                              lora_path=os.path.abspath(adapter_dir))
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the LoRA adapter in {adapter_dir}")
        previous, self._lora = self._lora, request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
        self.llm.reset_prefix_cache()
        self.version, self.served = version, served
        return time.perf_counter() - started

    def serve_base(self, version: int) -> None:
        """LoRA: drop the adapter and serve the base model alone as ``version`` (what a freshly started sampler
        serves)."""
        if self._lora is not None:
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            self._lora = None
        self.llm.reset_prefix_cache()
        self.version, self.served = version, WeightsDigest({})  # no adapter

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter name being served (None: the base model, or full weights)."""
        return None if self._lora is None else self._lora.lora_name

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> float:
        """Replace all weights in place (the FULL state dict) and serve them as ``version``. Returns seconds."""
        if self.spec.max_lora_rank is not None:
            raise RuntimeError("a LoRA sampler serves the base model plus adapters: new policies arrive as "
                               "adapters (load_adapter), never as full weights")
        started = time.perf_counter()
        weights = [(n, t) for n, t in named_tensors if not (self._tied and n == "lm_head.weight")]
        self._open_receipt()
        self.llm.collective_rpc("grpo_load_weights", args=(weights,))
        self.served = self._close_receipt()
        self.llm.reset_prefix_cache()
        self.version = version
        return time.perf_counter() - started

    def _open_receipt(self) -> None:
        self.served = None  # whatever arrives from now on replaces what was served
        self.llm.collective_rpc("grpo_receipt_begin")

    def _close_receipt(self) -> WeightsDigest:
        """What every worker's loader was handed since ``_open_receipt`` (one digest: they all get every tensor)."""
        return agreed_receipt(self.llm.collective_rpc("grpo_receipt_end"), "this sampler")

    # vLLM's RL weight-transfer lifecycle (broadcast, cuda_ipc): the trainer drives these four through a client.
    def init_transfer(self, init_info: dict) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_transfer(self) -> None:
        self._open_receipt()
        self.llm.start_weight_update()

    def receive(self, update_info: dict) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_transfer(self, version: int | None) -> None:
        """Finish the update (our engines rebuild a tied CPU lm_head there); serve it as ``version`` (None: keep the
        version number)."""
        self.llm.finish_weight_update()
        self.served = self._close_receipt()
        self.llm.reset_prefix_cache()
        if version is not None:
            self.version = version

    def shutdown_transfer(self) -> None:
        self.llm.shutdown_weight_transfer_engine()

    def load_weights_from_dir(self, model_dir: str, version: int) -> float:
        """Every ``*.safetensors`` file of an HF-format folder (the full state dict) -> ``load_weights``."""
        from pathlib import Path

        from safetensors.torch import load_file

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{model_dir}: no .safetensors weights")
        return self.load_weights([item for f in files for item in load_file(str(f)).items()], version)

    def _samples(self, groups) -> list[list[Sample]]:
        """vLLM completions (per prompt, its n completions) -> Samples; the texts decoded in one batch call."""
        token_lists = [list(c.token_ids) for completions in groups for c in completions]
        texts = iter(self._tokenizer.batch_decode(token_lists, skip_special_tokens=True))
        tokens = iter(token_lists)
        return [[Sample(token_ids=(ids := next(tokens)), logprobs=sampled_logprobs(c, ids), text=next(texts),
                        finish_reason=str(c.finish_reason)) for c in completions] for completions in groups]


def agreed_receipt(per_worker: list[str | None], where: str) -> WeightsDigest:
    """One engine's receipt from its workers' (JSON, ``WeightReceiver.grpo_receipt_end``): with tensor parallelism
    every worker is handed every tensor, so they must agree."""
    if not per_worker or per_worker[0] is None:
        raise RuntimeError(f"{where}: no weight receipt was open in the vLLM worker (grpo_receipt_begin not called)")
    digests = [WeightsDigest.from_json(text) for text in per_worker]
    for rank, other in enumerate(digests[1:], start=1):
        if other != digests[0]:
            raise RuntimeError(f"{where}: vLLM worker {rank} was handed other weights than worker 0: "
                               + "; ".join(digests[0].differences(other)[:5]))
    return digests[0]


def per_prompt(max_tokens: int | list[int], count: int) -> list[int]:
    """``max_tokens`` as one value per prompt (multi-turn episodes have each their own room left)."""
    if isinstance(max_tokens, int):
        return [max_tokens] * count
    if len(max_tokens) != count:
        raise ValueError(f"max_tokens has {len(max_tokens)} entries for {count} prompts")
    return list(max_tokens)


# vLLM's CPU attention takes KV blocks of a multiple of 32 tokens; prefix caching reuses whole blocks only.
CPU_PREFIX_BLOCK = 32

# Sampled-token logprobs without vLLM's per-token Python objects: flat lists instead of one {token: Logprob} dict per
# token, and no detokenization inside the engine (it decoded every logprob's token to a string, and the text
# incrementally, per token); the texts are decoded afterwards in one batch call (``VLLMSampler._samples``). On the
# reference workload's 8192 tokens this took the logprobs' cost from 29% to a few % of CPU time (benchmarks/peers.py).
_FAST_LOGPROBS = {"logprobs": 0, "flat_logprobs": True, "detokenize": False}


def sampled_logprobs(completion, token_ids: list[int]) -> list[float]:
    """The logprob of each sampled token of one completion (``logprobs=0``: one entry per position, the sampled
    token's)."""
    from vllm.logprobs import FlatLogprobs

    lp = completion.logprobs
    if lp is None:
        raise RuntimeError("vLLM returned no logprobs for a sample; SamplingParams.logprobs must be set")
    if isinstance(lp, FlatLogprobs) and lp.token_ids == token_ids and len(lp.logprobs) == len(token_ids):
        return list(lp.logprobs)
    return [step[tok].logprob for tok, step in zip(token_ids, lp)]
