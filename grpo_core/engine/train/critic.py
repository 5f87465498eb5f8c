"""PPO's critic in a learner rank: a value model with a DeepSpeed engine of its own beside the policy's.

The model is a causal LM's decoder with a scalar head (transformers' ``AutoModelForTokenClassification`` with one
label, as verl's critic): started from the policy's folder (or ``critic.path``), its head initialised from the run's
seed. It lives in the learner ranks rather than actors of its own because its inputs are the learner's batch and its
outputs (values, then returns) feed the policy's step in the same call: no transfer, and the same data-parallel
split, ZeRO stage, optimizer-step count and checkpoint as the policy. The cost is one more forward per iteration
(the values before the update) and the critic's own update.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from grpo_core.algo import loss_denominator
from grpo_core.algo.value import value_loss
from grpo_core.config import LoraConfig, TrainConfig
from grpo_core.engine.train import segment_attention
from grpo_core.engine.train.batch import TokenBatch
from grpo_core.engine.train.distributed import ensure_process_group, skip_inference_all_reduce_kernel
from grpo_core.engine.train.ds_engine import capture_checkpoint, deepspeed_config, lr_lambda
from grpo_core.engine.train.ds_engine import step as ds_step
from grpo_core.engine.train.learner import Learner, packed_row, packed_states, unwrapped, with_lora
from grpo_core.engine.train.step_metrics import MicroBatchMetrics

if TYPE_CHECKING:
    from grpo_core.config import AlgoConfig, GRPOConfig

# DeepSpeed's checkpoint tag of the critic: its files live under <checkpoint>/critic/.
CRITIC_TAG = "critic"


@dataclass(frozen=True)
class CriticSpec:
    model_path: str
    dtype: str = "float32"
    lr: float = 1e-5
    value_clip: float | None = 0.5
    total_steps: int = 1  # optimizer steps in the run (the policy's), for the lr schedule
    lora: LoraConfig | None = None  # the policy's LoRA: the critic trains adapters of the same shape and its head
    pack: bool = True  # train.pack_prompts: each micro-batch's forward as one packed row (not under ZeRO-3)


class Critic:
    def __init__(self, spec: CriticSpec, train: TrainConfig, micro_batch_size: int, grad_accum_steps: int,
                 zero_stage: int):
        import deepspeed
        from transformers import AutoConfig, AutoModelForTokenClassification

        started = time.perf_counter()
        self.spec, self.train_cfg = spec, train
        dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
        # No dropout before the head (transformers' token-classification default is 0.1), as verl's critic: a value
        # is a regression target, and the step must not depend on the RNG (exact resume).
        config = AutoConfig.from_pretrained(spec.model_path, num_labels=1)
        config.classifier_dropout = 0.0
        model, loading = AutoModelForTokenClassification.from_pretrained(
            spec.model_path, config=config, dtype=dtype, output_loading_info=True,
            attn_implementation=segment_attention.register())
        _zero_new_head(model, loading["missing_keys"])
        if train.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if spec.lora is not None:
            model = with_lora(model, spec.lora, task_type="TOKEN_CLS")
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr,
                                      betas=train.betas, weight_decay=train.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(train, spec.total_steps))
        self.zero_stage = zero_stage
        ensure_process_group()  # the learner's group (a world of one when built alone)
        skip_inference_all_reduce_kernel()  # as the learner: never compile a kernel training does not call
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler,
            config=deepspeed_config(train, micro_batch_size, grad_accum_steps, zero_stage, bf16=spec.dtype ==
                                    "bfloat16"))
        self.device = self.engine.device
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.init_seconds = time.perf_counter() - started

    def _forward(self, mb: TokenBatch) -> torch.Tensor:
        """[B, L-1] V(s_t) at the columns that predict a response token (the value of the state before that token is
        sampled), float32; 0 elsewhere. As the policy's forward (``train.pack_prompts``): the micro-batch as one
        packed row, each group's prompt once, and the head only where a value is read; the padded batch under
        ZeRO-3 (its forward is a collective) or without packing."""
        dev = self.device
        shape = (len(mb), mb.input_ids.shape[1] - 1)
        model = unwrapped(self.engine)
        packed = packed_row(mb, model, dev) if self.spec.pack and self.zero_stage != 3 else None
        if packed is None or not packed.tokens:
            out = self.engine(input_ids=mb.input_ids.to(dev), attention_mask=mb.attention_mask.to(dev))
            return out.logits[:, :-1, 0].float() * mb.response_mask.to(dev)
        at, where = packed_states(getattr(model, model.base_model_prefix), packed, dev)
        values = model.score(at)[:, 0].float()
        return torch.zeros(shape, dtype=torch.float32, device=dev).index_put(where, values) * \
            mb.response_mask.to(dev)

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """[B, L-1] the critic's values at the response tokens (0 elsewhere), no grad, ``micro_batch_size`` rows at
        a time (every rank runs as many: a ZeRO-3 forward is a collective)."""
        self.engine.eval()
        out = torch.zeros(len(batch), batch.input_ids.shape[1] - 1)
        for start in range(0, len(batch), self.micro_batch_size):
            rows = torch.arange(start, min(start + self.micro_batch_size, len(batch)))
            mb = batch.select(rows).trimmed()
            part = self._forward(mb).cpu()
            out[rows, :part.shape[1]] = part
        self.engine.train()
        return out

    def train_step(self, batch: TokenBatch, old_values: torch.Tensor, returns: torch.Tensor, rank: int = 0,
                   world_size: int = 1, epochs: int = 1) -> dict[str, float]:
        """``epochs`` passes of mini-batches over the batch, one critic optimizer step each (as many as the policy's
        step took), on the clipped value loss against ``returns`` (token mean over each whole mini-batch).

        batch, old_values, returns: the whole batch's ([B, L-1] the last two); each rank trains on its share of
        each mini-batch, its loss scaled by ``world_size`` against DeepSpeed's gradient averaging (the policy's
        rule)."""
        started = time.perf_counter()
        share = self.micro_batch_size * self.grad_accum_steps
        mini = share * world_size
        n_minis = len(batch) // mini
        denominators = [max(1.0, loss_denominator(batch.select(slice(m * mini, (m + 1) * mini)).loss_mask,
                                                  "token_mean")) for m in range(n_minis)]
        if world_size > 1:
            mine = torch.cat([torch.arange(m * mini + rank * share, m * mini + (rank + 1) * share)
                              for m in range(n_minis)])
            batch, old_values, returns = batch.select(mine), old_values[mine], returns[mine]
        gathered, norms = MicroBatchMetrics(), []
        for _epoch in range(epochs):
            for m in range(n_minis):
                for start in range(m * share, (m + 1) * share, self.micro_batch_size):
                    rows = torch.arange(start, start + self.micro_batch_size)
                    mb = batch.select(rows).trimmed()
                    width = mb.input_ids.shape[1] - 1
                    mask = mb.loss_mask.to(self.device)
                    loss, metrics = value_loss(self._forward(mb), old_values[rows, :width].to(self.device),
                                               returns[rows, :width].to(self.device), mask,
                                               clip=self.spec.value_clip, denominator=denominators[m])
                    gathered.add(metrics)
                    self.engine.backward(loss * world_size if world_size > 1 else loss, scale_wrt_gas=False)
                    pre_clip = ds_step(self.engine, self.zero_stage)
                norm = self.engine.get_global_grad_norm()
                norm = pre_clip if norm is None else norm
                if norm is not None:
                    norms.append(float(norm))
        out = gathered.result(steps=epochs * n_minis)
        out["critic_grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
        out["critic_lr"] = float(self.scheduler.get_last_lr()[0])
        out["critic_seconds"] = time.perf_counter() - started
        return out

    def snapshot(self) -> list[tuple[str, object]]:
        """The critic's whole DeepSpeed state copied to memory now, as (path, state) under ``critic/`` (a
        collective: every rank together). With LoRA its trained part only: the frozen base is its folder's."""
        if self.spec.lora is None:
            return capture_checkpoint(self.engine, CRITIC_TAG)
        trainable = {n for n, p in self.engine.module.named_parameters() if p.requires_grad}
        saved = capture_checkpoint(self.engine, CRITIC_TAG, exclude_frozen=True)
        for _, state in saved:
            if isinstance(state, dict) and isinstance(state.get("module"), dict):
                state["module"] = type(state["module"])((k, v) for k, v in state["module"].items() if k in trainable)
        return saved

    def load_state(self, folder: str) -> None:
        """Restore what ``snapshot`` saved (``folder`` holds ``critic/``); with LoRA onto the frozen base as
        loaded (non-strict)."""
        path, _ = self.engine.load_checkpoint(folder, tag=CRITIC_TAG, load_module_strict=self.spec.lora is None,
                                              load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{folder}/{CRITIC_TAG}: DeepSpeed found no checkpoint of the critic to load")


def gae_batch_advantages(critic: Critic, learner: Learner, batch: TokenBatch, rewards: list[float], algo: AlgoConfig):
    """PPO's advantages of a scored batch, in a learner rank: the critic's values before the update, each row's
    shaped reward on its last policy token (minus the per-token KL to the reference with algo.kl_in_reward, from
    ``learner``'s logprobs), GAE's advantages whitened over the batch's trained tokens, and its returns.

    -> (advantages [B, L-1], (old values, returns) for the critic's step, metrics). ``value_explained_var`` is left
    out where it is undefined (returns that do not vary): a metric is a finite number or absent."""
    import math

    from grpo_core.algo import kl_penalty
    from grpo_core.algo.value import explained_variance, gae_advantages, outcome_token_rewards, whiten

    mask = batch.loss_mask
    values = critic.values(batch)
    penalty = None
    if algo.kl_in_reward:
        kl, _ = kl_penalty(learner.logprobs(batch), learner.ref_logprobs(batch), estimator=algo.kl_estimator,
                           mask=mask)
        penalty = algo.kl_coeff * kl
    token_rewards, metrics = outcome_token_rewards(torch.tensor(rewards, dtype=torch.float32), mask, penalty)
    advantages, returns, m = gae_advantages(token_rewards, values, mask, algo.gae_gamma, algo.gae_lambda)
    metrics.update(m)
    explained = explained_variance(values, returns, mask)
    if math.isfinite(explained):
        metrics["value_explained_var"] = explained
    if mask.sum() >= 2:  # a batch of one trained token keeps its raw advantage (no spread to whiten by)
        advantages = whiten(advantages, mask)
    return advantages, (values, returns), metrics


def ppo_update(critic: Critic, learner: Learner, batch: TokenBatch, rewards: list[float], cfg: GRPOConfig,
               rank: int) -> dict[str, float]:
    """PPO's update in a learner rank: the critic's values and GAE's advantages, the policy's step on them, then the
    critic's step on the same batch. ``critic_seconds``: the critic's whole share of it (its values and its step)."""
    started = time.perf_counter()
    batch.advantages, (values, returns), extra = gae_batch_advantages(critic, learner, batch, rewards, cfg.algo)
    valued = time.perf_counter() - started
    world = cfg.cluster.learners
    metrics = learner.train_step(batch, rank=rank, world_size=world)
    metrics.update(critic.train_step(batch, values, returns, rank=rank, world_size=world, epochs=cfg.train.ppo_epochs))
    metrics["critic_seconds"] += valued
    return {**metrics, **extra}


def _zero_new_head(model, missing: list[str]) -> None:
    """A value head the folder does not hold starts at zero (a head the folder holds, a reward model's, is kept).

    Why not transformers' random init (verl's choice): a random head gives every token a random baseline about as
    large as the rewards (SmolLM2: values of mean 0.94 and explained variance -2 against returns of 0 or 1), which
    only adds variance until the critic has learned; on SmolLM2's arithmetic run it took held-out accuracy from
    0.375 to 0.302 in four iterations. At zero, the first advantages are each answer's reward, whitened over the
    batch (REINFORCE with the batch's mean as baseline), and the critic moves from there."""
    head = [name for name in missing if name.split(".")[0] in ("score", "classifier")]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in head:
                param.zero_()
