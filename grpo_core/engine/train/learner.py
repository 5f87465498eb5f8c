"""The DeepSpeed learner: logprobs, the policy-gradient step, and the weights handed to the sampler.

One engine lives for the whole run (model load and DeepSpeed init are expensive). A step consumes one scored batch:
old logprobs once, then ``ppo_epochs`` passes of mini-batches, each mini-batch an optimizer step accumulated over
micro-batches. Micro-batch losses are normalised by the mini-batch's denominator, so their sum is exactly the
mini-batch loss whatever the micro-batch size (DeepSpeed's own 1/GAS scaling is turned off).
"""
from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from grpo_core.algo import entropy_from_logits, loss_denominator
from grpo_core.algo.objective import ObjectiveInputs, make_objective
from grpo_core.run.checkpoint import Snapshot
from grpo_core.engine.train.bf16_rounding import is_bf16_optimizer, round_stochastically
from grpo_core.engine.train.step_metrics import MicroBatchMetrics
from grpo_core.config import AlgoConfig, LoraConfig, TrainConfig, zero_stage_for
from grpo_core.engine.train.batch import (TokenBatch, equal_counts, pack_row, plan_micro_batches, plan_packed_micro_batches,
                                   token_logprobs, token_logprobs_and_entropy)
from grpo_core.engine.train import segment_attention
from grpo_core.engine.train.distributed import ensure_process_group, skip_inference_all_reduce_kernel
from grpo_core.engine.train.ds_engine import capture_checkpoint, deepspeed_config, lr_lambda
from grpo_core.engine.train.ds_engine import step as ds_step
from grpo_core.engine.train.output_head import chunk_tokens_for, output_logprobs

# DeepSpeed's checkpoint tag: its files live under <checkpoint>/learner/.
LEARNER_TAG = "learner"


@dataclass(frozen=True)
class LearnerSpec:
    model_path: str
    dtype: str = "float32"
    seed: int = 0
    total_steps: int = 1          # optimizer steps in the run, for the lr schedule
    temperature: float = 1.0      # the sampling temperature: logits are divided by it, as the sampler did
    max_new_tokens: int = 256
    fused_kernels: bool = False   # on CUDA: Liger's Triton kernels for RMSNorm, RoPE and SwiGLU (needs liger-kernel)
    lora: LoraConfig | None = None  # train peft LoRA adapters only (the base stays frozen); None: all weights
    pack_prompts: bool = True     # micro-batches as packed rows, each group's prompt once (train.pack_prompts)
    objective: str = "policy_gradient"  # what the step minimises (grpo_core.algo.objective.OBJECTIVES)
    teacher_top_k_weight: float = 0.0  # > 0: plus the forward KL to a distillation teacher's top K (distill.top_k)


