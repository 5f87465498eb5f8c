"""The engines of one Ray actor: a vLLM sampler, a DeepSpeed learner rank, or both (the colocated placement).

This is a plain class (testable without Ray); ``grpo_core.cluster`` places it as long-lived actors. Construction is
cheap; ``setup`` builds the engines, so that the learner ranks of a run can first agree on where their process
group meets (rank 0's ``address``) and then start together. Sampler methods return their rows (Arrow tables)
to the caller, who writes the stage output once for all samplers; learner methods read their inputs from the run
folder and write their outputs there.
"""
from __future__ import annotations

import hashlib
import os
import socket
import tempfile
import time
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import torch

from grpo_core import checkpoint
from grpo_core.checkpoint import CheckpointRef, CheckpointWriter, Snapshot
from grpo_core.config import GRPOConfig
from grpo_core.data.schemas import sample_rows
from grpo_core.logs import redirect_process_output
from grpo_core.precision import resolve_dtype
from grpo_core.rollout.sampler import Sample, SamplerSpec, VLLMSampler
from grpo_core.storage import RunStore
from grpo_core.train.batch import pack_batch
from grpo_core.train.learner import Learner, LearnerSpec
from grpo_core.weights.files import FilesTransport, serve_folder
from grpo_core.weights.lora import is_adapter_dir
from grpo_core.weights.transfer import register_backends
from grpo_core.weights.transport import Ends, make_transport

# Files of an HF model folder that describe its tokenizer (copied next to the trained weights).
_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template", "vocab", "merges", "added_tokens")
_RENDEZVOUS_TIMEOUT_S = 600


def pin_torch_threads(threads: int) -> None:
    """Set the process's torch (OpenMP) and MKL thread count with torch's own function.

    Why not ``torch.set_num_threads``: vLLM-CPU replaces it with a no-op once its worker starts, and its start-up
    runs code under ``set_default_torch_num_threads(1)``, whose restore can land after that patch. MKL's count is
    process-wide, so the learner's GEMMs then run on one thread for the rest of the process, summing in another
    order than in a process where the restore went through: a run resumed in a new process was no longer
    bit-identical (seen in two of eight launches of SmolLM2 on this machine: grad norm 1.8042385578 against
    1.8042386770, the one-thread figure). Pinned before every computing call, every process sums alike."""
    torch._C.set_num_threads(threads)


def sampling_seed(seed: int, iteration: int, group: int) -> int:
    """The seed of one group's samples: distinct per (run seed, iteration, group), whichever sampler draws them
    (vLLM adds 0..G-1 for the group's samples)."""
    return (seed * 1_000_003 + iteration * 10_007 + group * 1_009) % (2**31 - 1)


def _tokenizer_snapshot(model_path: str) -> Snapshot:
    snap = Snapshot()
    for name in sorted(os.listdir(model_path)):
        src = os.path.join(model_path, name)
        if name.startswith(_TOKENIZER_FILES) and os.path.isfile(src):
            with open(src, "rb") as fh:
                snap.add_bytes(name, fh.read())
    return snap


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def open_rendezvous(host: str, world_size: int) -> "torch.distributed.TCPStore":
    """Rank 0's side of the learners' rendezvous, bound to a port the OS picks and held from then on: picking a
    free port and binding it later races with every other process choosing ports on the node (vLLM, Ray)."""
    import torch.distributed as dist
    from datetime import timedelta

    return dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=_RENDEZVOUS_TIMEOUT_S))


def init_learner_group(master_addr: str, master_port: int, rank: int, world_size: int,
                       store: "torch.distributed.Store | None" = None) -> None:
    """The learner ranks' torch.distributed default group (gloo on CPU, NCCL on GPU). In a colocated actor it is
    created before vLLM, which then runs inside it as a world of tensor-parallel groups of one. Rank 0 passes the
    store it opened with ``open_rendezvous`` (without one, it binds ``master_port`` itself); the other ranks connect."""
    import torch.distributed as dist
    from datetime import timedelta

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0",
                       "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)})
    if world_size == 1 and dist.is_initialized() and dist.get_world_size() == 1:
        return  # a world of one already exists in this process (engines built in-process before, tests): reuse it
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0,
                              timeout=timedelta(seconds=_RENDEZVOUS_TIMEOUT_S))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


