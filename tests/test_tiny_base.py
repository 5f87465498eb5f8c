"""The tiny base and its arithmetic family: committed splits that are the generator's and keep the held-out form out of
the warm-up, a shipped base that knows its family and not the held-out form, and (e2e) GRPO teaching it that form."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from grpo_core.data import arith_family
from grpo_core.lifecycle.model import tiny

ROOT = Path(__file__).resolve().parents[1]
FAMILY = ROOT / "data" / "arith-family"
HELD_OUT = ROOT / "data" / "arith-plus"


def test_the_committed_splits_are_the_generators_and_keep_plus_out_of_the_warm_up(tmp_path):
    written = arith_family.write_splits(tmp_path / "family", tmp_path / "plus")
    for group, folder in (("family", FAMILY), ("held_out", HELD_OUT)):
        for split, path in written[group].items():
            assert path.read_text() == (folder / f"{split}.jsonl").read_text(), f"{folder}/{split}.jsonl differs"
    train = tiny.read_questions(FAMILY / "train.jsonl")
    assert not [q for q, _ in train if "plus" in q], "the held-out word is in the warm-up"
    # every warm-up form is there, and every answer is its form's
    templates = {name: re.escape(form.template).replace(r"\{\}", r"(\d+)")
                 for name, form in arith_family.FORMS.items()}
    seen = set()
    for question, answer in train + tiny.read_questions(FAMILY / "eval.jsonl"):
        name = next(n for n, t in templates.items() if re.fullmatch(t, question))
        seen.add(name)
        numbers = map(int, re.fullmatch(templates[name], question).groups())
        assert arith_family.FORMS[name].answer(*numbers) == answer >= 0, question
    assert seen == set(arith_family.WARM_UP_FORMS)
    # eval rows never trained on, except the tables learnt by heart
    train_questions = {q for q, _ in train}
    held_in_train = {q for q, _ in tiny.read_questions(FAMILY / "eval.jsonl") if q in train_questions}
    assert held_in_train and all(" * " in q or " times " in q for q in held_in_train)
    plus_train = {q for q, _ in tiny.read_questions(HELD_OUT / "train.jsonl")}
    plus_eval = {q for q, _ in tiny.read_questions(HELD_OUT / "eval.jsonl")}
    assert len(plus_eval) == arith_family.EVAL_PER_FORM and plus_train and not plus_train & plus_eval
    assert arith_family.family_rows("train", seed=1) != arith_family.family_rows("train")


def test_the_build_command_refuses_a_bad_seed_or_row_naming_it(tmp_path, capsys):
    """`grpo model tiny-base` (and every tiny builder: one parser) before any build starts: a seed outside
    0 <= seed < 2**63 (one above 64 bits ended a build with an overflow inside torch), a seed that is not an integer,
    a train row whose answer is not an integer."""
    from grpo_cli.commands import main as grpo

    for seed in (str(2**64), "-1", "x"):
        with pytest.raises(SystemExit) as refused:
            grpo(["model", "tiny-base", "--out", str(tmp_path / "m"), "--seed", seed])
        assert refused.value.code == 2 and "argument --seed" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": {"role": "user", "content": "What is 1 plus 2?"}, "gt_answer": "x"}) + "\n")
    assert grpo(["model", "tiny-base", "--out", str(tmp_path / "m"), "--train", str(bad)]) == 2
    assert "bad.jsonl: row 0: field 'gt_answer' must be an integer" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_a_base_build_takes_exact_steps_only_and_is_deterministic(tmp_path):
    """The base's recipe path (no noisy phase), at a few steps: two builds are the same bytes, and the tokenizer holds
    the family's words, the held-out one too, as single tokens."""
    from safetensors.torch import load_file

    spec = tiny.TinySpec(clean_steps=3, noisy_steps=0, clean_retry_rounds=0)
    metrics = tiny.build_tiny(tmp_path / "a", spec=spec, task="family", train_path=FAMILY / "train.jsonl",
                              log=lambda _: None)
    tiny.build_tiny(tmp_path / "b", spec=spec, task="family", train_path=FAMILY / "train.jsonl", log=lambda _: None)
    assert "near_miss" not in metrics["checks"] and metrics["checks"]["clean"]["history"]
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert all(len(tok.tokenize(f" {word}")) == 1 for word in arith_family.VOCABULARY)


def test_the_shipped_base_knows_its_family_and_not_the_held_out_form(tiny_base_model):
    """What the docs say models/tiny-base knows: greedy answers right on held-out pairs of its forms, the held-out
    form mostly wrong (what GRPO teaches), and sampled groups of 8 that hold a right answer now and then."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_base_model)
    tok = AutoTokenizer.from_pretrained(tiny_base_model)
    family = tiny.read_questions(FAMILY / "eval.jsonl")
    right = tiny.accuracy(model, tok, family, greedy=True, max_new_tokens=16)["accuracy"]
    assert right >= 0.8, right
    plus = tiny.read_questions(HELD_OUT / "eval.jsonl")
    assert tiny.accuracy(model, tok, plus, greedy=True, max_new_tokens=16)["accuracy"] <= 0.2
    texts = tiny.generate(model, tok, [q for q, _ in plus for _ in range(8)], greedy=False, max_new_tokens=16)
    hits = [any(tiny.boxed_int(texts[8 * i + j]) == a for j in range(8)) for i, (_, a) in enumerate(plus)]
    assert 0.05 <= sum(hits) / len(hits) <= 0.8


@pytest.mark.e2e
def test_grpo_teaches_the_base_the_held_out_form(tiny_base_model, tmp_path, prefect_harness):
    """configs/tiny-base.yaml (`make run-base`), 15 of its 60 iterations: held-out greedy accuracy on `What is a plus
    b?` rises from what the base starts at (<= 0.2) by at least 0.2."""
    from flows.grpo_train import grpo_train
    from grpo_core.run.storage import RunStore

    cfg = yaml.safe_load((ROOT / "configs" / "tiny-base.yaml").read_text())
    cfg.update(run_name="base", iterations=15)
    cfg["model"]["path"] = tiny_base_model
    cfg["data"].update(train_path=str(HELD_OUT / "train.jsonl"), eval_path=str(HELD_OUT / "eval.jsonl"))
    cfg["storage"]["root"] = str(tmp_path)
    cfg["reward"]["num_workers"] = 1
    grpo_train(config=cfg)
    evals = [r["eval_accuracy"] for r in RunStore(str(tmp_path), "base").read_metrics().to_pylist()
             if r["eval_accuracy"] is not None]
    assert evals[0] <= 0.2 and max(evals[1:]) >= evals[0] + 0.2, evals
    assert json.loads((Path(tiny_base_model) / "build_metrics.json").read_text())["task"] == "family"
