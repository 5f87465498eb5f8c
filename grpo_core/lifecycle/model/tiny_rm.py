"""The built-in reward model: the tiny policy's backbone with a scalar head, trained on preference pairs.

How reward models are made (InstructGPT, OpenRLHF's and TRL's reward trainers): start from the policy's SFT
weights, put a one-output head on the last token, train on (chosen, rejected) pairs with the Bradley-Terry loss
-log sigmoid(r_chosen - r_rejected). The preference here is one the policy does not have and a verifier would not
give: **even final answers** (an even number near the true sum chosen over an odd one near it). GRPO with this
model as the only reward (``configs/tiny-rm.yaml``, ``make run-rm``) moves the policy to even answers, true or
not: the loop follows the reward model, which is the point of the demo, and the share of even answers is measured
by a rule plugin of weight 0 (``examples/even_answer.py``).

Why not correctness: a reward model that judges a + b = c from the tiny policy's 2-layer backbone did not learn
(Bradley-Terry loss 0.69 -> 0.67 after 600 steps of 32 pairs at lr 1e-3, true sum vs a near miss); parity is
read off one token and is learnt in 25 steps.

A small centring term (``center_coeff``) keeps scores near 0 so that ``normalize: sigmoid`` reads as a probability.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_core.lifecycle.model.tiny import read_questions, response_text
from grpo_core.rewards.models.base import RewardInput
from grpo_core.rewards.models.classifier import scalar_scores


@dataclass(frozen=True)
class TinyRMSpec:
    pairs_per_step: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    center_coeff: float = 0.01
    steps: int = 150
    odd_offsets: tuple[int, ...] = (-3, -1, 1, 3)  # rejected = chosen (even) + one of these
    malformed_frac: float = 0.4  # ... or, this often, a broken form of the chosen response (`malformed`)


def render(tokenizer, user: str, answer: int | str) -> list[int]:
    """The token ids the reward model scores for (question, boxed answer or a response text): what
    ``ClassifierReward`` renders."""
    chat = RewardInput((("user", user),), response_text(answer) if isinstance(answer, int) else answer).chat()
    return tokenizer(tokenizer.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]


def malformed(text: str, rng: random.Random) -> str:
    """A broken form of a well-formed response: a prefix or suffix of it, extra closing braces, the answer twice,
    or nothing. Without these among the rejected the model scored the lone "}" higher than any answer, and GRPO
    found that out in 3 iterations (every response "}")."""
    n = len(text)
    kind = rng.randrange(5)
    if kind == 0:
        return text[:rng.randrange(n)]
    if kind == 1:
        return text[rng.randrange(1, n):]
    if kind == 2:
        return text + "}" * rng.randrange(1, 4)
    if kind == 3:
        return text + text
    return ""


def even_near(answer: int, rng: random.Random) -> int:
    """An even number at most 1 from `answer` (the answer itself when it is even)."""
    return answer if answer % 2 == 0 else answer + rng.choice((-1, 1))


@torch.no_grad()
def pairwise_accuracy(model, tokenizer, questions: list[tuple[str, int]], offsets: tuple[int, ...]) -> dict[str, float]:
    """The share of (even, rejected) pairs near the true answer ranked right, and of responses on the right side of
    0; the rejected are the odd neighbours (`offsets`) and two broken forms of the even answer."""
    model.eval()
    right, total, sided = 0, 0, 0
    rng = random.Random(0)
    for user, answer in questions:
        even = even_near(answer, rng)
        rejected = [even + o for o in offsets] + [malformed(response_text(even), rng) for _ in range(2)]
        seqs = [render(tokenizer, user, even)] + [render(tokenizer, user, r) for r in rejected]
        scores = scalar_scores(model, seqs, tokenizer.pad_token_id)
        right += int((scores[0] > scores[1:]).sum())
        total += len(rejected)
        sided += int(scores[0] > 0) + int((scores[1:] < 0).sum())
    return {"pairwise_accuracy": right / total, "sign_accuracy": sided / (total + len(questions))}


def build_tiny_rm(out_dir: str | Path, *, policy_path: str | Path, train_path: str | Path = "data/arith/train.jsonl",
                  eval_path: str | Path | None = None, seed: int = 0, spec: TinyRMSpec | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train and save the reward model under `out_dir`; its held-out pairwise accuracy is in build_metrics.json."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    spec = spec or TinyRMSpec()
    started = time.monotonic()
    train_path = Path(train_path)
    eval_path = Path(eval_path) if eval_path is not None else train_path.with_name("eval.jsonl")
    train = read_questions(train_path)
    evals = read_questions(eval_path) if eval_path.exists() else []
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(policy_path)
    model = AutoModelForSequenceClassification.from_pretrained(policy_path, num_labels=1,
                                                               pad_token_id=tokenizer.pad_token_id)
    model.float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    losses = []
    for step in range(spec.steps):
        batch = [train[rng.randrange(len(train))] for _ in range(spec.pairs_per_step)]
        evens = [even_near(a, rng) for _, a in batch]
        chosen = [render(tokenizer, u, e) for (u, _), e in zip(batch, evens)]
        rejected = [render(tokenizer, u, malformed(response_text(e), rng) if rng.random() < spec.malformed_frac
                           else e + rng.choice(spec.odd_offsets)) for (u, _), e in zip(batch, evens)]
        scores = scalar_scores(model, chosen + rejected, tokenizer.pad_token_id)
        good, bad = scores[:len(batch)], scores[len(batch):]
        loss = -torch.nn.functional.logsigmoid(good - bad).mean() + spec.center_coeff * (good + bad).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == spec.steps - 1:
            log(f"reward model step {step}: loss {loss.item():.4f}")
    metrics: dict[str, Any] = {"policy": str(policy_path), "params": sum(p.numel() for p in model.parameters()),
                               "final_loss": sum(losses[-20:]) / len(losses[-20:]), "spec": asdict(spec)}
    metrics.update({f"train_{k}": v for k, v in pairwise_accuracy(model, tokenizer, train[:96],
                                                                  spec.odd_offsets).items()})
    if evals:
        metrics.update({f"eval_{k}": v for k, v in pairwise_accuracy(model, tokenizer, evals,
                                                                     spec.odd_offsets).items()})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics["seconds"] = time.monotonic() - started
    (out / "build_metrics.json").write_text(json.dumps(metrics, indent=1))
    log(f"tiny reward model saved to {out}: " + ", ".join(f"{k}={v:.3g}" for k, v in metrics.items()
                                                         if isinstance(v, float)))
    return metrics
