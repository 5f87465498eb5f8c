"""The engines of one device for the colocated placement: a vLLM sampler and a DeepSpeed learner side by side.

This is a plain class (testable without Ray); ``grpo_core.cluster`` turns it into a long-lived Ray actor. Each
method is one stage's work on the engines: it reads its inputs from the run folder, writes its output there
(data first, manifest last) and returns a small reference with metrics, never the data itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
from typing import Any

import torch

from grpo_core import checkpoint
from grpo_core.checkpoint import CheckpointRef, CheckpointWriter, Snapshot
from grpo_core.config import GRPOConfig
from grpo_core.data.schemas import rollouts_table
from grpo_core.rollout.sampler import Sample, SamplerSpec, VLLMSampler
from grpo_core.storage import RunStore
from grpo_core.train.batch import pack_batch
from grpo_core.train.learner import Learner, LearnerSpec
from grpo_core.weights.inprocess import push_in_process


# Files of an HF model folder that describe its tokenizer (copied next to the trained weights).
_TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "chat_template", "vocab", "merges", "added_tokens")


def _tokenizer_snapshot(model_path: str) -> Snapshot:
    snap = Snapshot()
    for name in sorted(os.listdir(model_path)):
        src = os.path.join(model_path, name)
        if name.startswith(_TOKENIZER_FILES) and os.path.isfile(src):
            with open(src, "rb") as fh:
                snap.add_bytes(name, fh.read())
    return snap


class PolicyWorker:
    def __init__(self, cfg: GRPOConfig):
        from transformers import AutoTokenizer

        self.cfg = cfg
        self.store = RunStore(cfg.storage.root, cfg.run_name, cfg.storage.options)
        if cfg.cluster.torch_threads:
            torch.set_num_threads(cfg.cluster.torch_threads)
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        started = time.perf_counter()
        # The sampler first: in-process vLLM creates the world-of-one process group that DeepSpeed then reuses.
        self.sampler = VLLMSampler(SamplerSpec(
            model_path=cfg.model.path, dtype=cfg.model.dtype, seed=cfg.seed, kv_cache_mb=cfg.rollout.kv_cache_mb,
            max_model_len=cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens,
            enforce_eager=cfg.rollout.enforce_eager, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization))
        self.learner = Learner(
            LearnerSpec(model_path=cfg.model.path, dtype=cfg.model.dtype, seed=cfg.seed,
                        total_steps=cfg.iterations * cfg.optimizer_steps_per_iteration,
                        temperature=cfg.rollout.temperature, max_new_tokens=cfg.rollout.max_new_tokens),
            cfg.algo, cfg.train, micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps)
        self.startup_seconds = time.perf_counter() - started
        self._checkpoint: CheckpointWriter | None = None
        # (iteration, metrics) of the last update: a retried train call (its output write failed) must not step
        # the optimizer twice.
        self._last_train: tuple[int, dict[str, Any]] | None = None

    # ------------------------------------------------------------------------------------------------ status
    def info(self) -> dict[str, Any]:
        return {"sampler_version": self.sampler.version, "learner_version": self.learner.version,
                "sampler_load_s": self.sampler.load_seconds, "learner_init_s": self.learner.init_seconds,
                "startup_s": self.startup_seconds, "pid": os.getpid(), "host": socket.gethostname()}

    def versions(self) -> tuple[int, int]:
        return self.sampler.version, self.learner.version

    # ------------------------------------------------------------------------------------------------ stages
    def rollout(self, iteration: int, prompts: list[dict[str, Any]], name: str = "rollouts.parquet",
                seed_offset: int = 0) -> dict[str, Any]:
        """Sample G responses for each prompt (``{"prompt_id", "prompt_token_ids", "columns"}``) and write them.

        If the stage output is already complete and was sampled with the weights we serve now, reuse it."""
        done = self.store.entry(iteration, name)
        if done is not None and done.meta.get("policy_version") == self.sampler.version:
            return {"name": name, "rows": done.rows, "reused": True, **done.meta}
        ro = self.cfg.rollout
        started = time.perf_counter()
        seeds = [self._seed(iteration, seed_offset + gi) for gi in range(len(prompts))]
        groups = self.sampler.generate([p["prompt_token_ids"] for p in prompts], n=ro.samples_per_prompt,
                                       max_tokens=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
                                       seeds=seeds)
        seconds = time.perf_counter() - started
        rows, columns = self._rows(iteration, prompts, groups, group_offset=seed_offset)
        table = rollouts_table(rows, columns)
        lengths = [r["response_length"] for r in rows]
        meta = {"policy_version": self.sampler.version, "seconds": seconds,
                "tokens": int(sum(lengths)), "response_length_mean": sum(lengths) / len(lengths),
                "response_length_max": max(lengths),
                "truncated_frac": sum(r["truncated"] for r in rows) / len(rows)}
        entry = self.store.put_table(iteration, name, table, meta=meta)
        return {"name": name, "rows": entry.rows, "reused": False, **meta}

    def generate_eval(self, iteration: int, prompts: list[dict[str, Any]], greedy: bool, samples: int,
                      name: str = "eval_rollouts.parquet") -> dict[str, Any]:
        """Responses on the eval split: greedy (one per prompt) or sampled at the rollout temperature."""
        ro = self.cfg.rollout
        started = time.perf_counter()
        token_lists = [p["prompt_token_ids"] for p in prompts]
        if greedy:
            groups = [[s] for s in self.sampler.generate_greedy(token_lists, max_tokens=ro.max_new_tokens)]
        else:
            groups = self.sampler.generate(token_lists, n=samples, max_tokens=ro.max_new_tokens,
                                           temperature=ro.temperature, top_p=ro.top_p,
                                           seeds=[self._seed(iteration, 10**6 + i) for i in range(len(prompts))])
        rows, columns = self._rows(iteration, prompts, groups, group_offset=0)
        meta = {"policy_version": self.sampler.version, "seconds": time.perf_counter() - started,
                "greedy": greedy}
        entry = self.store.put_table(iteration, name, rollouts_table(rows, columns), meta=meta)
        return {"name": name, "rows": entry.rows, **meta}

    def train(self, iteration: int, name: str = "scored.parquet") -> dict[str, Any]:
        """One policy update on the iteration's scored batch; writes train.json. Called again for the same
        iteration (a retry after the write failed), it writes the same result without stepping again."""
        if self._last_train is not None and self._last_train[0] == iteration:
            metrics = self._last_train[1]
        else:
            table = self.store.get_table(iteration, name)
            cols = table.select(["prompt_token_ids", "response_token_ids", "sampler_logprobs", "advantage", "kept"])
            data = cols.to_pydict()
            batch = pack_batch(data["prompt_token_ids"], data["response_token_ids"], data["sampler_logprobs"],
                               data["advantage"], data["kept"], self.pad_id)
            extra: dict[str, float] = {}
            if self.cfg.algo.kl_in_reward:
                batch.advantages, extra = self._kl_shaped_advantages(batch, table.column("shaped_reward").to_pylist())
            metrics = self.learner.train_step(batch)
            metrics.update(extra)
            metrics["policy_version"] = self.learner.version
            self._last_train = (iteration, metrics)
        self.store.put_json(iteration, "train.json", metrics, meta={"policy_version": metrics["policy_version"]})
        return metrics

    def _kl_shaped_advantages(self, batch, rewards: list[float]) -> tuple[torch.Tensor, dict[str, float]]:
        """KL in the reward: r - kl_coeff * KL(policy || ref) summed over the response, then advantages again."""
        from grpo_core.algo import apply_kl_to_reward, compute_advantages

        algo, g = self.cfg.algo, self.cfg.rollout.samples_per_prompt
        old, ref = self.learner.logprobs(batch), self.learner.ref_logprobs(batch)
        shaped, metrics = apply_kl_to_reward(torch.tensor(rewards, dtype=torch.float64), old.double(), ref.double(),
                                             batch.loss_mask, algo.kl_coeff, algo.kl_estimator)
        advantages, m = compute_advantages(shaped.view(-1, g), algo.advantage_estimator, algo.advantage_scale)
        metrics.update({f"kl_reward_{k}": v for k, v in m.items()})
        return advantages.reshape(-1).float(), metrics

    def serve_checkpoint(self, model_dir: str, version: int) -> float:
        """Load HF-format weights from ``model_dir`` into the sampler only, serving them as ``version`` (evaluate a
        checkpoint; a restarted sampler is in this state with its original weights)."""
        return self.sampler.load_weights_from_dir(model_dir, version)

    def sync(self) -> dict[str, float]:
        """Push the learner's weights into the sampler (in-process)."""
        return push_in_process(self.learner, self.sampler)

    def check_sync(self, iteration: int, name: str, rows: int) -> dict[str, float]:
        """Max |sampler logprob - learner logprob| on the first ``rows`` sequences of a rollout file, right after a
        sync. Non-zero beyond float noise means the sampler serves other weights than the learner trains (a broken
        weight reload, e.g. a stale tied lm_head on CPU)."""
        table = self.store.get_table(iteration, name).slice(0, rows)
        prompts = table.column("prompt_token_ids").to_pylist()
        seqs = [p + r for p, r in zip(prompts, table.column("response_token_ids").to_pylist())]
        lens = [len(p) for p in prompts]
        diffs = [abs(a - b) for sa, la in zip(self.sampler_logprobs(seqs, lens), self.learner_logprobs(seqs, lens))
                 for a, b in zip(sa, la)]
        return {"sync_logprob_max_diff": max(diffs, default=0.0), "sync_checked_tokens": float(len(diffs))}

    # ----------------------------------------------------------------------------------------- checkpoints
    def checkpoint_begin(self, iteration: int) -> dict[str, Any]:
        """Copy the state after ``iteration`` (learner state, policy in HF format, tokenizer) to memory and start
        writing it to ``checkpoints/iter-N/`` in the background; training may go on at once. The flow commits it
        after ``checkpoint_result`` reports the files written."""
        if self._checkpoint is not None and not self._checkpoint.done:
            raise RuntimeError(f"checkpoint {self._checkpoint.folder} is still being written; commit it first")
        started = time.perf_counter()
        snap = self._policy_snapshot()
        snap.update(self.learner.snapshot(rank=0))
        snap.add_json(checkpoint.STATE, {"iteration": iteration, "next_iteration": iteration + 1,
                                         "policy_version": self.learner.version, "seed": self.cfg.seed,
                                         "run_name": self.cfg.run_name})
        seconds = time.perf_counter() - started
        self._checkpoint = CheckpointWriter(self.store, checkpoint.checkpoint_path(iteration), snap, seconds,
                                            retry_delays=self.cfg.storage.retry_delays).start()
        return {"folder": self._checkpoint.folder, "snapshot_seconds": seconds,
                "policy_version": self.learner.version}

    def checkpoint_result(self, wait: bool = False) -> dict[str, Any] | None:
        """The pending checkpoint's written files (None while it is written; raises if writing failed)."""
        if self._checkpoint is None:
            return None
        out = self._checkpoint.result(wait=wait)
        if out is not None:
            self._checkpoint = None
        return out

    def restore(self, ref: dict[str, Any]) -> dict[str, Any]:
        """Load a committed checkpoint into the learner, then push its weights to the sampler: both serve
        ``policy_version`` afterwards."""
        started = time.perf_counter()
        cref = CheckpointRef(**ref)
        with tempfile.TemporaryDirectory(prefix="grpo-restore-") as tmp:
            folder = checkpoint.download(self.store, cref, tmp)
            state = checkpoint.read_state(folder)
            self.learner.load_state(folder, rank=0, policy_version=int(state["policy_version"]))
        self._last_train = None
        synced = self.sync()
        return {"seconds": time.perf_counter() - started, "policy_version": self.learner.version,
                "sync_seconds": synced["seconds"]}

    def save_final(self, folder: str = "final") -> dict[str, Any]:
        """The trained policy in HF format (weights + tokenizer) under ``<run>/<folder>/``, manifest last."""
        written = CheckpointWriter(self.store, folder, self._policy_snapshot()).start().result(wait=True)
        manifest = {"files": {name: rec["bytes"] for name, rec in written["files"].items()},
                    "policy_version": self.learner.version}
        self.store.put_bytes(f"{folder}/MANIFEST.json", json.dumps(manifest, indent=1).encode())
        return {"folder": self.store.url(folder), **manifest}

    def _policy_snapshot(self) -> Snapshot:
        snap = self.learner.hf_snapshot()
        snap.update(_tokenizer_snapshot(self.cfg.model.path))
        return snap

    # ----------------------------------------------------------------------------------------------- checks
    def sampler_logprobs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        return self.sampler.score_tokens(sequences, prompt_lens)

    def learner_logprobs(self, sequences: list[list[int]], prompt_lens: list[int]) -> list[list[float]]:
        batch = pack_batch([s[:p] for s, p in zip(sequences, prompt_lens)],
                           [s[p:] for s, p in zip(sequences, prompt_lens)], None,
                           [0.0] * len(sequences), [True] * len(sequences), self.pad_id)
        logp = self.learner.logprobs(batch)
        return [logp[i, p - 1: len(s) - 1].tolist() for i, (s, p) in enumerate(zip(sequences, prompt_lens))]

    def weights_digest(self) -> str:
        """sha256 over the learner's parameters: tests check that training changed them."""
        h = hashlib.sha256()
        for name, t in self.learner.named_weights():
            h.update(name.encode())
            h.update(t.float().cpu().numpy().tobytes())
        return h.hexdigest()

    def _rows(self, iteration: int, prompts: list[dict[str, Any]], groups: list[list[Sample]],
              group_offset: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Rollout rows (the typed columns) and, per row, its prompt's dataset columns; grouped, in sample order."""
        rows, columns = [], []
        for gi, (prompt, samples) in enumerate(zip(prompts, groups)):
            for si, s in enumerate(samples):
                rows.append({
                    "iteration": iteration, "prompt_id": prompt["prompt_id"], "group_id": group_offset + gi,
                    "sample_idx": si, "prompt_token_ids": prompt["prompt_token_ids"],
                    "response_token_ids": s.token_ids, "sampler_logprobs": s.logprobs, "response_text": s.text,
                    "finish_reason": s.finish_reason, "truncated": s.finish_reason == "length",
                    "response_length": len(s.token_ids), "policy_version": self.sampler.version})
                columns.append(prompt.get("columns", {}))
        return rows, columns

    def _seed(self, iteration: int, group: int) -> int:
        # Distinct per (seed, iteration, group); vLLM adds 0..G-1 for the group's samples.
        return (self.cfg.seed * 1_000_003 + iteration * 10_007 + group * 1_009) % (2**31 - 1)
