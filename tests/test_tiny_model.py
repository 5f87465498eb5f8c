"""The tiny demo policy and its task: one tokenizer for all three loaders, vLLM agreeing with transformers, a policy
that answers in the boxed format, and committed splits that are disjoint and reproducible."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from grpo_core.data import arith
from grpo_core.lifecycle.model import tiny

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "arith"


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> tuple[Path, dict]:
    """The session's tiny model (tests/conftest.py) and the metrics its build recorded."""
    folder = Path(tiny_model)
    return folder, json.loads((folder / "build_metrics.json").read_text())


def _prompts(n_per_split: int = 8) -> list[str]:
    users = []
    for split in arith.SPLITS:
        users += [u for u, _ in tiny.read_questions(DATA / f"{split}.jsonl")[:n_per_split]]
    return [tiny.render_prompt(u) for u in users]


def test_splits_are_disjoint_and_match_committed_files(tmp_path):
    written = arith.write_splits(tmp_path)
    for split, path in written.items():
        assert path.read_text() == (DATA / f"{split}.jsonl").read_text(), f"{split} differs from committed file"
    train = {r["messages"]["content"] for r in arith.make_rows("train")}
    evals = {r["messages"]["content"] for r in arith.make_rows("eval")}
    assert train and 64 <= len(evals) <= 128
    assert not train & evals
    rows = arith.make_rows("eval")
    a, b = arith.parse_question(rows[0]["messages"]["content"])
    assert rows[0]["gt_answer"] == str(a + b)
    assert arith.make_rows("eval", seed=1) != rows


def test_bad_rows_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": {"role": "user", "content": "What is 1 + 2?"}, "gt_answer": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl: row 0: field 'gt_answer' must be an integer"):
        tiny.read_questions(bad)


def test_boxed_int_takes_last_box():
    assert tiny.boxed_int("a \\boxed{3} then \\boxed{ 42 }") == 42
    assert tiny.boxed_int("no box") is None
    assert tiny.boxed_int("\\boxed{x}") is None