class EngineWorker:
    def __init__(self, cfg: GRPOConfig, sampler_id: int | None = None, learner_rank: int | None = None,
                 output_file: str | None = None):
        """``output_file``: this process's stdout and stderr go there (the run folder's logs/, see grpo_core.logs);
        only for an actor process of its own, never in a caller's process."""
        if sampler_id is None and learner_rank is None:
            raise ValueError("an engine worker holds a sampler, a learner rank, or both")
        if output_file is not None:
            redirect_process_output(output_file)
        self.cfg = cfg
        self.sampler_id, self.learner_rank = sampler_id, learner_rank
        self.store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
        self.sampler: VLLMSampler | None = None
        self.learner: Learner | None = None
        self.startup_seconds = 0.0
        self._checkpoint: CheckpointWriter | None = None
        # (iteration, metrics) of the last update: a retried train call (its output write failed) must not step
        # the optimizer twice.
        self._last_train: tuple[int, dict[str, Any]] | None = None
        self.transport = make_transport(cfg.transport)  # weights.transport: this actor's ends of it
        self._catch_up = FilesTransport()  # how a new sampler gets the current weights, whatever the transport
        self._rendezvous = None  # learner rank 0: the held TCPStore of the learners' group
        self.dtype = resolve_dtype(cfg.model.dtype)  # what this actor's engines compute in (auto: its device's)
        self.threads = torch.get_num_threads()  # the actor's OMP_NUM_THREADS, before any engine can change it

    def free_port(self, host: str) -> int:
        """A free port on this actor's node (for vLLM's weight-transfer rendezvous, which binds it itself)."""
        return free_port(host)

    def open_rendezvous(self, host: str) -> int:
        """Learner rank 0: bind the learners' rendezvous on this node and return its port."""
        self._rendezvous = open_rendezvous(host, self.cfg.cluster.learners)
        return self._rendezvous.port

    def setup(self, master_addr: str | None = None, master_port: int | None = None) -> dict[str, Any]:
        """Build the engines: the learner group (all ranks call this together), vLLM, DeepSpeed."""
        from transformers import AutoTokenizer

        cfg = self.cfg
        started = time.perf_counter()
        if self.learner_rank is not None:
            if master_addr is None or master_port is None:
                raise ValueError("a learner rank needs the rendezvous address of rank 0")
            init_learner_group(master_addr, master_port, self.learner_rank, cfg.cluster.learners,
                               store=self._rendezvous if self.learner_rank == 0 else None)
        if self.sampler_id is not None and cfg.cluster.placement == "external":
            from grpo_core.rollout.server import ServerSampler

            self.sampler = ServerSampler(cfg.cluster.servers[self.sampler_id], tag=cfg.run_name,
                                         timeout_s=cfg.cluster.server_timeout_s, retries=cfg.cluster.server_retries)
            self.sampler.check_length(cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
                                      "data.max_prompt_tokens + rollout.max_new_tokens")
            if cfg.model.lora is not None:  # adapters go on model.path's weights, whatever the server held before
                self.sampler.restore_base(os.path.abspath(cfg.model.path))
        elif self.sampler_id is not None:
            backend = self.transport.sampler_backend()
            if backend is not None:
                register_backends()  # our gloo engine, before vLLM builds its workers
            self.sampler = VLLMSampler(SamplerSpec(
                model_path=cfg.model.path, dtype=self.dtype, seed=cfg.seed, kv_cache_mb=cfg.rollout.kv_cache_mb,
                max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
                enforce_eager=cfg.rollout.enforce_eager, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                tensor_parallel_size=cfg.rollout.tensor_parallel_size,
                weight_transfer_backend=backend,
                max_lora_rank=cfg.model.lora.vllm_max_rank if cfg.model.lora is not None else None,
                lora_target_modules=tuple(cfg.model.lora.target_modules) if cfg.model.lora is not None else None,
                share_prompt_prefill=cfg.rollout.share_prompt_prefill))
        if self.learner_rank is not None:
            tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
            self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            self.learner = Learner(
                LearnerSpec(model_path=cfg.model.path, dtype=self.dtype, seed=cfg.seed,
                            total_steps=cfg.iterations * cfg.optimizer_steps_per_iteration,
                            temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens,
                            fused_kernels=cfg.train.fused_kernels, lora=cfg.model.lora,
                            pack_prompts=cfg.train.pack_prompts),
                cfg.algo, cfg.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)
        pin_torch_threads(self.threads)
        self.startup_seconds = time.perf_counter() - started
        return self.info()

    # ------------------------------------------------------------------------------------------------ status
    def info(self) -> dict[str, Any]:
        return {"sampler_id": self.sampler_id, "learner_rank": self.learner_rank,
                "sampler_version": self.sampler.version if self.sampler else None,
                "learner_version": self.learner.version if self.learner else None,
                "sampler_load_s": self.sampler.load_seconds if self.sampler else 0.0,
                "learner_init_s": self.learner.init_seconds if self.learner else 0.0,
                "startup_s": self.startup_seconds, "pid": os.getpid(), "host": socket.gethostname(),
                "dtype": self.dtype, "threads": self.threads}

    def versions(self) -> dict[str, int | None]:
        return {"sampler": self.sampler.version if self.sampler else None,
                "learner": self.learner.version if self.learner else None}

    # ------------------------------------------------------------------------------------------ sampler side
    def sample(self, iteration: int, prompts: list[dict[str, Any]], group_offset: int) -> tuple[pa.Table, dict]:
        """G responses for each prompt (``{"prompt_id", "prompt_token_ids", "columns"}``); ``group_offset`` is the
        index of the first prompt in the iteration's batch (it decides group ids and seeds)."""
        ro = self.cfg.rollout
        pin_torch_threads(self.threads)
        started = time.perf_counter()
        seeds = [sampling_seed(self.cfg.seed, iteration, group_offset + gi) for gi in range(len(prompts))]
        groups = self.sampler.generate([p["prompt_token_ids"] for p in prompts], n=ro.samples_per_prompt,
                                       max_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                                       seeds=seeds)
        seconds = time.perf_counter() - started
        version = self.sampler.version  # read once: a server answers it over HTTP
        table = self._rows(iteration, prompts, groups, group_offset, version)
        return table, {"seconds": seconds, "policy_version": version, "sampler_id": self.sampler_id}

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool, samples: int,
                      group_offset: int) -> tuple[pa.Table, dict]:
        """Responses on the eval split: greedy (one per prompt) or sampled at the rollout temperature."""
        ro = self.cfg.rollout
        pin_torch_threads(self.threads)
        started = time.perf_counter()
        token_lists = [p["prompt_token_ids"] for p in prompts]
        if greedy:
            groups = [[s] for s in self.sampler.generate_greedy(token_lists, max_tokens=ro.max_new_tokens)]
        else:
            seeds = [sampling_seed(self.cfg.seed, iteration, 10**6 + group_offset + i) for i in range(len(prompts))]
            groups = self.sampler.generate(token_lists, n=samples, max_tokens=ro.max_new_tokens,
                                           temperature=ro.temperature, top_p=ro.top_p, seeds=seeds)
        version = self.sampler.version
        table = self._rows(iteration, prompts, groups, group_offset, version)
        return table, {"seconds": time.perf_counter() - started, "policy_version": version}

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

    @property
    def ends(self) -> Ends:
        """This actor's ends of the weight transport."""
        return Ends(cfg=self.cfg, store=self.store, learner=self.learner, sampler=self.sampler,
                    rank=self.learner_rank)

    def publish_weights(self, keep_versions: list[int]) -> dict[str, Any] | None:
        """Learner side of ``weights.transport`` (every learner rank together): make the current version
        available to the samplers (``keep_versions``: what they serve now)."""
        out = self.transport.publish(self.ends, keep_versions)
        return None if out is None else asdict(out)

    def receive_weights(self, version: int) -> None:
        """Sampler side of ``weights.transport``, after every learner rank published ``version``."""
        self.transport.receive(self.ends, version)

    def publish(self, keep_versions: list[int]) -> dict[str, Any] | None:
        """Catch-up route (learner ranks together): the current version into the run store's ``weights/v-N/``
        unless there, dropping versions no sampler still needs (``grpo_core.weights.files``)."""
        out = self._catch_up.publish(self.ends, keep_versions)
        return None if out is None else asdict(out)

    def load_published(self, version: int) -> dict[str, float]:
        """Catch up through the run store: load ``weights/v-N/``."""
        started = time.perf_counter()
        self._catch_up.receive(self.ends, version)
        return {"seconds": time.perf_counter() - started, "version": float(version)}

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

    def leave_transfer(self) -> None:
        """Leave the transfer group (before the group is formed again with other samplers)."""
        self.transport.leave_group(self.ends)

    # ------------------------------------------------------------------------------------------ learner side
    def join_transfer(self, client, host: str, port: int) -> None:
        """Every learner rank: join the transfer group of a ``forms_group`` transport; rank 0 rendezvouses with
        every sampler worker through ``client`` (a ``VLLMWeightSyncClient`` over the sampler actors, built by the
        cluster layer) and sends, the others join the gathers."""
        self.transport.join_group(self.ends, client, host, port)

    def train(self, iteration: int, name: str = "scored.parquet") -> dict[str, Any]:
        """This rank's share of one policy update on the iteration's scored batch (every rank reads the whole batch:
        loss denominators are those of whole mini-batches). Rank 0 writes train.json with the metrics of all ranks
        merged by the caller; a retried call for the same iteration returns the same result without stepping."""
        if self._last_train is not None and self._last_train[0] == iteration:
            return self._last_train[1]
        pin_torch_threads(self.threads)
        table = self.store.get_table(iteration, name)
        cols = table.select(["prompt_token_ids", "response_token_ids", "sampler_logprobs", "advantage", "kept"])
        data = cols.to_pydict()
        batch = pack_batch(data["prompt_token_ids"], data["response_token_ids"], data["sampler_logprobs"],
                           data["advantage"], data["kept"], self.pad_id)
        extra: dict[str, float] = {}
        if self.cfg.algo.kl_in_reward:
            batch.advantages, extra = self._kl_shaped_advantages(batch, table.column("shaped_reward").to_pylist())
        metrics = self.learner.train_step(batch, rank=self.learner_rank, world_size=self.cfg.cluster.learners)
        metrics.update(extra)
        metrics["policy_version"] = self.learner.version
        self._last_train = (iteration, metrics)
        return metrics

    def _kl_shaped_advantages(self, batch, rewards: list[float]) -> tuple[torch.Tensor, dict[str, float]]:
        """KL in the reward: r - kl_coeff * KL(policy || ref) summed over the response, then advantages again
        (over the whole batch on every rank: groups need all their members)."""
        from grpo_core.algo import apply_kl_to_reward, compute_advantages

        algo, g = self.cfg.algo, self.cfg.rollout.samples_per_prompt
        old, ref = self.learner.logprobs(batch), self.learner.ref_logprobs(batch)
        shaped, metrics = apply_kl_to_reward(torch.tensor(rewards, dtype=torch.float64), old.double(), ref.double(),
                                             batch.loss_mask, algo.kl_coeff, algo.kl_estimator)
        advantages, m = compute_advantages(shaped.view(-1, g), algo.advantage_estimator, algo.advantage_scale)
        metrics.update({f"kl_reward_{k}": v for k, v in m.items()})
        return advantages.reshape(-1).float(), metrics

    def learner_logprobs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        """The learner's raw (temperature 1, as vLLM's prompt logprobs) logprobs of each sequence's tokens after its
        prompt. Every learner rank must run it (a ZeRO-3 forward is a collective)."""
        pin_torch_threads(self.threads)
        batch = pack_batch([s[:p] for s, p in zip(sequences, prompt_lens)],
                           [s[p:] for s, p in zip(sequences, prompt_lens)], None,
                           [0.0] * len(sequences), [True] * len(sequences), self.pad_id)
        logp = self.learner.logprobs(batch, temperature=1.0)
        return [logp[i, p - 1: len(s) - 1].tolist() for i, (s, p) in enumerate(zip(sequences, prompt_lens))]

    def _joins_gather_only(self) -> bool:
        """On a learner rank other than 0, take part in gathering full weights (ZeRO-3's collective) and stop."""
        return self.ends.joins_gather_only()

    # ----------------------------------------------------------------------------------------- checkpoints
    def checkpoint_begin(self, iteration: int) -> dict[str, Any]:
        """Copy this rank's state after ``iteration`` to memory (rank 0 adds the policy in HF format, the
        tokenizer and state.json) and start writing it to ``checkpoints/iter-N/`` in the background; training may
        go on at once. Every learner rank calls this together (DeepSpeed's save is a collective). The flow commits
        the checkpoint after ``checkpoint_result`` reports every rank's files written."""
        if self._checkpoint is not None and not self._checkpoint.done:
            raise RuntimeError(f"checkpoint {self._checkpoint.folder} is still being written; commit it first")
        started = time.perf_counter()
        snap = self.learner.snapshot(rank=self.learner_rank)
        if self.learner_rank != 0:
            self._joins_gather_only()
        else:
            snap.update(self._policy_snapshot())
            snap.add_json(checkpoint.STATE, {"iteration": iteration, "next_iteration": iteration + 1,
                                             "policy_version": self.learner.version, "seed": self.cfg.seed,
                                             "run_name": self.cfg.run_name, "learners": self.cfg.cluster.learners})
        seconds = time.perf_counter() - started
        self._checkpoint = CheckpointWriter(self.store, checkpoint.checkpoint_path(iteration), snap, seconds,
                                            retry_delays=self.cfg.storage.retry_delays).start()
        return {"folder": self._checkpoint.folder, "snapshot_seconds": seconds,
                "policy_version": self.learner.version}

    def checkpoint_result(self, wait: bool = False) -> dict[str, Any] | None:
        """This rank's written files of the pending checkpoint (None while writing; raises if writing failed)."""
        if self._checkpoint is None:
            return None
        out = self._checkpoint.result(wait=wait)
        if out is not None:
            self._checkpoint = None
        return out

    def restore(self, ref: dict[str, Any]) -> dict[str, Any]:
        """Load a committed checkpoint into this learner rank (all ranks together); the caller then syncs the
        samplers."""
        started = time.perf_counter()
        cref = CheckpointRef(**ref)
        rank = self.learner_rank
        with tempfile.TemporaryDirectory(prefix="grpo-restore-") as tmp:
            folder = checkpoint.download(self.store, cref, tmp, only=checkpoint.files_of_rank(rank))
            state = checkpoint.read_state(folder)
            self.learner.load_state(folder, rank=rank, policy_version=int(state["policy_version"]))
        self._last_train = None
        return {"seconds": time.perf_counter() - started, "policy_version": self.learner.version}

    def save_final(self, folder: str = "final") -> dict[str, Any]:
        """Rank 0: the trained policy in HF format (weights + tokenizer; with LoRA the peft adapter + tokenizer, see
        ``grpo export --merge``) under ``<run>/<folder>/``, manifest last."""
        import json

        if self._joins_gather_only():
            return None
        written = CheckpointWriter(self.store, folder, self._policy_snapshot()).start().result(wait=True)
        manifest = {"files": {name: rec["bytes"] for name, rec in written["files"].items()},
                    "policy_version": self.learner.version}
        self.store.put_bytes(f"{folder}/MANIFEST.json", json.dumps(manifest, indent=1).encode())
        return {"folder": self.store.url(folder), **manifest}

    def _policy_snapshot(self) -> Snapshot:
        snap = self.learner.hf_snapshot()
        snap.update(_tokenizer_snapshot(self.cfg.model.path))
        return snap

    def weights_digest(self) -> str:
        """sha256 over the learner's parameters: tests check that training changed them."""
        if self._joins_gather_only():
            return ""
        h = hashlib.sha256()
        for name, t in self.learner.named_weights():
            h.update(name.encode())
            h.update(t.float().cpu().numpy().tobytes())
        return h.hexdigest()

    # --------------------------------------------------------------------------------------------- helpers
    def _rows(self, iteration: int, prompts: list[dict[str, Any]], groups: list[list[Sample]],
              group_offset: int, version: int | None) -> pa.Table:
        """Rollout rows (the typed columns, then each prompt's dataset columns); grouped, in sample order."""
        return sample_rows(iteration, prompts, groups, group_offset, version, self.sampler_id)
