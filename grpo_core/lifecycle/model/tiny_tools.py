"""The tiny tool-use demo policy (`grpo model tiny-tools`): the tiny Qwen2 warmed up on the product task
(grpo_core/data/tools_task.py) to know the calculator's call format, not when a call pays off.

The warm-up is supervised on whole episodes, tokenised exactly as a multi-turn rollout makes them
(``ChatContinuation`` renders the tool's answer, the ``calculator`` tool computes it). A share ``P_CALL_EPISODE`` of
the episodes call ``<calculator>A * B</calculator>``, read the product and answer ``\\boxed{product}``; the others
answer ``\\boxed{product}`` at once, a target the model cannot compute. Reading the tool's answer back is learnt on
every calling episode, but the call itself is a training target in only a fraction ``P_LEARN_CALL`` of them, so the
first turn's prior is to call in about ``CALL_PRIOR`` of episodes. So the policy knows how to call and how to use
the result, not when: greedy decoding answers without the tool (accuracy ~0), sampling at temperature 1 calls now
and then and those episodes are right. GRPO has to learn one decision, to call, from the rewards of the episodes
that did. (With the call a target in every calling episode and 25% of episodes calling, 400 steps left the answer
after the tool's output a guess, as after a direct answer: accuracy 0 when called.)
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from grpo_core.data import tools_task
from grpo_core.data.readers import DataError, read_prompts
from grpo_core.envs.episode import ChatContinuation
from grpo_core.envs.tool_env import ToolEnv
from grpo_core.envs.tools import Calculator
from grpo_core.lifecycle.model.tiny import (
    TinySpec, _shared_prefix_loss, boxed_int, build_model, build_tokenizer, render_prompt, shared_prefix_batch)

TOOLS_SYSTEM_PROMPT = "Answer in \\boxed{}. To compute, call the calculator: <calculator>expression</calculator>."
P_CALL_EPISODE = 0.6
P_LEARN_CALL = 1 / 6
CALL_PRIOR = P_CALL_EPISODE * P_LEARN_CALL / (1 - P_CALL_EPISODE + P_CALL_EPISODE * P_LEARN_CALL)  # 0.2
TINY_TOOLS_SPEC = TinySpec(max_positions=256, vocab_size=400, clean_steps=800, noisy_steps=0, lr=2e-3,
                           eval_max_new_tokens=24)
CHECK_ROWS = 96
CALL_ACCURACY_WARNING = 0.9


def call_text(user: str) -> str:
    a, b = tools_task.parse_question(user)
    return f"<calculator>{a} * {b}</calculator>"


def answer_text(product: int | str) -> str:
    return f"\\boxed{{{product}}}"


def read_rows(path: str | Path) -> list[tuple[str, int]]:
    """(user prompt, product) per row; errors name the file, row and field."""
    rows = []
    for row in read_prompts(str(path), format="math").rows:
        user = row["messages"][-1]["content"]
        try:
            tools_task.parse_question(user)
            rows.append((user, int(row["gt_answer"])))
        except ValueError as error:
            raise DataError(f"{path}: row {row['prompt_id']}: {error}") from None
    return rows


class EpisodeEncoder:
    """Episodes as token ids with their label masks, tokenised as the rollout does."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = ChatContinuation(tokenizer)
        self.calculator = Calculator()
        self.eos = tokenizer.eos_token_id

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, user: str) -> list[int]:
        return self._ids(render_prompt(user, TOOLS_SYSTEM_PROMPT))

    def observation(self, call: str) -> list[int]:
        expression = call.split(">", 1)[1].rsplit("<", 1)[0]
        return self.chat.render([{"role": "tool", "content": self.calculator.run(expression)}], turn_closed=True)

    def episode(self, user: str, product: int, call: bool, learn_call: bool = True) -> tuple[list[int], list[int]]:
        """(token ids, label mask) of one episode; ``learn_call`` False leaves the call out of the labels."""
        p = self.prompt(user)
        if not call:
            r = self._ids(answer_text(product)) + [self.eos]
            return p + r, [0] * len(p) + [1] * len(r)
        c = self._ids(call_text(user)) + [self.eos]
        o = self.observation(call_text(user))
        r = self._ids(answer_text(product)) + [self.eos]
        return p + c + o + r, [0] * len(p) + [int(learn_call)] * len(c) + [0] * len(o) + [1] * len(r)


