"""TRL's side of ``benchmarks/peers.py``: TRL's ``GRPOTrainer`` (HF generate, CPU) on a task of this project.

Runs inside TRL's own venv (``.cache/peers/trl-venv``, made by ``peers.py``), so it imports nothing of the project's
packages except ``grpo_core/rewards/extract.py`` (plain ``re``), loaded by path: the same final-answer extraction
as the project's ``boxed`` accuracy. Everything TRL-specific the comparison needs lands in one JSON file:
per-step wall times (evaluation excluded), the greedy evaluations with the training seconds before each, start-up
and peak RSS.

    <trl-venv>/bin/python benchmarks/peers_trl.py --spec spec.json --out trl.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _extract():
    spec = importlib.util.spec_from_file_location("_grpo_extract", REPO / "grpo_core/rewards/extract.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.last_boxed_content


LAST_BOXED = _extract()


def same_answer(answer: str | None, gold: str) -> bool:
    """The tiny task's answers are integers: equal as numbers (what math-verify decides for them), else as text."""
    if answer is None:
        return False
    a, g = answer.strip(), str(gold).strip()
    try:
        return float(a) == float(g)
    except ValueError:
        return a == g


def read_rows(path: str, system_prompt: str | None, few_shot: list[dict] | None = None) -> list[dict]:
    """The project's jsonl rows (``messages`` a turn or a list of turns, ``gt_answer``) as TRL conversational
    prompts, with the system turn the project adds for the ``boxed`` reward type and the config's worked examples
    (``data.few_shot``) between it and the question, as the project renders them."""
    rows = []
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row["messages"] if isinstance(row["messages"], list) else [row["messages"]]
            turns = [dict(t) for t in turns]
            system = [t for t in turns if t.get("role") == "system"]
            if system_prompt and not system:
                system = [{"role": "system", "content": system_prompt}]
            turns = system + [dict(t) for t in few_shot or ()] + [t for t in turns if t.get("role") != "system"]
            rows.append({"prompt": turns, "answer": str(row["gt_answer"])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    torch.manual_seed(spec["seed"])
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    train_rows = read_rows(spec["train_path"], spec.get("system_prompt"), spec.get("few_shot"))
    eval_rows = read_rows(spec["eval_path"], spec.get("system_prompt"), spec.get("few_shot")) \
        if spec.get("eval_path") else []

    def accuracy(completions, answer, **_):
        return [1.0 if same_answer(LAST_BOXED(c[0]["content"]), g) else 0.0 for c, g in zip(completions, answer)]

    reward_funcs = [accuracy]
    if spec.get("soft_overlong_cache"):
        reward_funcs.append(get_soft_overlong_punishment(spec["max_new_tokens"], spec["soft_overlong_cache"]))
    config = GRPOConfig(
        output_dir=spec["output_dir"], seed=spec["seed"], use_cpu=True, bf16=False, fp16=False,
        max_steps=spec["steps"], learning_rate=spec["lr"], lr_scheduler_type=spec["lr_schedule"], warmup_steps=0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=spec["grad_clip"],
        per_device_train_batch_size=spec["micro_batch"], gradient_accumulation_steps=spec["grad_accum"],
        num_generations=spec["samples"], max_completion_length=spec["max_new_tokens"], temperature=1.0,
        top_p=1.0, top_k=0, beta=0.0, epsilon=spec["clip"], loss_type=spec["loss_type"], scale_rewards="group",
        num_iterations=1, logging_steps=1, save_strategy="no", report_to="none", dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False)

    state = {"steps": [], "evals": [], "eval_seconds": 0.0, "last": None}

    def evaluate(step: int) -> None:
        if not eval_rows:
            return
        started = time.perf_counter()
        was_training = model.training
        model.eval()
        tokenizer.padding_side = "left"
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                 for r in eval_rows]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=spec["max_new_tokens"], do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        correct = sum(same_answer(LAST_BOXED(t), r["answer"]) for t, r in zip(replies, eval_rows))
        if was_training:
            model.train()
        seconds = time.perf_counter() - started
        state["eval_seconds"] += seconds
        train_s = sum(s["seconds"] for s in state["steps"])
        state["evals"].append({"step": step, "accuracy": correct / len(eval_rows), "train_seconds": train_s,
                               "eval_seconds": seconds})
        print(f"[trl] step {step}: greedy eval {correct}/{len(eval_rows)} after {train_s:.1f}s of training",
              flush=True)

    class Timer(TrainerCallback):
        def on_train_begin(self, args_, st, control, **kw):
            evaluate(0)
            state["last"] = time.perf_counter()

        def on_step_end(self, args_, st, control, **kw):
            now = time.perf_counter()
            state["steps"].append({"step": st.global_step, "seconds": now - state["last"]})
            if spec.get("eval_interval") and st.global_step % spec["eval_interval"] == 0:
                evaluate(st.global_step)
            state["last"] = time.perf_counter()  # evaluation is not training time

    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs, args=config,
                          train_dataset=Dataset.from_list(train_rows), processing_class=tokenizer,
                          callbacks=[Timer()])
    trainer.remove_callback(PrinterCallback)  # one dict per step on stdout: the JSON keeps what counts
    setup_s = time.perf_counter() - t0
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    if spec.get("eval_interval") and spec["steps"] % spec["eval_interval"]:
        evaluate(spec["steps"])
    logs = [h for h in trainer.state.log_history if "reward" in h]
    out = {"trl_version": trl.__version__, "torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "setup_s": setup_s, "train_call_s": total, "steps": state["steps"], "evals": state["evals"],
           "eval_seconds": state["eval_seconds"],
           "reward_first": logs[0]["reward"] if logs else None, "reward_last": logs[-1]["reward"] if logs else None,
           "completion_length_mean": (sum(h.get("completions/mean_length", 0.0) for h in logs) / len(logs))
           if logs else None,
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