def states_at(hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``hidden[rows, cols]`` ([B, L, H] -> [N, H]) as an ``index_select`` of the flattened states, for its backward.

    Advanced indexing's backward is ``index_put_(accumulate=True)``, which on CPU adds repeated positions with atomic
    adds from several threads, in an order that depends on timing. Packed rows repeat positions (a shared prompt's
    last position predicts every response's first token), so the gradient, and from there the whole run, changed in
    the 7th digit from one process to the next on a loaded machine. ``index_select``'s backward (``index_add_``) sums
    repeated positions in index order: the same bits every time."""
    b, length, h = hidden.shape
    return hidden.reshape(b * length, h).index_select(0, rows * length + cols)


class Learner:
    def __init__(self, spec: LearnerSpec, algo: AlgoConfig, train: TrainConfig, micro_batch_size: int,
                 grad_accum_steps: int):
        import deepspeed
        from transformers import AutoModelForCausalLM

        started = time.perf_counter()
        torch.manual_seed(spec.seed)
        self.spec, self.algo, self.train_cfg = spec, algo, train
        self.objective = make_objective(spec.objective, algo, spec.teacher_top_k_weight)
        dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(spec.model_path, dtype=dtype,
                                                     attn_implementation=segment_attention.register())
        model.config.use_cache = False
        if train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if spec.fused_kernels and torch.cuda.is_available():
            _apply_fused_kernels(model)
        if spec.lora is not None:
            model = with_lora(model, spec.lora)
        # Only what trains is in the optimizer (with LoRA: the adapters; the base has requires_grad False).
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.lr,
                                      betas=train.betas, weight_decay=train.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train, spec.total_steps))
        ensure_process_group()
        skip_inference_all_reduce_kernel()
        self.zero_stage = zero_stage_for(train, torch.distributed.get_world_size(), spec.dtype)
        ds_config = deepspeed_config(train, micro_batch_size, grad_accum_steps, self.zero_stage,
                                     bf16=dtype == torch.bfloat16)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
        self.device = self.engine.device
        if dtype == torch.bfloat16 and (train.bf16_rounding == "stochastic" or (
                train.bf16_rounding == "auto" and is_bf16_optimizer(self.optimizer))):
            round_stochastically(self.optimizer, spec.seed, lambda: self.version)
        self.ref_model = None
        if algo.kl_coeff > 0 and spec.lora is None:  # with LoRA the reference is the base: the adapter disabled
            self.ref_model = AutoModelForCausalLM.from_pretrained(
                spec.model_path, dtype=dtype, attn_implementation=segment_attention.register()).to(self.device)
            self.ref_model.eval().requires_grad_(False)
        self.micro_batch_size = micro_batch_size
        self.grad_accum_steps = grad_accum_steps
        self.version = 0  # the number of optimizer steps taken: the policy version
        self.init_seconds = time.perf_counter() - started

    # ----------------------------------------------------------------------------------------------- logprobs
    def _forward_logprobs(self, model, mb: TokenBatch, entropy: str = "none", temperature: float | None = None,
                          pack: bool = False, teacher_top: bool = False):
        """-> (logprobs [B, L-1], entropy [B, L-1] or None) at the response tokens (0 elsewhere: nothing reads the
        prompt's). entropy: "none", "metric" (no grad) or "loss". ``temperature``: None is the sampling temperature
        (what the policy loss needs). ``pack``: the micro-batch as one packed row (``train.pack_prompts``,
        ``pack_row``: no padding, each group's prompt once), its attention by ``segment_attention``.
        ``teacher_top``: a third value, the logprobs of ``mb.teacher_top_ids`` [B, L-1, K] (from the same logits).

        The decoder runs on the batch (or its packed row); the output layer only at the positions that predict a
        response token, ``logits_chunk_mb`` at a time (``output_head``): the [B, L, V] logits never exist."""
        temp = self.spec.temperature if temperature is None else temperature
        if self.zero_stage == 3:
            return self._full_logits_logprobs(model, mb, entropy, temp, teacher_top)
        lm = unwrapped(model)
        dev = self.device
        # Not under ZeRO-3 (above): its forward gathers each module's parameters in a collective, so every rank must
        # run the same modules in the same order (a rank whose micro-batch has no response token would not).
        packed = packed_row(mb, lm, dev) if pack and self.packs_rows else None
        if packed is not None and packed.tokens:
            at, where = packed_states(lm.get_decoder(), packed, dev)
            targets = packed.targets.to(dev)
        else:
            hidden = lm.get_decoder()(input_ids=mb.input_ids.to(dev), attention_mask=mb.attention_mask.to(dev),
                                      use_cache=False).last_hidden_state
            rows, cols = (t.to(dev) for t in mb.response_mask.nonzero(as_tuple=True))
            at, where, targets = states_at(hidden, rows, cols), (rows, cols), mb.input_ids.to(dev)[rows, cols + 1]
        head = lm.get_output_embeddings()
        if teacher_top:  # the teacher's K tokens beside the sampled one: one logits chunk serves all K + 1
            targets = torch.cat([targets[:, None], mb.teacher_top_ids.to(dev)[where]], dim=1)
        tok_logp, tok_ent = output_logprobs(at, head.weight, targets, temperature=temp, entropy=entropy,
                                            chunk_tokens=chunk_tokens_for(head.weight.shape[0],
                                                                          self.train_cfg.logits_chunk_mb))
        shape = (len(mb), mb.input_ids.shape[1] - 1)
        top = None
        if teacher_top:
            tok_logp, tok_top = tok_logp[:, 0], tok_logp[:, 1:]
            top = torch.zeros((*shape, tok_top.shape[1]), dtype=torch.float32, device=dev).index_put(where, tok_top)
        logp = torch.zeros(shape, dtype=torch.float32, device=dev).index_put(where, tok_logp)
        ent = None if tok_ent is None else \
            torch.zeros(shape, dtype=torch.float32, device=dev).index_put(where, tok_ent)
        return (logp, ent, top) if teacher_top else (logp, ent)

    def _full_logits_logprobs(self, model, mb: TokenBatch, entropy: str, temp: float, teacher_top: bool = False):
        """ZeRO-3: the whole model's forward (its hooks gather each module's partitioned parameters, the output
        layer's too), logprobs from the [B, L, V] logits at every position."""
        ids = mb.input_ids.to(self.device)
        out = model(input_ids=ids, attention_mask=mb.attention_mask.to(self.device))
        if teacher_top:
            logp, ent = self._logprobs_from_logits(out.logits, ids, entropy, temp)
            top = torch.log_softmax(out.logits[:, :-1].float() / temp, dim=-1).gather(
                -1, mb.teacher_top_ids.to(self.device))
            return logp, ent, top * mb.response_mask.to(self.device)[..., None]
        return self._logprobs_from_logits(out.logits, ids, entropy, temp)

    @staticmethod
    def _logprobs_from_logits(logits, ids, entropy: str, temp: float):
        """(logprobs [B, L-1], entropy or None) from the whole [B, L, V] logits."""
        if logits.is_cuda and entropy != "loss":
            # One fused pass that never makes a float32 copy of the logits (benchmarks/gpu_learner.py).
            return token_logprobs_and_entropy(logits, ids, temp, with_entropy=entropy == "metric")
        logp = token_logprobs(logits, ids, temp)
        if entropy == "none":
            return logp, None
        scaled = logits[:, :-1].float() / temp
        if entropy == "loss":
            return logp, entropy_from_logits(scaled)
        with torch.no_grad():
            return logp, entropy_from_logits(scaled)

    @property
    def packs_rows(self) -> bool:
        """Whether a forward asked to pack (``pack=True``) makes packed rows: ``train.pack_prompts``, not under
        ZeRO-3 (whose forward runs the whole model on the padded batch)."""
        return self.spec.pack_prompts and self.zero_stage != 3

    def _plan(self, batch: TokenBatch, budget: int, pack: bool) -> list[list[int]]:
        """Rows of ``batch`` into micro-batches of at most ``budget`` tokens: as packed rows hold them where the
        forward packs (``pack`` and ``packs_rows``), else as padded rows do."""
        if pack and self.packs_rows:
            return plan_packed_micro_batches(batch.prompt_runs(), batch.lengths.tolist(), budget)
        return plan_micro_batches(batch.lengths.tolist(), budget)

    def _micro_batches(self, batch: TokenBatch, pack: bool) -> list[torch.Tensor]:
        """Row indices of each micro-batch of a no-grad pass over ``batch``: by tokens
        (``train.max_tokens_per_microbatch``) or ``micro_batch_size`` rows at a time. Under ZeRO-3 always by rows:
        its forward is a collective, and every rank has as many rows as the others, not the same lengths."""
        budget = self.train_cfg.max_tokens_per_microbatch
        if budget is None or self.zero_stage == 3:
            return [torch.arange(i, min(i + self.micro_batch_size, len(batch)))
                    for i in range(0, len(batch), self.micro_batch_size)]
        return [torch.tensor(rows) for rows in self._plan(batch, budget, pack)]

    def _no_grad_logprobs(self, model, batch: TokenBatch, pack: bool = False, **kwargs) -> torch.Tensor:
        """[B, L-1] logprobs over ``batch`` in micro-batches (each trimmed to its longest row), rows in place."""
        out = torch.zeros(len(batch), batch.input_ids.shape[1] - 1)
        for rows in self._micro_batches(batch, pack):
            part = self._forward_logprobs(model, batch.select(rows).trimmed(), pack=pack, **kwargs)[0].cpu()
            out[rows, :part.shape[1]] = part
        return out

    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, temperature: float | None = None, pack: bool = False) -> torch.Tensor:
        """[B, L-1] logprobs of the current policy at the response tokens (0 elsewhere), in micro-batches, no grad
        (at the sampling temperature unless ``temperature`` is given). ``pack``: as packed rows where ``packs_rows``."""
        self.engine.eval()
        out = self._no_grad_logprobs(self.engine, batch, temperature=temperature, pack=pack)
        self.engine.train()
        return out

    @property
    def has_reference(self) -> bool:
        """Whether KL to a reference is computed: algo.kl_coeff > 0 (a frozen copy, or with LoRA the base)."""
        return self.algo.kl_coeff > 0

    @torch.no_grad()
    def ref_logprobs(self, batch: TokenBatch, pack: bool = False) -> torch.Tensor:
        """[B, L-1] logprobs of the frozen reference model (exists only when algo.kl_coeff > 0). With LoRA the
        reference is the base model itself, run with the adapter disabled (peft), so no second copy is held."""
        if not self.has_reference:
            raise RuntimeError("no reference model: it is loaded only when algo.kl_coeff > 0")
        if self.spec.lora is None:
            return self._no_grad_logprobs(self.ref_model, batch, pack=pack)
        self.engine.eval()
        with self.engine.module.disable_adapter():
            out = self._no_grad_logprobs(self.engine, batch, pack=pack)
        self.engine.train()
        return out

    def _train_micro_batches(self, batch: TokenBatch, share: int, world_size: int, rank: int,
                             n_minis: int) -> list[list[torch.Tensor]]:
        """Per mini-batch, this rank's micro-batches as row indices into its share of that mini-batch.
        ``batch``: the whole batch (every rank has it, so every rank plans every rank's micro-batches and all run
        as many)."""
        budget = self.train_cfg.max_tokens_per_microbatch
        if budget is None:
            fixed = [torch.arange(i, i + self.micro_batch_size) for i in range(0, share, self.micro_batch_size)]
            return [fixed for _ in range(n_minis)]
        plans = []
        mini = share * world_size
        for m in range(n_minis):
            per_rank = [self._plan(batch.select(slice(m * mini + r * share, m * mini + (r + 1) * share)), budget,
                                   pack=True) for r in range(world_size)]
            plans.append([torch.tensor(rows) for rows in equal_counts(per_rank)[rank]])
        return plans

    # ------------------------------------------------------------------------------------------------- step
    def train_step(self, batch: TokenBatch, rank: int = 0, world_size: int = 1) -> dict[str, float]:
        """One scored batch -> ``ppo_epochs x (B / mini_batch)`` optimizer steps. Returns step metrics.

        Data parallel: every rank gets the whole batch and trains on its share of each mini-batch (rows
        ``rank * share .. (rank + 1) * share`` of it). Loss denominators are those of the whole mini-batch and each
        rank's loss is scaled by ``world_size`` against DeepSpeed's gradient averaging, so the K ranks' step is the
        step one rank takes on the whole batch. The reported ``loss`` is this rank's part (the parts sum to the
        mini-batch loss)."""
        started = time.perf_counter()
        n = len(batch)
        share = self.micro_batch_size * self.grad_accum_steps  # sequences of a mini-batch on this rank
        mini = share * world_size
        if n % mini:
            raise ValueError(f"batch of {n} rows is not a multiple of the mini-batch ({mini})")
        n_minis = n // mini
        agg = self.objective.agg_mode
        norm_length = self.algo.loss_norm_length or self.spec.max_new_tokens
        denominators = [max(1.0, loss_denominator(batch.select(slice(m * mini, (m + 1) * mini)).loss_mask, agg))
                        for m in range(n_minis)]
        plans = self._train_micro_batches(batch, share, world_size, rank, n_minis)
        if world_size > 1:
            batch = batch.select(torch.cat([torch.arange(m * mini + rank * share, m * mini + (rank + 1) * share)
                                            for m in range(n_minis)]))
        on_policy = self.train_cfg.ppo_epochs == 1 and n_minis == 1
        # Old logprobs once per batch; when the batch makes a single optimizer step they equal the current
        # logprobs, so the extra forward pass is skipped (ratio = 1 exactly, as in verl).
        # Packed (train.pack_prompts): these are read only at response tokens, where packing gives the same values.
        old_logp = None if on_policy or not self.objective.uses_old_logprobs else self.logprobs(batch, pack=True)
        ref_logp = self.ref_logprobs(batch, pack=True) if self.has_reference else None
        gathered = MicroBatchMetrics()
        grad_norms = []
        real_tokens = computed_tokens = 0  # every row's prompt + response; the positions the decoder computed
        packs = self.packs_rows
        by_tokens = self.train_cfg.max_tokens_per_microbatch is not None
        for _epoch in range(self.train_cfg.ppo_epochs):
            for m in range(n_minis):
                mini_idx = slice(m * share, (m + 1) * share)
                mini_batch = batch.select(mini_idx)
                denom = denominators[m]
                for k, idx in enumerate(plans[m]):
                    mb = mini_batch.select(idx).trimmed()
                    real_tokens += int(mb.lengths.sum())
                    computed_tokens += (mb.packed_tokens() if packs else 0) or mb.input_ids.numel()
                    if by_tokens:  # as many micro-batches as this mini-batch has, not the configured count
                        self.engine.set_gradient_accumulation_boundary(k == len(plans[m]) - 1)
                    old = None if old_logp is None else old_logp[mini_idx][idx]
                    ref = None if ref_logp is None else ref_logp[mini_idx][idx]
                    loss, metrics = self._micro_batch_loss(mb, old, ref, denom, norm_length)
                    gathered.add(metrics)
                    self.engine.backward(loss * world_size if world_size > 1 else loss, scale_wrt_gas=False)
                    pre_clip = ds_step(self.engine, self.zero_stage)
                    gathered.add({"loss": float(loss.detach())})
                norm = self.engine.get_global_grad_norm()
                if norm is None:
                    norm = pre_clip
                if norm is not None:
                    grad_norms.append(float(norm))
                self.version += 1
        out = gathered.result(steps=self.train_cfg.ppo_epochs * n_minis)  # by grpo_core.engine.train.step_metrics
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        # padding among the positions the decoder computed (a packed row has none), and those positions against every
        # row's prompt + response (below 1 where a packed row holds a group's prompt once)
        out["padded_frac"] = 0.0 if packs or not computed_tokens else 1.0 - real_tokens / computed_tokens
        out["computed_tokens_frac"] = computed_tokens / real_tokens if real_tokens else 0.0
        out["lr"] = float(self.scheduler.get_last_lr()[0])
        out["optimizer_steps"] = float(self.train_cfg.ppo_epochs * n_minis)
        out["tokens"] = float(batch.loss_mask.sum())  # this rank's
        out["seconds"] = time.perf_counter() - started
        return out

    def _micro_batch_loss(self, mb: TokenBatch, old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None,
                          denominator: float, norm_length: int) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's forward pass and the objective on it. ``old_logp`` / ``ref_logp``: its rows of the
        batch's old and reference logprobs (None: on-policy, the current logprobs detached; no reference)."""
        mask = mb.loss_mask.to(self.device)
        top = self.spec.teacher_top_k_weight > 0 and mb.teacher_top_ids is not None
        logp, entropy, *student_top = self._forward_logprobs(
            self.engine, mb, entropy="loss" if self.algo.entropy_coeff > 0 else "metric", pack=True, teacher_top=top)
        width = logp.shape[1]
        mb_old = logp.detach() if old_logp is None else old_logp[:, :width].to(self.device)
        # the sampler/learner agreement on every token is measured without a correction too
        sampler_logp = mb.sampler_logprobs[:, :width].to(self.device) \
            if (self.algo.offpolicy or "none") != "none" or mb.has_sampler_logprobs else None
        adv = mb.advantages if mb.advantages.dim() == 1 else mb.advantages[:, :width]  # [B] / per token
        return self.objective(ObjectiveInputs(
            logp, mb_old, adv.to(self.device), mask, entropy=entropy, denominator=denominator,
            norm_length=norm_length, sampler_logprobs=sampler_logp,
            ref_logprobs=None if ref_logp is None else ref_logp[:, :width].to(self.device),
            student_top_logprobs=student_top[0] if top else None,
            teacher_top_logprobs=mb.teacher_top_logprobs[:, :width].to(self.device) if top else None))

    # ---------------------------------------------------------------------------------------------- weights
    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full state dict in HF names (what vLLM's loader expects). Under ZeRO-3 the partitioned parameters
        are gathered first: a collective, so every rank must call it together. With LoRA it is the peft model's
        state dict (base and adapter tensors under peft's names), which vLLM does not load: syncs use
        ``save_adapter``."""
        if self.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=None):
                return [(name, t.detach().clone()) for name, t in self.engine.module.state_dict().items()]
        return [(name, t.detach()) for name, t in self.engine.module.state_dict().items()]

    # ------------------------------------------------------------------------------------------- checkpoints
    def snapshot(self, rank: int = 0) -> Snapshot:
        """The learner's whole state, copied to CPU memory now: DeepSpeed's own checkpoint (module, optimizer
        partitions, lr scheduler, step counters) and this rank's RNG states, as files under ``learner/``.

        DeepSpeed's ``save_checkpoint`` runs as usual (it is a collective across ranks) but with a checkpoint
        engine that clones each state instead of writing it; the copies are written later by a
        ``CheckpointWriter`` while training goes on."""
        # With LoRA the frozen base is not saved: it is model.path, unchanged (only the adapter trains).
        saved = capture_checkpoint(self.engine, LEARNER_TAG, exclude_frozen=self.spec.lora is not None)
        snap = Snapshot()
        trainable = {n for n, p in self.engine.module.named_parameters() if p.requires_grad}
        for path, state in saved:
            if self.spec.lora is not None and isinstance(state, dict) and isinstance(state.get("module"), dict):
                # DeepSpeed's exclude_frozen_parameters keeps a tied output layer (a state-dict entry that is no
                # named parameter): the module states keep the adapter alone.
                state["module"] = type(state["module"])((k, v) for k, v in state["module"].items() if k in trainable)
            snap.add_torch(path, state)
        snap.add_torch(f"{LEARNER_TAG}/rng-rank-{rank}.pt", _rng_state())
        return snap

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """LoRA: the adapter tensors under peft's saved names (what ``adapter_model.safetensors`` holds)."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.engine.module)

    def save_adapter(self, folder: str) -> int:
        """LoRA: the adapter in peft format (``adapter_model.safetensors`` + ``adapter_config.json``) into a local
        folder, written by peft itself so that ``PeftModel.from_pretrained`` and vLLM's LoRA loader read it as is.
        Returns the bytes written."""
        if self.spec.lora is None:
            raise RuntimeError("save_adapter needs model.lora: this learner trains all weights")
        self.engine.module.save_pretrained(folder)
        return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))

    @property
    def tied_output(self) -> bool:
        """Whether the output layer IS the embedding: ``lm_head.weight`` is then never published (HF drops it, vLLM
        has no separate weight to load)."""
        return bool(getattr(self.engine.module.config, "tie_word_embeddings", False))

    def hf_snapshot(self) -> Snapshot:
        """The policy in HF format, copied now: one safetensors file + config that transformers and vLLM load;
        with LoRA the adapter in peft format (``save_adapter``), to be loaded on the base model."""
        if self.spec.lora is not None:
            return self._adapter_snapshot()
        module = self.engine.module
        tensors = {name: t.to("cpu", copy=True).contiguous() for name, t in self.named_weights()}
        if self.tied_output:
            tensors.pop("lm_head.weight", None)  # the embedding is the output layer; HF drops the tied copy too
        snap = Snapshot()
        snap.add_safetensors("model.safetensors", tensors)
        snap.add_bytes("config.json", module.config.to_json_string().encode())
        if getattr(module, "generation_config", None) is not None:
            snap.add_bytes("generation_config.json", module.generation_config.to_json_string().encode())
        return snap

    def _adapter_snapshot(self) -> Snapshot:
        """The adapter files peft wrote (not its model-card README), as bytes copied now."""
        from grpo_core.lifecycle.model.adapter_files import ADAPTER_FILES

        snap = Snapshot()
        with tempfile.TemporaryDirectory(prefix="grpo-adapter-") as tmp:
            self.save_adapter(tmp)
            for name in ADAPTER_FILES:
                with open(os.path.join(tmp, name), "rb") as fh:
                    snap.add_bytes(name, fh.read())
        return snap

    def load_state(self, folder: str, rank: int, policy_version: int) -> None:
        """Restore what ``snapshot`` saved (``folder`` holds ``learner/``) and serve it as ``policy_version``.
        With LoRA the checkpoint holds no frozen base weights (they come from ``model.path``), so the module is
        loaded non-strictly; the adapter's fp32 copy comes back from the optimizer state as well."""
        path, _ = self.engine.load_checkpoint(folder, tag=LEARNER_TAG, load_module_strict=self.spec.lora is None,
                                              load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{folder}/{LEARNER_TAG}: DeepSpeed found no checkpoint to load")
        _set_rng_state(torch.load(os.path.join(folder, LEARNER_TAG, f"rng-rank-{rank}.pt"), weights_only=False))
        self.version = policy_version


def packed_row(mb: TokenBatch, model, device: torch.device):
    """``pack_row`` of the micro-batch for ``model`` (its attention window; segment attention's cost per call on
    ``device``), with segment attention required of the model; None where the batch does not pack."""
    packed = pack_row(mb, segment_attention.attention_width(model.config), segment_attention.call_cost(device))
    if packed is not None and packed.tokens:
        segment_attention.require(model)
    return packed


def packed_states(decoder, packed, device: torch.device) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The decoder run on the packed row: its states at the positions that predict a response token ([N, H]) and
    where each lands in the micro-batch's [B, L-1] columns (rows, cols). A mask of ones: with none, transformers
    reads the position resets as packed sequences and builds a [T, T] mask that segment attention would not use."""
    hidden = decoder(input_ids=packed.input_ids.to(device), position_ids=packed.position_ids.to(device),
                     attention_mask=torch.ones_like(packed.input_ids, device=device), segments=packed.segments,
                     use_cache=False).last_hidden_state
    src = packed.src_pos.to(device)
    return states_at(hidden, torch.zeros_like(src), src), (packed.dst_row.to(device), packed.dst_col.to(device))


def unwrapped(model):
    """The HF causal LM inside a DeepSpeed engine and/or a peft wrapper (its submodules carry the LoRA layers)."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def with_lora(model, lora: LoraConfig, task_type: str = "CAUSAL_LM"):
    """The HF model wrapped by peft with LoRA adapters on ``lora.target_modules``: peft freezes every base weight
    and initialises B = 0, so the policy at version 0 is exactly the base model (what the samplers serve before
    the first adapter arrives). ``TOKEN_CLS`` (PPO's critic): peft also trains the new scalar head in full."""
    from peft import LoraConfig as PeftLoraConfig, get_peft_model

    return get_peft_model(model, PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=list(lora.target_modules), bias="none",
                                                task_type=task_type))


def _apply_fused_kernels(model) -> None:
    """Liger's Triton kernels for RMSNorm, RoPE and SwiGLU, patched into this model instance (same parameters and
    state dict; forward/backward only). Its fused cross-entropy stays off: the learner needs per-token logprobs."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError as exc:
        raise RuntimeError("train.fused_kernels needs the liger-kernel package (pip install -e '.[gpu]')") from exc
    _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False)


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
