"""One training client's model: its weights (LoRA adapters on a frozen base, or all weights), its AdamW state, and
the gradients its ``forward_backward`` calls accumulate until ``optim_step`` applies them.

Tinker's semantics, not the GRPO learner's: losses are summed over tokens and datums (no normalisation: that is
the client's, in its weights and advantages), gradients accumulate across calls, and each ``optim_step`` carries its
own AdamW hyperparameters. Nothing in a step draws random numbers (no dropout), so the state is the weights, the
optimizer's moments and the step count; the LoRA initialisation's seed is recorded with it.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from grpo_core.algo import tinker_losses
from grpo_core.outside.tinker.errors import TinkerRequestError
from grpo_core.outside.tinker.wire import ForwardBackwardCall, TrainDatum

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
LORA_ALPHA = 32.0  # Tinker's LoraConfig has no alpha; 32 is what its reference backends use (the update is alpha/r BA)
STATE_FILE = "state.json"
WEIGHTS_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
PARTIAL = ".partial"  # a checkpoint folder being written, renamed without it when whole


@dataclass(frozen=True)
class TraineeSpec:
    base_model: str          # the model folder
    lora_rank: int           # 0: full fine-tuning
    seed: int                # the LoRA initialisation's
    train_attn: bool = True
    train_mlp: bool = True

    @property
    def lora_targets(self) -> tuple[str, ...]:
        return (ATTENTION if self.train_attn else ()) + (MLP if self.train_mlp else ())


@dataclass(frozen=True)
class AdamStep:
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float


class Trainee:
    def __init__(self, spec: TraineeSpec):
        from transformers import AutoModelForCausalLM

        if spec.lora_rank > 0 and not spec.lora_targets:
            raise TinkerRequestError("LoRA with neither attention nor MLP adapters trains nothing (train_attn and "
                                     "train_mlp are both false)", field="lora_config")
        self.spec = spec
        with torch.random.fork_rng(devices=[]):  # the seed shapes this model's adapters and nothing else's
            torch.manual_seed(spec.seed)
            model = AutoModelForCausalLM.from_pretrained(spec.base_model, dtype=torch.float32)
            model.config.use_cache = False
            if spec.lora_rank > 0:
                from peft import LoraConfig, get_peft_model

                model = get_peft_model(model, LoraConfig(r=spec.lora_rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                         target_modules=list(spec.lora_targets), bias="none",
                                                         task_type="CAUSAL_LM"))
        self.model = model.train()
        self.trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.optimizer = self._fresh_optimizer()
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.max_length = int(getattr(config, "max_position_embeddings", 0) or 2**31)
        self.step = 0
        self.pending = 0  # forward_backward calls accumulated since the last optim_step

    def _fresh_optimizer(self) -> torch.optim.AdamW:
        """AdamW on the trainable weights; each ``optim_step`` sets its hyperparameters (these are Tinker's defaults)."""
        return torch.optim.AdamW([p for _, p in self.trainable], lr=1e-4, betas=(0.9, 0.95), eps=1e-12,
                                 weight_decay=0.0)

    # ----------------------------------------------------------------------------------------- the passes
    def check(self, call: ForwardBackwardCall) -> dict[str, float]:
        """Every datum's tokens and targets inside the vocabulary, its length inside the context, the loss served and
        its inputs all there: checked for all datums before any is computed (nothing is applied half). -> the loss's
        settings with their defaults."""
        try:
            required = tinker_losses.required_inputs(call.loss_fn)
            config = tinker_losses.check_config(call.loss_fn, call.config)
        except tinker_losses.LossInputError as exc:
            raise TinkerRequestError(str(exc), field="loss_fn") from None
        for i, datum in enumerate(call.data):
            if datum.length > self.max_length:
                raise TinkerRequestError(f"data[{i}].model_input: {datum.length} tokens; this model's context is "
                                         f"{self.max_length}", field=f"data[{i}].model_input")
            for where, ids in ((f"data[{i}].model_input", datum.tokens),
                               (f'data[{i}].loss_fn_inputs["target_tokens"]', datum.inputs.get("target_tokens"))):
                if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
                    bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
                    raise TinkerRequestError(f"{where}: token id {bad} is outside the vocabulary [0, "
                                             f"{self.vocab_size})", field=where)
            for name in required:
                if name not in datum.inputs:
                    where = f'data[{i}].loss_fn_inputs["{name}"]'
                    raise TinkerRequestError(f"{where} is missing: loss {call.loss_fn!r} needs {list(required)}",
                                             field=where)
        return config

    def target_logprobs(self, data: list[TrainDatum]) -> list[torch.Tensor]:
        """log p(target_tokens[i] | tokens[:i+1]) for each datum, [N_i] each, in one padded forward pass (right
        padding: a causal model's real positions never see the padding)."""
        width = max(d.length for d in data)
        ids = torch.zeros(len(data), width, dtype=torch.long)
        mask = torch.zeros(len(data), width, dtype=torch.long)
        targets = torch.zeros(len(data), width, dtype=torch.long)
        for row, datum in enumerate(data):
            ids[row, :datum.length] = torch.from_numpy(datum.tokens)
            mask[row, :datum.length] = 1
            targets[row, :datum.length] = torch.from_numpy(datum.inputs["target_tokens"])
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return [logprobs[row, :datum.length] for row, datum in enumerate(data)]

    def forward_backward(self, call: ForwardBackwardCall) -> tuple[dict[str, list[np.ndarray]], dict[str, float]]:
        """-> per-datum outputs (``logprobs``, ``elementwise_loss``, [N_i] each) and ``name:reduction`` metrics.
        ``forward_only`` builds no graph and leaves the gradients as they are."""
        config = self.check(call)
        losses, per_datum_metrics = [], []
        with torch.set_grad_enabled(not call.forward_only):
            logprobs = self.target_logprobs(call.data)
            for i, (datum, t) in enumerate(zip(call.data, logprobs)):
                inputs = {k: torch.from_numpy(v) for k, v in datum.inputs.items() if k != "target_tokens"}
                try:
                    loss, metrics = tinker_losses.elementwise_loss(call.loss_fn, t, inputs, config)
                except tinker_losses.LossInputError as exc:
                    raise TinkerRequestError(f"data[{i}]: {exc}", field=f"data[{i}].loss_fn_inputs") from None
                losses.append(loss)
                per_datum_metrics.append(metrics)
            total = torch.stack([loss.sum() for loss in losses]).sum()
            if not math.isfinite(total.item()):
                raise TinkerRequestError(f"the loss is {total.item()} for these inputs: nothing was accumulated",
                                         field="data")
            if not call.forward_only:
                total.backward()
                self.pending += 1
        metrics = {"loss:sum": total.item(), "num_tokens:sum": float(sum(d.length for d in call.data))}
        for key in sorted({k for m in per_datum_metrics for k in m}):
            values = [m[key] for m in per_datum_metrics if key in m]
            metrics[f"{key}:mean"] = float(sum(values) / len(values))
        outputs = {"logprobs": [t.detach().numpy().astype(np.float32) for t in logprobs],
                   "elementwise_loss": [loss.detach().numpy().astype(np.float32) for loss in losses]}
        return outputs, metrics

    def optim_step(self, adam: AdamStep) -> dict[str, float]:
        """AdamW with this call's hyperparameters on the accumulated gradients, then the gradients cleared.
        ``grad_norm`` is the global norm before clipping (clipped to ``grad_clip_norm`` when > 0)."""
        params = [p for _, p in self.trainable]
        grads = [p.grad for p in params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))) \
            if grads else 0.0
        if adam.grad_clip_norm > 0 and grads:
            torch.nn.utils.clip_grad_norm_(params, adam.grad_clip_norm)
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        accumulated, self.pending = self.pending, 0
        return {"grad_norm": norm, "learning_rate": adam.learning_rate, "step": float(self.step),
                "accumulated_calls": float(accumulated)}

    # ----------------------------------------------------------------------------------------- state
    def save_state(self, folder: Path, metadata: dict) -> None:
        """Weights that train, the optimizer's state and the step into ``folder`` (written to a temporary folder,
        then renamed: a checkpoint is there whole or not at all)."""
        from safetensors.torch import save_file

        with _written_whole(folder) as tmp:
            save_file({name: p.detach().contiguous() for name, p in self.trainable}, str(tmp / WEIGHTS_FILE))
            torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
            record = {"spec": asdict(self.spec), "step": self.step, **metadata}
            (tmp / STATE_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))

    def load_state(self, folder: Path, with_optimizer: bool) -> None:
        """Weights (and with ``with_optimizer`` the AdamW moments and the step) from ``save_state``'s folder. The
        checkpoint must be of this model's kind (same base, same LoRA rank and targets)."""
        from safetensors.torch import load_file

        record = read_state(folder)
        spec = TraineeSpec(**record["spec"])
        if (spec.lora_rank, spec.lora_targets) != (self.spec.lora_rank, self.spec.lora_targets):
            raise TinkerRequestError(f"{folder.name}: a checkpoint of LoRA rank {spec.lora_rank} on "
                                     f"{list(spec.lora_targets)}, this model has rank {self.spec.lora_rank} on "
                                     f"{list(self.spec.lora_targets)}", field="path")
        tensors = load_file(str(folder / WEIGHTS_FILE))
        names = [name for name, _ in self.trainable]
        if sorted(tensors) != sorted(names):
            raise TinkerRequestError(f"{folder.name}: its weights are not this model's trainable weights",
                                     field="path")
        with torch.no_grad():
            for name, p in self.trainable:
                p.copy_(tensors[name])
        self.optimizer.zero_grad(set_to_none=True)
        self.pending = 0
        if with_optimizer:
            self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE, weights_only=True))
            self.step = int(record["step"])
        else:
            self.optimizer = self._fresh_optimizer()
            self.step = 0

    def export_for_sampler(self, folder: Path) -> None:
        """What a sampler loads: the peft adapter (LoRA), or the whole model in HF format; written to a temporary
        folder and renamed."""
        with _written_whole(folder) as tmp:
            self.model.save_pretrained(str(tmp))  # peft: the adapter alone; transformers: safetensors weights
            (tmp / "README.md").unlink(missing_ok=True)  # peft's model card


def read_state(folder: Path) -> dict:
    path = folder / STATE_FILE
    if not path.is_file():
        raise TinkerRequestError(f"{folder}: no checkpoint there ({STATE_FILE} missing)", field="path")
    return json.loads(path.read_text())


@contextmanager
def _written_whole(folder: Path) -> Iterator[Path]:
    """A folder written under a temporary name, its files synced, then renamed into place (replacing an older one
    of the name): a reader finds it whole or not at all."""
    tmp = folder.with_name(folder.name + PARTIAL)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    for entry in tmp.iterdir():
        if entry.is_file():
            with open(entry, "rb") as fh:
                os.fsync(fh.fileno())
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
