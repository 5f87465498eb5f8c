"""On-policy distillation through a whole flow run on the tiny model: the teacher resolved from another run's final
policy (recorded in teacher.json), started in its own actor, scoring every sampled token at the score stage, and
the learner training on the per-token advantages.

The check that can fail in every part of the path: a student that starts from the teacher's own weights and
prompt gets per-token advantages of about 0 (vLLM's logprobs against the teacher's transformers forward, token by
token), so its loss is about 0, where the reward's advantages alone give a loss well away from 0. A teacher reading
a token off by one position, at another temperature or through another prompt would put the reverse KL far from 0.
"""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from grpo_core.data.schemas import TEACHER_LOGPROBS, TOKEN_ADVANTAGE
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
        distill={"teacher": "teacher", "few_shot": []}, rollout__temperature=0.7))
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
    assert abs(row["loss"]) < 1e-4  # the step trained on the teacher's advantages, not the reward's
    assert max(abs(a) for a in scored.column("advantage").to_pylist()) > 0.5  # which are there, for the record
    assert result["iterations"] == 1
