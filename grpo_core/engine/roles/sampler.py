"""The sampler role of an engine actor: a vLLM engine in the actor (``VLLMSampler``) or a client of a `grpo serve`
server (``ServerSampler``, external placement), and what the driver asks of it: rollouts, evaluation responses,
logprobs for the sync check, and the sampler side of the weight transport.

A mixin of ``grpo_core.engine.worker.EngineWorker``, which holds the state both roles share (config, run store,
transport); sampler methods return their rows (Arrow tables) to the caller, who writes the stage output once for
all samplers.
"""
from __future__ import annotations

import os
import time
from typing import Any

import pyarrow as pa

from grpo_core.config import GRPOConfig
from grpo_core.data.schemas import episode_columns, sample_rows
from grpo_core.outside.endpoint.sampling import SamplingRequest, sample_once
from grpo_core.envs.factory import EpisodeSource
from grpo_core.engine.results import Loaded, SampledPart
from grpo_core.engine.roles.threads import pin_torch_threads
from grpo_core.engine.rollout.sampler import Sample, SamplerSpec, VLLMSampler
from grpo_core.engine.weights_digest import Receipt
from grpo_core.weights.files import FilesTransport, serve_folder
from grpo_core.weights.lora import is_adapter_dir
from grpo_core.weights.transfer import register_backends
from grpo_core.weights.transport import Ends, Transport


def sampling_seed(seed: int, iteration: int, group: int) -> int:
    """The seed of one group's samples: distinct per (run seed, iteration, group), whichever sampler draws them
    (vLLM adds 0..G-1 for the group's samples)."""
    return (seed * 1_000_003 + iteration * 10_007 + group * 1_009) % (2**31 - 1)


