"""The learner role of an engine actor: one DeepSpeed rank of the learners' process group, and what the driver asks
of it: an update on the iteration's scored batch, logprobs for the sync check, the learner side of the weight
transport, checkpoints (begin, result, restore) and the final policy.

A mixin of ``grpo_core.engine.worker.EngineWorker``, which holds the state both roles share (config, run store,
transport); learner methods read their inputs from the run folder and write their outputs there.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch

from grpo_core.run import checkpoint
from grpo_core.run.checkpoint import CheckpointRef, CheckpointWriter, Snapshot, WrittenFiles
from grpo_core.config import GRPOConfig
from grpo_core.engine.roles.threads import pin_torch_threads
from grpo_core.data.schemas import RESPONSE_MASK, TEACHER_TOP_IDS, TEACHER_TOP_LOGPROBS, TOKEN_ADVANTAGE
from grpo_core.infra.netaddr import listening_socket
from grpo_core.engine.results import CheckpointStarted, FinalPolicy, Restored, TrainStep
from grpo_core.run.storage import RunStore
from grpo_core.engine.train.batch import finite_rows, pack_batch
from grpo_core.engine.train.critic import Critic, CriticSpec, ppo_update
from grpo_core.engine.train.learner import Learner, LearnerSpec
from grpo_core.engine.weights_digest import Receipt, WeightsDigest
from grpo_core.weights.files import FilesTransport
from grpo_core.weights.transport import Ends, Published, Transport

# Files of an HF model folder that describe its tokenizer (copied next to the trained weights).
_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template", "vocab", "merges", "added_tokens")
_RENDEZVOUS_TIMEOUT_S = 600


def _tokenizer_snapshot(model_path: str) -> Snapshot:
    snap = Snapshot()
    for name in sorted(os.listdir(model_path)):
        src = os.path.join(model_path, name)
        if name.startswith(_TOKENIZER_FILES) and os.path.isfile(src):
            with open(src, "rb") as fh:
                snap.add_bytes(name, fh.read())
    return snap


def open_rendezvous(host: str, world_size: int) -> "torch.distributed.TCPStore":
    """Rank 0's side of the learners' rendezvous, bound to a port the OS picks and held from then on: picking a
    free port and binding it later races with every other process choosing ports on the node (vLLM, Ray)."""
    import torch.distributed as dist
    from datetime import timedelta

    sock = listening_socket(host)  # the node's address only: a TCPStore binding port 0 itself listens on all
    return dist.TCPStore(host, sock.getsockname()[1], world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=_RENDEZVOUS_TIMEOUT_S), master_listen_fd=sock.detach())


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


class LearnerRole:
    cfg: GRPOConfig
    store: RunStore
    learner_rank: int | None
    learner: Learner | None
    critic: Critic | None
    transport: Transport
    _catch_up: FilesTransport
    _checkpoint: CheckpointWriter | None
    _last_train: tuple[int, TrainStep] | None
    _rendezvous: Any
    dtype: str
    threads: int
    ends: Ends

    def open_rendezvous(self, host: str) -> int:
        """Learner rank 0: bind the learners' rendezvous on this node and return its port."""
        self._rendezvous = open_rendezvous(host, self.cfg.cluster.learners)
        return self._rendezvous.port

    def _join_learner_group(self, master_addr: str | None, master_port: int | None) -> None:
        """The learners' torch.distributed group, every rank together (before vLLM in a colocated actor)."""
        if master_addr is None or master_port is None:
            raise ValueError("a learner rank needs the rendezvous address of rank 0")
        init_learner_group(master_addr, master_port, self.learner_rank, self.cfg.cluster.learners,
                           store=self._rendezvous if self.learner_rank == 0 else None)

    def _build_learner(self) -> None:
        """This rank's DeepSpeed engine over the policy."""
        from transformers import AutoTokenizer

        cfg = self.cfg
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.learner = Learner(
            LearnerSpec(model_path=cfg.model.path, dtype=self.dtype, seed=cfg.seed,
                        total_steps=cfg.iterations * cfg.optimizer_steps_per_iteration,
                        temperature=cfg.learner_temperature, max_new_tokens=cfg.rollout.max_new_tokens,
                        fused_kernels=cfg.train.fused_kernels, lora=cfg.model.lora,
                        pack_prompts=cfg.train.pack_prompts, objective=cfg.objective,
                        teacher_top_k_weight=cfg.teacher_top_k_weight),
            cfg.resolved_algo, cfg.train, micro_batch_size=cfg.micro_batch_size,
            grad_accum_steps=cfg.grad_accum_steps)
        if cfg.critic is not None:
            self.critic = Critic(
                CriticSpec(model_path=cfg.critic_model_path, dtype=self.dtype, lr=cfg.critic_lr,
                           value_clip=cfg.critic.value_clip,
                           total_steps=cfg.iterations * cfg.optimizer_steps_per_iteration, lora=cfg.model.lora,
                           pack=cfg.train.pack_prompts),
                cfg.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps,
                zero_stage=self.learner.zero_stage)

    def publish_weights(self, keep_versions: list[int]) -> Published | None:
        """Learner side of ``weights.transport`` (every learner rank together): make the current version
        available to the samplers (``keep_versions``: what they serve now)."""
        return self.transport.publish(self.ends, keep_versions)

    def publish(self, keep_versions: list[int]) -> Published | None:
        """Catch-up route (learner ranks together): the current version into the run store's ``weights/v-N/``
        unless there, dropping versions no sampler still needs (``grpo_core.weights.files``)."""
        return self._catch_up.publish(self.ends, keep_versions)

    def join_transfer(self, client, host: str, port: int) -> None:
        """Every learner rank: join the transfer group of a ``forms_group`` transport; rank 0 rendezvouses with
        every sampler worker through ``client`` (a ``VLLMWeightSyncClient`` over the sampler actors, built by the
        cluster layer) and sends, the others join the gathers."""
        self.transport.join_group(self.ends, client, host, port)

    def train(self, iteration: int, name: str = "scored.parquet") -> TrainStep:
        """This rank's share of one policy update on the iteration's scored batch (every rank reads the whole batch:
        loss denominators are those of whole mini-batches). Rank 0 writes train.json with the metrics of all ranks
        merged by the caller; a retried call for the same iteration returns the same result without stepping."""
        if self._last_train is not None and self._last_train[0] == iteration:
            return self._last_train[1]
        started = time.perf_counter()
        pin_torch_threads(self.threads)
        table = self.store.get_table(iteration, name)
        episodes = RESPONSE_MASK in table.column_names  # multi-turn: environment tokens are out of the loss
        per_token = TOKEN_ADVANTAGE in table.column_names  # on-policy distillation: the teacher's per-token signal
        top_k = self.cfg.teacher_top_k_weight > 0  # and its top K at every position (distill.top_k)
        if top_k and TEACHER_TOP_IDS not in table.column_names:
            raise ValueError(f"{name} of iteration {iteration} has no {TEACHER_TOP_IDS} column, which distill.top_k "
                             f"> 0 trains on (scored before top_k was set?)")
        cols = table.select(["prompt_token_ids", "response_token_ids", "sampler_logprobs", "advantage", "kept"]
                            + ([RESPONSE_MASK] if episodes else []) + ([TOKEN_ADVANTAGE] if per_token else [])
                            + ([TEACHER_TOP_IDS, TEACHER_TOP_LOGPROBS] if top_k else []))
        data = cols.to_pydict()
        sampled = table.column("sampler_logprobs").null_count < table.num_rows  # null: SFT's conversations
        kept, nonfinite = finite_rows(data["kept"], data["advantage"], data["sampler_logprobs"] if sampled else None,
                                      data.get(TOKEN_ADVANTAGE), data.get(TEACHER_TOP_LOGPROBS))
        batch = pack_batch(data["prompt_token_ids"], data["response_token_ids"],
                           data["sampler_logprobs"] if sampled else None,
                           data["advantage"], kept, self.pad_id,
                           response_masks=_masks(data) if episodes else None,
                           token_advantages=data[TOKEN_ADVANTAGE] if per_token else None,
                           teacher_top=(data[TEACHER_TOP_IDS], data[TEACHER_TOP_LOGPROBS]) if top_k else None)
        extra: dict[str, float] = {}
        world = self.cfg.cluster.learners
        if self.critic is not None:
            metrics = ppo_update(self.critic, self.learner, batch, table.column("shaped_reward").to_pylist(),
                                 self.cfg, self.learner_rank)
        else:
            if self.cfg.algo.kl_in_reward:
                batch.advantages, extra = self._kl_shaped_advantages(batch, table.column("shaped_reward").to_pylist())
            metrics = self.learner.train_step(batch, rank=self.learner_rank, world_size=world)
        # this rank's whole update (the batch read and packed, a critic's values and step too), not only the step's
        metrics.update(extra, rows_nonfinite=float(nonfinite), seconds=time.perf_counter() - started)
        step = TrainStep(metrics, self.learner.version)
        self._last_train = (iteration, step)
        return step

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
    def checkpoint_begin(self, iteration: int) -> CheckpointStarted:
        """Copy this rank's state after ``iteration`` to memory (rank 0 adds the policy in HF format, the
        tokenizer and state.json) and start writing it to ``checkpoints/iter-N/`` in the background; training may
        go on at once. Every learner rank calls this together (DeepSpeed's save is a collective). The flow commits
        the checkpoint after ``checkpoint_result`` reports every rank's files written."""
        if self._checkpoint is not None and not self._checkpoint.done:
            raise RuntimeError(f"checkpoint {self._checkpoint.folder} is still being written; commit it first")
        started = time.perf_counter()
        snap = self.learner.snapshot(rank=self.learner_rank)
        for path, state in self.critic.snapshot() if self.critic is not None else ():
            snap.add_torch(path, state)
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
        return CheckpointStarted(self._checkpoint.folder, seconds, self.learner.version)

    def checkpoint_result(self, wait: bool = False) -> WrittenFiles | None:
        """This rank's written files of the pending checkpoint (None while writing; raises if writing failed)."""
        if self._checkpoint is None:
            return None
        out = self._checkpoint.result(wait=wait)
        if out is not None:
            self._checkpoint = None
        return out

    def restore(self, ref: CheckpointRef) -> Restored:
        """Load a committed checkpoint into this learner rank (all ranks together); the caller then syncs the
        samplers."""
        started = time.perf_counter()
        rank = self.learner_rank
        with tempfile.TemporaryDirectory(prefix="grpo-restore-") as tmp:
            folder = checkpoint.download(self.store, ref, tmp, only=checkpoint.files_of_rank(rank))
            state = checkpoint.read_state(folder)
            self.learner.load_state(folder, rank=rank, policy_version=int(state["policy_version"]))
            if self.critic is not None:
                self.critic.load_state(folder)
        self._last_train = None
        return Restored(time.perf_counter() - started, self.learner.version)

    def save_final(self, folder: str = "final") -> FinalPolicy | None:
        """Rank 0: the trained policy in HF format (weights + tokenizer; with LoRA the peft adapter + tokenizer, see
        ``grpo export --merge``) under ``<run>/<folder>/``, manifest last."""
        import json

        if self._joins_gather_only():
            return None
        written = CheckpointWriter(self.store, folder, self._policy_snapshot()).start().result(wait=True)
        manifest = {"files": {name: rec["bytes"] for name, rec in written.files.items()},
                    "policy_version": self.learner.version}
        self.store.put_bytes(f"{folder}/MANIFEST.json", json.dumps(manifest, indent=1).encode())
        return FinalPolicy(self.store.url(folder), manifest["files"], self.learner.version)

    def _policy_snapshot(self) -> Snapshot:
        snap = self.learner.hf_snapshot()
        snap.update(_tokenizer_snapshot(self.cfg.model.path))
        return snap

    def published_receipt(self) -> Receipt | None:
        """The learner's side of the sync check: its version and the digest of what the transports publish (the
        state dict as sent, less a tied output layer; with LoRA the adapter). Every rank joins (ZeRO-3 gathers the
        weights); rank 0 answers."""
        if self._joins_gather_only():
            return None
        learner = self.learner
        if self.cfg.model.lora is not None:
            return Receipt(learner.version, WeightsDigest.of(learner.adapter_weights().items()))
        return Receipt(learner.version, WeightsDigest.of(learner.named_weights(), tied=learner.tied_output))


def _masks(data: dict[str, list]) -> list[list[int]]:
    """The batch's response masks; rows without one (single-turn rows beside inbox episodes) are all policy."""
    return [m if m is not None else [1] * len(r) for m, r in zip(data[RESPONSE_MASK], data["response_token_ids"])]