def test_three_tokenizers_agree(model_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    folder, _ = model_dir
    hf = AutoTokenizer.from_pretrained(folder)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = _prompts() + [tiny.response_text(27) + tiny.IM_END]
    from vllm.tokenizers import get_tokenizer  # noqa: PLC0415 (heavy import, test only)

    vt = get_tokenizer(str(folder))
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids, text
        assert ids == vt.encode(text, add_special_tokens=False), text
        assert hf.decode(ids) == text
    # the chat template renders exactly what render_prompt writes
    msgs = tiny.chat_messages("What is 23 + 4?")
    assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == tiny.render_prompt(
        "What is 23 + 4?")
    assert hf.eos_token == tiny.IM_END and hf.pad_token == tiny.PAD_TOKEN
    assert hf.convert_ids_to_tokens(hf.encode(tiny.render_prompt("What is 1 + 2?"))[0]) == tiny.IM_START


def test_warm_up_policy_answers_in_format_but_not_yet_correctly(model_dir):
    _reaches_the_bar(*model_dir)


@pytest.mark.e2e
def test_a_build_from_the_recipe_still_reaches_the_bar(tmp_path):
    """The shipped models/tiny is checked above; this builds the policy again from its recipe (`grpo model tiny`,
    about 2 minutes on 2 cores) and holds it to the same bar, not to the same bytes (another CPU kind builds others)."""
    folder = tmp_path / "tiny"
    metrics = tiny.build_tiny(folder, train_path=DATA / "train.jsonl", log=lambda _: None)
    assert json.loads((folder / "build_metrics.json").read_text()) == json.loads(json.dumps(metrics, default=str))
    _reaches_the_bar(folder, metrics)


def _reaches_the_bar(folder: Path, metrics: dict) -> None:
    """The demo's starting point: answers in the boxed format, near misses, rarely right greedy; sampled groups of 8
    hold an exact answer now and then (what GRPO learns from)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert metrics["eval_greedy_parseable"] >= 0.95
    assert metrics["eval_greedy_accuracy"] <= 0.3
    assert metrics["eval_sampled_accuracy"] <= 0.5
    # the exact-answer phase learnt the rule GRPO has to restore (the demo's ceiling)
    assert metrics["clean_train_greedy_accuracy"] >= 0.9
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    # what GRPO learns from: groups of 8 samples (temperature 1) holding an exact answer now and then (0.31 of 48
    # groups on the committed recipe; one sample per prompt, `eval_sampled_accuracy`, is too noisy a count)
    evals = tiny.read_questions(DATA / "eval.jsonl")[:48]
    texts = tiny.generate(model, tok, [u for u, _ in evals for _ in range(8)], greedy=False, max_new_tokens=16)
    hits = [any(tiny.boxed_int(texts[8 * i + j]) == a for j in range(8)) for i, (_, a) in enumerate(evals)]
    assert 0.1 <= sum(hits) / len(hits) <= 0.9
    assert model.config.tie_word_embeddings and model.generation_config.eos_token_id == tok.eos_token_id
    evals = tiny.read_questions(DATA / "eval.jsonl")
    texts = tiny.generate(model, tok, [u for u, _ in evals], greedy=True, max_new_tokens=16)
    assert sum(tiny.boxed_int(t) is not None for t in texts) >= 0.95 * len(evals)
    # greedy answers are near misses: the policy knows the neighbourhood of the answer
    near = [abs(tiny.boxed_int(t) - a) <= 3 for t, (_, a) in zip(texts, evals) if tiny.boxed_int(t) is not None]
    assert sum(near) >= 0.7 * len(near)


def test_build_is_deterministic(model_dir, tmp_path):
    from safetensors.torch import load_file

    folder, _ = model_dir
    # the build checks run too (their retry rounds and noisy chunks at a few steps each), not at their full length
    spec = tiny.TinySpec(clean_steps=3, noisy_steps=2, clean_retry_steps=3, noisy_chunk_steps=2)
    tiny.build_tiny(tmp_path / "a", train_path=DATA / "train.jsonl", spec=spec, log=lambda _: None)
    tiny.build_tiny(tmp_path / "b", train_path=DATA / "train.jsonl", spec=spec, log=lambda _: None)
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (folder / "tokenizer.json").read_text()


def test_vllm_greedy_matches_transformers(model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    folder, _ = model_dir
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    prompts = _prompts(6)
    llm = LLM(model=str(folder), dtype="float32", enforce_eager=True, distributed_executor_backend="uni",
              kv_cache_memory_bytes=64 * 2**20, seed=0)
    outs = llm.generate([{"prompt_token_ids": tok.encode(p, add_special_tokens=False)} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=16))
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
        assert list(out.outputs[0].token_ids) == ref.tolist(), prompt
        assert out.outputs[0].token_ids[-1] == tok.eos_token_id



# A model small enough to build in a second or two; its clean phase is far too short to reach
# CLEAN_ACCURACY_WARNING, so the extra exact-answer rounds always run to their bound.
_CHECKED_SPEC = tiny.TinySpec(hidden_size=64, num_heads=2, num_layers=1, intermediate_size=128, clean_steps=2,
                              noisy_steps=3, batch_size=4, eval_max_new_tokens=4, clean_retry_rounds=2,
                              clean_retry_steps=1, noisy_chunk_steps=1, noisy_extra_chunks=2,
                              near_miss_max_greedy=0.1, near_miss_min_sampled=0.05)


def _scripted_rates(monkeypatch, rates: list[tuple[float, float]]) -> list[int]:
    """Make the near-miss measurement return `rates` (greedy, sampled) in turn, so the test chooses which branch
    the build takes; returns the list the calls are appended to."""
    calls: list[int] = []

    def fake(*_args, **_kwargs):
        greedy, sampled = rates[len(calls)]
        calls.append(len(calls))
        return {"greedy": greedy, "sampled": sampled}

    monkeypatch.setattr(tiny, "near_miss_rates", fake)
    return calls


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_build_checks_adjust_within_their_bounds_and_change_nothing_when_they_pass(tmp_path, monkeypatch):
    """The clean phase's extra rounds stop at `clean_retry_rounds`; a noisy phase whose sampled accuracy is too low
    goes back to the latest chunk boundary inside the band (the weights then equal those of a build that stopped
    there and passed at once); one whose greedy accuracy stays too high runs `noisy_extra_chunks` more chunks and
    no more, and warns."""
    monkeypatch.setattr(tiny, "CLEAN_CHECK_ROWS", 8)  # fewer rows to generate for: the test times the build
    train, no_eval = DATA / "train.jsonl", tmp_path / "no-eval.jsonl"  # the eval split's accuracies: not needed
    logs: list[str] = []
    _scripted_rates(monkeypatch, [(0.0, 0.01), (0.0, 0.02), (0.0, 0.2), (0.0, 0.3)])
    back = tiny.build_tiny(tmp_path / "back", train_path=train, eval_path=no_eval, spec=_CHECKED_SPEC,
                           log=logs.append)
    clean, near = back["checks"]["clean"], back["checks"]["near_miss"]
    assert clean["extra_rounds"] == 2 and len(clean["history"]) == 3 and not clean["passed"]
    assert any(m.startswith("WARNING: the exact-answer phase") for m in logs)
    assert [t["noisy_steps"] for t in near["tried"]] == [3, 2, 1] and near["steps"] == 1 and near["passed"]
    assert back["train_sampled_accuracy"] == 0.2
    assert json.loads((tmp_path / "back" / "build_metrics.json").read_text())["checks"]["near_miss"]["steps"] == 1

    _scripted_rates(monkeypatch, [(0.0, 0.2)])
    one = tiny.build_tiny(tmp_path / "one", train_path=train, eval_path=no_eval, log=lambda _: None,
                          spec=tiny.TinySpec(**{**_CHECKED_SPEC.__dict__, "noisy_steps": 1}))
    assert one["checks"]["near_miss"]["tried"] == [{"noisy_steps": 1, "greedy": 0.0, "sampled": 0.2}]
    wa, wb = _weights(tmp_path / "back"), _weights(tmp_path / "one")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    logs.clear()
    calls = _scripted_rates(monkeypatch, [(0.5, 0.3), (0.4, 0.3), (0.3, 0.3), (0.0, 0.3)])
    forward = tiny.build_tiny(tmp_path / "fwd", train_path=train, eval_path=no_eval, spec=_CHECKED_SPEC,
                             log=logs.append)
    near = forward["checks"]["near_miss"]
    assert len(calls) == 3 and [t["noisy_steps"] for t in near["tried"]] == [3, 4, 5]
    assert near["steps"] == 5 and not near["passed"]
    assert any(m.startswith("WARNING: no policy met the near-miss band") for m in logs)
    wf = _weights(tmp_path / "fwd")
    assert any(not torch.equal(wf[k], wa[k]) for k in wa)