class SamplerRole:
    cfg: GRPOConfig
    sampler_id: int | None
    sampler: Any  # VLLMSampler, or ServerSampler (external placement)
    transport: Transport
    _catch_up: FilesTransport
    _episodes: EpisodeSource | None
    dtype: str
    threads: int
    ends: Ends

    def _build_sampler(self) -> None:
        """The vLLM engine (built with the transport's weight-transfer backend, if it has one), or the server
        client checked against the run's lengths."""
        cfg = self.cfg
        if cfg.env is not None:
            self._build_episodes()
        if cfg.placement.samplers_are_servers:
            from grpo_core.engine.rollout.server import ServerSampler

            self.sampler = ServerSampler(cfg.cluster.servers[self.sampler_id], tag=cfg.run_name,
                                         timeout_s=cfg.cluster.server_timeout_s, retries=cfg.cluster.server_retries)
            self.sampler.check_length(cfg.policy_context, "data.max_prompt_tokens + rollout.max_new_tokens")
            if cfg.model.lora is not None:  # adapters go on model.path's weights, whatever the server held before
                self.sampler.restore_base(os.path.abspath(cfg.model.path))
            return
        backend = self.transport.sampler_backend()
        if backend is not None:
            register_backends()  # our gloo engine, before vLLM builds its workers
        self.sampler = VLLMSampler(SamplerSpec(
            model_path=cfg.model.path, dtype=self.dtype, seed=cfg.seed, kv_cache_mb=cfg.rollout.kv_cache_mb,
            max_model_len=cfg.policy_context,
            enforce_eager=cfg.rollout.enforce_eager, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            tensor_parallel_size=cfg.rollout.tensor_parallel_size,
            weight_transfer_backend=backend,
            max_lora_rank=cfg.model.lora.vllm_max_rank if cfg.model.lora is not None else None,
            lora_target_modules=tuple(cfg.model.lora.target_modules) if cfg.model.lora is not None else None,
            share_prompt_prefill=cfg.rollout.share_prompt_prefill))

    def _build_episodes(self) -> None:
        """Multi-turn rollouts (``env`` in the config): the environment class (a user plugin is imported here, so a
        bad one fails at start-up), its tools, and the chat continuation of the policy's tokenizer."""
        from transformers import AutoTokenizer

        self._episodes = EpisodeSource.from_config(self.cfg, AutoTokenizer.from_pretrained(self.cfg.model.path))

    def _generate(self, prompts: list[dict[str, Any]], *, n: int, greedy: bool, seeds: list[int] | None):
        """Per prompt, its samples: single completions, or episodes when the run has an environment."""
        ro = self.cfg.rollout
        if self._episodes is not None:
            return self._episodes.run(self.sampler, prompts, n=n, greedy=greedy, temperature=ro.temperature,
                                      top_p=ro.top_p, seeds=seeds)
        token_lists = [p["prompt_token_ids"] for p in prompts]
        if greedy:
            return [[s] for s in self.sampler.generate_greedy(token_lists, max_tokens=ro.max_new_tokens)]
        return self.sampler.generate(token_lists, n=n, max_tokens=ro.max_new_tokens, temperature=ro.temperature,
                                     top_p=ro.top_p, seeds=seeds)

    def sample(self, iteration: int, prompts: list[dict[str, Any]], group_offset: int
               ) -> tuple[pa.Table, SampledPart]:
        """G responses for each prompt (``{"prompt_id", "prompt_token_ids", "columns"}``); ``group_offset`` is the
        index of the first prompt in the iteration's batch (it decides group ids and seeds)."""
        ro = self.cfg.rollout
        pin_torch_threads(self.threads)
        started = time.perf_counter()
        seeds = [sampling_seed(self.cfg.seed, iteration, group_offset + gi) for gi in range(len(prompts))]
        groups = self._generate(prompts, n=ro.samples_per_prompt, greedy=False, seeds=seeds)
        seconds = time.perf_counter() - started
        version = self.sampler.version  # read once: a server answers it over HTTP
        table = self._rows(iteration, prompts, groups, group_offset, version)
        return table, SampledPart(seconds, version, self.sampler_id)

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool, samples: int,
                      group_offset: int) -> tuple[pa.Table, SampledPart]:
        """Responses on the eval split: greedy (one per prompt) or sampled at the rollout temperature."""
        pin_torch_threads(self.threads)
        started = time.perf_counter()
        seeds = [sampling_seed(self.cfg.seed, iteration, 10**6 + group_offset + i) for i in range(len(prompts))]
        groups = self._generate(prompts, n=1 if greedy else samples, greedy=greedy, seeds=None if greedy else seeds)
        version = self.sampler.version
        table = self._rows(iteration, prompts, groups, group_offset, version)
        return table, SampledPart(time.perf_counter() - started, version, self.sampler_id)

    def complete(self, prompt_ids: list[int], request: SamplingRequest) -> tuple[list[Sample], int]:
        """One call of the policy endpoint (``grpo_core.outside.endpoint``): ``request.n`` samples of one prompt with the
        caller's sampling settings, and the version that drew them."""
        pin_torch_threads(self.threads)
        return sample_once(self.sampler, prompt_ids, request), self.sampler.version

    def sampler_logprobs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The sampler's raw (temperature 1) logprobs of each sequence's tokens after its prompt."""
        pin_torch_threads(self.threads)
        return self.sampler.score_tokens(sequences, prompt_lens)

    def serve_checkpoint(self, model_dir: str, version: int) -> float:
        """Load HF-format weights from a local folder into the sampler, serving them as ``version`` (a restarted
        sampler is in this state with its original weights). With LoRA: a peft adapter folder, or the base model's
        own folder (the adapter is dropped, as in a restarted sampler)."""
        if self.cfg.model.lora is not None and not is_adapter_dir(model_dir):
            if os.path.realpath(model_dir) != os.path.realpath(self.cfg.model.path):
                raise ValueError(f"{model_dir}: a LoRA sampler serves model.path plus adapters; this folder is "
                                 "neither an adapter (no adapter_config.json) nor the base model")
            started = time.perf_counter()
            self.sampler.serve_base(version)
            return time.perf_counter() - started
        return serve_folder(self.sampler, model_dir, version)

    def served_receipt(self) -> Receipt:
        """The sampler's side of the sync check: the version it serves and the digest of what its engine's loader
        was last handed."""
        return Receipt(self.sampler.version, self.sampler.served)

    def receive_weights(self, version: int) -> None:
        """Sampler side of ``weights.transport``, after every learner rank published ``version``."""
        self.transport.receive(self.ends, version)

    def load_published(self, version: int) -> Loaded:
        """Catch up through the run store: load ``weights/v-N/``."""
        started = time.perf_counter()
        self._catch_up.receive(self.ends, version)
        return Loaded(time.perf_counter() - started, version)

    def server_alive(self) -> bool:
        """External placement: whether this actor's server answers its health check."""
        return self.sampler.alive()

    # vLLM weight-transfer lifecycle, sampler side (the trainer engine on learner rank 0 calls these via a client)
    def wt_init(self, init_info: dict) -> None:
        self.sampler.init_transfer(init_info)

    def wt_start(self) -> None:
        self.sampler.start_transfer()

    def wt_update(self, update_info: dict) -> None:
        self.sampler.receive(update_info)

    def wt_finish(self, version: int | None) -> None:
        self.sampler.finish_transfer(version)

    def _rows(self, iteration: int, prompts: list[dict[str, Any]], groups: list[list[Sample]],
              group_offset: int, version: int | None) -> pa.Table:
        """Rollout rows (the typed columns, the episode columns of a multi-turn run, then each prompt's dataset
        columns); grouped, in sample order."""
        table = sample_rows(iteration, prompts, groups, group_offset, version, self.sampler_id)
        return table if self.cfg.env is None else episode_columns(table, groups)
