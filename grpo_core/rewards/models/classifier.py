"""A sequence-classification reward model: the scalar its head gives (prompt, response) rendered by its own chat
template, as OpenRLHF's and TRL's reward models are used."""
from __future__ import annotations

import torch

from grpo_core.rewards.models.base import ModelReward, ModelVerdict, RewardInput


def scalar_scores(model, seqs: list[list[int]], pad_id: int) -> torch.Tensor:
    """[B] head outputs of a sequence classifier on token sequences, right-padded into one batch (the head reads
    each row's last non-pad token). Gradients flow when the caller allows them (the reward model's training)."""
    width = max(map(len, seqs))
    ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return model(input_ids=ids, attention_mask=mask).logits[:, 0]


class ClassifierReward(ModelReward):
    """Batches of `batch_size` rows, right-padded; transformers' sequence-classification heads read the last
    non-pad token. A row longer than `max_length` tokens is recorded as unscored (a cut text is another text)."""

    def __init__(self, path: str, *, batch_size: int = 32, max_length: int = 1024, normalize: str = "none",
                 threads: int | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=torch.float32).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(f"{path}: the reward model has {self.model.config.num_labels} outputs, not one scalar")
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"{path}: the reward model's tokenizer has no pad token (needed to batch rows)")
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length, self.normalize = batch_size, max_length, normalize

    def render(self, row: RewardInput) -> str:
        """The text the model scores: its chat template over the prompt and the response, else the two joined."""
        if self.tokenizer.chat_template:
            return self.tokenizer.apply_chat_template(row.chat(), tokenize=False)
        return "\n".join([c for _, c in row.messages] + [row.response])

    def score(self, rows: list[RewardInput]) -> list[ModelVerdict]:
        encoded = [self.tokenizer(self.render(r), add_special_tokens=False)["input_ids"] for r in rows]
        out: list[ModelVerdict | None] = [None] * len(rows)
        fits = []
        for i, ids in enumerate(encoded):
            if len(ids) > self.max_length:
                out[i] = ModelVerdict(None, error=f"reward model: {len(ids)} tokens, more than max_length="
                                                  f"{self.max_length}")
            else:
                fits.append(i)
        for start in range(0, len(fits), self.batch_size):
            chunk = fits[start:start + self.batch_size]
            for i, value in zip(chunk, self._forward([encoded[i] for i in chunk])):
                out[i] = ModelVerdict(value)
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _forward(self, batch: list[list[int]]) -> list[float]:
        scores = scalar_scores(self.model, batch, self.tokenizer.pad_token_id).float()
        if self.normalize == "sigmoid":
            scores = torch.sigmoid(scores)
        return scores.tolist()