def warm_up(model, encoder: EpisodeEncoder, rows: list[tuple[str, int]], spec: TinySpec, seed: int,
            log: Callable[[str], None] = print) -> float:
    """``spec.clean_steps`` supervised steps on episodes (see the module doc); returns the mean loss of the last 20
    steps."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.98))
    steps, warm = spec.clean_steps, max(1, spec.clean_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    model.train()
    losses = []
    for step in range(steps):
        batch = [rows[rng.randrange(len(rows))] for _ in range(spec.batch_size)]
        pairs = []
        for u, p in batch:
            call = rng.random() < P_CALL_EPISODE
            pairs.append(encoder.episode(u, p, call, learn_call=call and rng.random() < P_LEARN_CALL))
        loss = _shared_prefix_loss(model, *shared_prefix_batch([s for s, _ in pairs], [m for _, m in pairs],
                                                               encoder.tokenizer.pad_token_id))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 100 == 0 or step == steps - 1:
            log(f"warm-up step {step}: loss {loss.item():.4f}")
    model.eval()
    return sum(losses[-20:]) / len(losses[-20:])


@torch.no_grad()
def _continue(model, contexts: list[list[int]], *, greedy: bool, max_new_tokens: int, pad_id: int,
              eos_id: int) -> list[list[int]]:
    """HF generate on token-id contexts (left-padded), each continuation up to and including its eos."""
    width = max(map(len, contexts))
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
        ids[i, width - len(c):] = torch.tensor(c)
        mask[i, width - len(c):] = 1
    kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos_id,
                         pad_token_id=pad_id, **kwargs)[:, width:].tolist()
    return [o[: o.index(eos_id) + 1] if eos_id in o else o for o in out]


def episode_accuracy(model, encoder: EpisodeEncoder, rows: list[tuple[str, int]], *, greedy: bool, seed: int,
                     max_new_tokens: int) -> dict[str, float]:
    """Two-turn episodes with HF generate and the real tool environment: accuracy, the share of first turns that
    call the calculator, and the accuracy of the episodes that called (what GRPO can reach by calling always)."""
    torch.manual_seed(seed)
    tok = encoder.tokenizer
    env = ToolEnv([encoder.calculator])
    prompts = [encoder.prompt(u) for u, _ in rows]
    first = _continue(model, prompts, greedy=greedy, max_new_tokens=max_new_tokens, pad_id=tok.pad_token_id,
                      eos_id=encoder.eos)
    finals = [tok.decode(t, skip_special_tokens=True) for t in first]
    steps = [env.step(text) for text in finals]
    called = [i for i, s in enumerate(steps) if s.tool_calls]
    if called:
        contexts = [prompts[i] + first[i] + encoder.chat.render(steps[i].messages, turn_closed=True) for i in called]
        second = _continue(model, contexts, greedy=greedy, max_new_tokens=max_new_tokens, pad_id=tok.pad_token_id,
                           eos_id=encoder.eos)
        for i, t in zip(called, second):
            finals[i] = tok.decode(t, skip_special_tokens=True)
    right = [boxed_int(text) == product for text, (_, product) in zip(finals, rows)]
    return {"accuracy": sum(right) / len(rows), "call_rate": len(called) / len(rows),
            "accuracy_when_called": sum(right[i] for i in called) / len(called) if called else 0.0}


def tokenizer_corpus(rows: list[tuple[str, int]]) -> list[str]:
    corpus = [TOOLS_SYSTEM_PROMPT]
    for user, product in rows:
        corpus += [render_prompt(user, TOOLS_SYSTEM_PROMPT), call_text(user), answer_text(product),
                   f"<|im_start|>tool\n{product}<|im_end|>\n"]
    corpus.extend(str(n) for n in range(0, 1000))
    return corpus


def build_tiny_tools(out_dir: str | Path, *, train_path: str | Path = "data/tools/train.jsonl", seed: int = 0,
                     log: Callable[[str], None] = print, spec: TinySpec = TINY_TOOLS_SPEC,
                     eval_path: str | Path | None = None) -> dict[str, Any]:
    """Build, warm up and save the tool-use demo policy; returns its build metrics (also in build_metrics.json)."""
    from transformers import GenerationConfig

    t0 = time.monotonic()
    torch.manual_seed(seed)
    train_path = Path(train_path)
    eval_path = Path(eval_path) if eval_path is not None else train_path.with_name("eval.jsonl")
    train = read_rows(train_path)
    evals = read_rows(eval_path) if eval_path.exists() else []
    tokenizer = build_tokenizer(tokenizer_corpus(train), spec.vocab_size)
    model = build_model(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
    params = sum(p.numel() for p in model.parameters())
    log(f"tiny Qwen2 (tools): {params / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    encoder = EpisodeEncoder(tokenizer)
    metrics: dict[str, Any] = {"task": "tools", "params": params, "vocab_size": len(tokenizer), "call_prior": CALL_PRIOR,
                               "warmup_loss": warm_up(model, encoder, train, spec, seed, log)}
    for split, rows in (("train", train[:CHECK_ROWS]), ("eval", evals)):
        for mode in ("greedy", "sampled"):
            if rows:
                for k, v in episode_accuracy(model, encoder, rows, greedy=mode == "greedy", seed=seed,
                                             max_new_tokens=spec.eval_max_new_tokens).items():
                    metrics[f"{split}_{mode}_{k}"] = v
    if metrics["train_sampled_accuracy_when_called"] < CALL_ACCURACY_WARNING:
        log(f"WARNING: episodes that call the calculator are right only "
            f"{metrics['train_sampled_accuracy_when_called']:.3f} of the time; GRPO cannot do better than that")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id, do_sample=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics["seconds"] = time.monotonic() - t0
    metrics["spec"] = asdict(spec)
    (out / "build_metrics.json").write_text(json.dumps(metrics, indent=1))
    log(f"tiny tools model saved to {out}: " + ", ".join(f"{k}={v:.3g}" for k, v in metrics.items()
                                                         if isinstance(v, float)))
    return metrics
