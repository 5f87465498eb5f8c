"""On-policy distillation through a whole flow run on the tiny model: the teacher resolved from another run's final
policy (recorded in teacher.json), started in its own actor, scoring every sampled token at the score stage, and
the learner training on the per-token advantages.

The check that can fail in every part of the path: a student that starts from the teacher's own weights and
prompt gets per-token advantages of about 0 (vLLM's logprobs against the teacher's transformers forward, token by
token), so its policy loss is about 0, where the reward's advantages alone give a loss well away from 0. A teacher
reading a token off by one position, at another temperature or through another prompt would put the reverse KL far
from 0. With the teacher's top K (distill.top_k) the loss is then the top-K term alone, and for a student equal to
its teacher that term is known in closed form: at each token -log(the teacher's mass in its top K), from the scored
columns; the learner's student logprobs at the K ids (its own forward) must give it.
"""
from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from grpo_core.data.schemas import TEACHER_LOGPROBS, TEACHER_TOP_IDS, TEACHER_TOP_LOGPROBS, TOKEN_ADVANTAGE
from tests.conftest import tiny_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_a_student_taught_by_its_own_policy_gets_advantages_of_zero_and_no_step(tiny_model, tmp_path,
                                                                                 prefect_harness):
    from flows.grpo_train import grpo_train

    root = str(tmp_path)
    grpo_train(config=tiny_config(tiny_model, root, run_name="teacher", iterations=1, eval__interval=0,
                                  train__lr=1e-3))
    result = grpo_train(config=tiny_config(
        tiny_model, root, run_name="student", iterations=1, eval__interval=0, model__init_from="teacher",
        # few_shot [] : the teacher renders its own prompt, with the student's system prompt and no example
        distill={"teacher": "teacher", "few_shot": [], "top_k": 2, "top_k_weight": 0.5}, rollout__temperature=0.7))
    run = tmp_path / "student"
    assert json.loads((run / "teacher.json").read_text())["run"] == "teacher"
    assert json.loads((run / "teacher.json").read_text())["folder"] == "final"
    assert json.loads((run / "init_from.json").read_text())["folder"] == "final"
    row = pq.read_table(run / "metrics.parquet").to_pylist()[0]
    scored = pq.read_table(run / "iter-000000/scored.parquet")
    student = scored.column("sampler_logprobs").to_pylist()
    teacher = scored.column(TEACHER_LOGPROBS).to_pylist()
    gaps = [abs(t - s) for ts, ss in zip(teacher, student) for t, s in zip(ts, ss)]
    assert len(gaps) == sum(scored.column("response_length").to_pylist()) > 0
    assert max(gaps) < 1e-3, max(gaps)  # vLLM at temperature 0.7 against the teacher's forward at 0.7
    assert abs(row["reverse_kl"]) < 1e-4 and row["teacher_agreement"] > 0.3
    advantages = [a for r in scored.column(TOKEN_ADVANTAGE).to_pylist() for a in r]
    assert max(map(abs, advantages)) < 1e-3
    # The top K: 2 ids and logprobs per token; for a student equal to its teacher the KL at a token is -log(mass)
    top_ids, top_lps = scored.column(TEACHER_TOP_IDS).to_pylist(), scored.column(TEACHER_TOP_LOGPROBS).to_pylist()
    assert [len(r) for r in top_ids] == [len(r) for r in top_lps] == scored.column("response_length").to_pylist()
    assert {len(k) for r in top_ids for k in r} == {2}
    kls = [[-math.log(sum(math.exp(v) for v in k)) for k in r] for r in top_lps]
    assert row["teacher_top_k_mass"] == pytest.approx(
        sum(math.exp(v) for r in top_lps for k in r for v in k) / len(gaps), rel=1e-5)
    assert row["top_k_kl"] == pytest.approx(sum(map(sum, kls)) / len(gaps), rel=1e-2, abs=1e-3)
    kept = scored.column("kept").to_pylist()  # the loss: 0.5 x the term, per row then over rows (seq_mean_token_mean)
    by_hand = 0.5 * sum(sum(r) / len(r) for r, k in zip(kls, kept) if k) / sum(kept)
    assert row["loss"] == pytest.approx(by_hand, rel=1e-2, abs=1e-4) and by_hand > 1e-3
    assert max(abs(a) for a in scored.column("advantage").to_pylist()) > 0.5  # which are there, for the record
    assert result["iterations"] == 1
