"""Sampling from immutable sampler checkpoints on vLLM: the base model, a LoRA adapter folder, or a full set of
weights, each named by the sampling session that reads it.

Two engines at most, built when first needed: one with vLLM's LoRA (the base and every adapter: each request names
its adapter by folder, vLLM caches them by id) and one for full fine-tuning (it holds one set of weights at a time and
loads another snapshot's when a request needs it). All vLLM calls run on one thread: the engine is not thread-safe.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grpo_core.config import VLLM_LORA_RANKS
from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler, sampled_logprobs
from grpo_core.outside.tinker.errors import TinkerRequestError
from grpo_core.outside.tinker.trainee import ATTENTION, MLP
from grpo_core.outside.tinker.wire import TOPK_EMPTY_LOGPROB, TOPK_EMPTY_TOKEN, SampledTokens, TopK

SEED_LIMIT = 2**63
# vLLM's own bound on logprobs per position (its engine refuses more): the most a top-k field may ask for.
TOPK_LIMIT = 20


@dataclass(frozen=True)
class Snapshot:
    """What a sampling session reads: ``kind`` base, adapter (a peft folder) or full (an HF weights folder)."""

    kind: str
    folder: str | None = None


@dataclass(frozen=True)
class SampleCall:
    prompt: list[int]
    num_samples: int
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[int] | list[str] | None  # None: stop at EOS; []: never stop before max_tokens
    prompt_logprobs: bool
    topk_prompt_logprobs: int = 0  # the k most likely tokens at each prompt position (0: none)
    topk_sample_logprobs: int = 0  # the k most likely tokens at each sampled position (0: none)
    prompt_logprobs_last_n: int | None = None  # score only the prompt's last N positions (None: all but the first)

    @property
    def scores_prompt(self) -> bool:
        return self.prompt_logprobs or self.topk_prompt_logprobs > 0


@dataclass(frozen=True)
class SampleResult:
    """One request's answer: its sequences, and its prompt's logprobs and top-k when asked (None at the positions not
    scored: the first, and those before ``prompt_logprobs_last_n``)."""

    sequences: list[SampledTokens]
    prompt_logprobs: list[float | None] | None = None
    topk_prompt: TopK | None = None


@dataclass(frozen=True)
class SamplerSettings:
    base_model: str
    max_model_len: int
    max_lora_rank: int = 32
    kv_cache_mb: int = 256
    seed: int = 0
    adapters: str = "merged"  # merged: an adapter is merged into the base and served as full weights; lora: vLLM's LoRA


class SnapshotSampler:
    def __init__(self, settings: SamplerSettings):
        self.settings = settings
        self._lora: VLLMSampler | None = None
        self._full: VLLMSampler | None = None
        self._full_serving: str | None = None  # the snapshot folder the full engine holds (None: the base)
        self._base: dict[str, torch.Tensor] | None = None  # the base weights, to merge adapters into
        self._adapter_ids: dict[str, int] = {}
        self.vllm_rank = next(r for r in VLLM_LORA_RANKS if r >= settings.max_lora_rank)

    def _spec(self, lora: bool) -> SamplerSpec:
        s = self.settings
        return SamplerSpec(model_path=s.base_model, seed=s.seed, kv_cache_mb=s.kv_cache_mb,
                           max_model_len=s.max_model_len, share_prompt_prefill=False,
                           max_lora_rank=self.vllm_rank if lora else None,
                           lora_target_modules=ATTENTION + MLP if lora else None)

    def _served_whole(self, snapshot: Snapshot) -> bool:
        """Whether the full-weights engine serves ``snapshot`` (else the LoRA engine does)."""
        return snapshot.kind == "full" or self.settings.adapters == "merged"

    def _engine_for(self, snapshot: Snapshot):
        """The engine that serves ``snapshot`` and the LoRA request to pass (None: the engine's own weights)."""
        from vllm.lora.request import LoRARequest

        if self._served_whole(snapshot):
            if self._full is None:
                self._full = VLLMSampler(self._spec(lora=False))
            if self._full_serving != snapshot.folder:
                if snapshot.kind == "full":
                    self._full.load_weights_from_dir(snapshot.folder, version=0)
                else:
                    self._full.load_weights(self._merged(snapshot.folder), version=0)
                self._full_serving = snapshot.folder
            return self._full, None
        if self._lora is None:
            self._lora = VLLMSampler(self._spec(lora=True))
        if snapshot.kind == "base":
            return self._lora, None
        ident = self._adapter_ids.setdefault(snapshot.folder, len(self._adapter_ids) + 1)
        return self._lora, LoRARequest(lora_name=f"tinker-{ident}", lora_int_id=ident, lora_path=snapshot.folder)

    def _merged(self, adapter: str | None) -> list[tuple[str, torch.Tensor]]:
        """The base weights with a peft adapter merged in (W + alpha/r B A on each adapted layer); the base alone
        for None. On CPU vLLM's LoRA kernels cost about 1 s per request of a batch (SmolLM2, rank 32: 64 one-sample
        requests in 67 s against 6 s on plain weights), and merging takes a fraction of a second per snapshot."""
        from safetensors.torch import load_file

        if self._base is None:
            files = sorted(Path(self.settings.base_model).glob("*.safetensors"))
            self._base = {name: t for f in files for name, t in load_file(str(f)).items()}
        if adapter is None:
            return list(self._base.items())
        config = json.loads(Path(adapter, "adapter_config.json").read_text())
        scale = float(config["lora_alpha"]) / float(config["r"])
        tensors = load_file(str(Path(adapter, "adapter_model.safetensors")))
        merged = dict(self._base)
        for key, a in tensors.items():
            if not key.endswith(".lora_A.weight"):
                continue
            module = key[: -len(".lora_A.weight")].removeprefix("base_model.model.")
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            name = f"{module}.weight"
            if name not in merged:
                raise RuntimeError(f"{adapter}: the adapter adapts {module}, which the base model does not have")
            merged[name] = merged[name] + scale * (b.float() @ a.float()).to(merged[name].dtype)
        return list(merged.items())

    def _params(self, call: SampleCall):
        from vllm import SamplingParams

        room = self.settings.max_model_len - len(call.prompt)
        stop_ids = [s for s in call.stop if isinstance(s, int)] if call.stop else []
        stop_texts = [s for s in call.stop if isinstance(s, str)] if call.stop else []
        return SamplingParams(
            n=call.num_samples, max_tokens=call.max_tokens if call.max_tokens is not None else room,
            temperature=call.temperature, top_p=call.top_p, top_k=call.top_k if call.top_k > 0 else 0,
            seed=call.seed, stop_token_ids=stop_ids or None, stop=stop_texts or None,
            include_stop_str_in_output=True, ignore_eos=call.stop == [], flat_logprobs=True,
            detokenize=bool(stop_texts), logprobs=call.topk_sample_logprobs,
            prompt_logprobs=call.topk_prompt_logprobs if call.scores_prompt else None)

    def sample(self, snapshot: Snapshot, call: SampleCall) -> SampleResult:
        """``call.num_samples`` sequences of one prompt (their tokens with the stop token, and logprobs), and the
        prompt's logprobs when asked (None at position 0)."""
        return self.sample_many([(snapshot, call)])[0]

    def sample_many(self, requests: list[tuple[Snapshot, SampleCall]]) -> list[SampleResult]:
        """Many requests in as few engine calls as their snapshots allow: every base and adapter request in one
        ``generate`` (vLLM batches them, each through its own adapter), full-weight requests one snapshot at a
        time. Requests are independent: each has its own seed and settings, so batching changes no result's
        distribution."""
        from vllm import TokensPrompt

        results: list[SampleResult | None] = [None] * len(requests)
        groups: dict[tuple[bool, str | None], list[int]] = {}
        for i, (snapshot, _) in enumerate(requests):
            whole = self._served_whole(snapshot)
            groups.setdefault((whole, snapshot.folder if whole else None), []).append(i)
        for members in groups.values():
            routed = [self._engine_for(requests[i][0]) for i in members]
            engine, loras = routed[0][0], [lora for _, lora in routed]
            outs = engine.llm.generate([TokensPrompt(prompt_token_ids=requests[i][1].prompt) for i in members],
                                       [self._params(requests[i][1]) for i in members], use_tqdm=False,
                                       lora_request=loras if any(lora is not None for lora in loras) else None)
            for i, out in zip(members, outs):
                results[i] = _result(out, requests[i][1])
        return results


def _result(out, call: SampleCall) -> SampleResult:
    sequences = []
    for completion in out.outputs:
        tokens = list(completion.token_ids)
        topk = top_k(list(completion.logprobs), call.topk_sample_logprobs) if call.topk_sample_logprobs else None
        sequences.append(SampledTokens(tokens=tokens, logprobs=sampled_logprobs(completion, tokens),
                                       stop_reason="length" if completion.finish_reason == "length" else "stop",
                                       topk=topk))
    if not call.scores_prompt:
        return SampleResult(sequences)
    first = len(call.prompt) - call.prompt_logprobs_last_n if call.prompt_logprobs_last_n else 1
    entries = [entry if i >= first else None for i, entry in enumerate(out.prompt_logprobs)]
    prompt_logprobs = None
    if call.prompt_logprobs:
        prompt_logprobs = [None if entry is None else _logprob_of(entry, tok)
                           for entry, tok in zip(entries, call.prompt)]
    topk = top_k(entries, call.topk_prompt_logprobs) if call.topk_prompt_logprobs else None
    return SampleResult(sequences, prompt_logprobs, topk)


def top_k(positions: list, k: int) -> TopK:
    """The wire's top-k matrices from vLLM's logprobs, read here beside the engine's other outputs. ``positions``:
    one ``{token: Logprob}`` entry per position (None: not scored), each holding the top ``k`` by rank and the
    position's own token at whatever rank it has."""
    ids = np.full((len(positions), k), TOPK_EMPTY_TOKEN, dtype="<i4")
    values = np.full((len(positions), k), TOPK_EMPTY_LOGPROB, dtype="<f4")
    for i, entry in enumerate(positions):
        if not entry:
            continue
        ranked = sorted((lp.rank, token, lp.logprob) for token, lp in entry.items() if lp.rank is not None
                        and lp.rank <= k)
        for j, (_, token, logprob) in enumerate(ranked[:k]):
            ids[i, j], values[i, j] = token, logprob if math.isfinite(logprob) else TOPK_EMPTY_LOGPROB
    return TopK(ids, values)


def _logprob_of(entry, token: int) -> float:
    """One prompt position's logprob of its own token from vLLM's (flat or dict) prompt logprobs entry."""
    value = entry[token].logprob
    return value if math.isfinite(value) else -1e9


def check_sample_call(call: SampleCall, vocab_size: int, max_model_len: int) -> None:
    """The sampling fields in the engine's ranges, each refusal naming its field (vLLM's own errors would end the
    request inside the engine)."""
    if not call.prompt:
        raise TinkerRequestError("prompt: no tokens", field="prompt")
    bad = [t for t in call.prompt if not 0 <= t < vocab_size]
    if bad:
        raise TinkerRequestError(f"prompt: token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                                 field="prompt")
    if not 1 <= call.num_samples <= 64:
        raise TinkerRequestError(f"num_samples is {call.num_samples}; 1 to 64 per request", field="num_samples")
    room = max_model_len - len(call.prompt)
    if room < 1:
        raise TinkerRequestError(f"prompt: {len(call.prompt)} tokens leave no room for an answer in this model's "
                                 f"context of {max_model_len}", field="prompt")
    if call.max_tokens is not None and not 1 <= call.max_tokens <= room:
        raise TinkerRequestError(f"sampling_params.max_tokens is {call.max_tokens}; the prompt's {len(call.prompt)} "
                                 f"tokens leave 1 to {room} in this model's context of {max_model_len}",
                                 field="sampling_params.max_tokens")
    if not (math.isfinite(call.temperature) and call.temperature >= 0):
        raise TinkerRequestError(f"sampling_params.temperature is {call.temperature}; a finite number >= 0",
                                 field="sampling_params.temperature")
    if not (math.isfinite(call.top_p) and 0 < call.top_p <= 1):
        raise TinkerRequestError(f"sampling_params.top_p is {call.top_p}; in (0, 1]", field="sampling_params.top_p")
    if call.top_k < -1 or call.top_k > vocab_size:
        raise TinkerRequestError(f"sampling_params.top_k is {call.top_k}; -1 (off) or 1 to {vocab_size}",
                                 field="sampling_params.top_k")
    if call.seed is not None and not 0 <= call.seed <= SEED_LIMIT - call.num_samples:
        raise TinkerRequestError(f"sampling_params.seed is {call.seed}; 0 <= seed and seed + num_samples - 1 < 2**63",
                                 field="sampling_params.seed")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs"):
        if not 0 <= getattr(call, name) <= TOPK_LIMIT:
            raise TinkerRequestError(f"{name} is {getattr(call, name)}; 0 (none) to {TOPK_LIMIT}", field=name)
    last_n = call.prompt_logprobs_last_n
    if last_n is not None:
        if not call.prompt_logprobs:  # the SDK's own rule (it refuses the call before sending it)
            raise TinkerRequestError("prompt_logprobs_last_n needs prompt_logprobs", field="prompt_logprobs_last_n")
        if not 1 <= last_n <= len(call.prompt) - 1:
            raise TinkerRequestError(f"prompt_logprobs_last_n is {last_n}; 1 to {len(call.prompt) - 1} for a prompt of "
                                     f"{len(call.prompt)} tokens (the first has no context)",
                                     field="prompt_logprobs_last_n")
    if call.stop:
        if len(call.stop) > 16:
            raise TinkerRequestError(f"sampling_params.stop has {len(call.stop)} entries; at most 16",
                                     field="sampling_params.stop")
        for k, s in enumerate(call.stop):
            if isinstance(s, int) and not 0 <= s < vocab_size:
                raise TinkerRequestError(f"sampling_params.stop[{k}]: token id {s} is outside the vocabulary",
                                         field=f"sampling_params.stop[{k}]")
            if isinstance(s, str) and not 0 < len(s) <= 256:
                raise TinkerRequestError(f"sampling_params.stop[{k}]: a stop string of 1 to 256 characters",
                                         field=f"sampling_params.stop[{k}]")
