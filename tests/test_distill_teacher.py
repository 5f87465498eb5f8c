"""On-policy distillation's teacher and score stage, in this process on the built tiny model: the teacher's logprobs
against a plain transformers forward (its own context included), the per-token advantage columns against hand
values, a teacher with another tokenizer refused, the learner's batch with per-token advantages, and the config's
and the run folder's rules (teacher resolution, refusals)."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest
import torch

from grpo_core.config import GRPOConfig
from grpo_core.data.prompts import chat_messages
from grpo_core.data.schemas import (
    RESPONSE_MASK, TEACHER_LOGPROBS, TEACHER_TOP_IDS, TEACHER_TOP_LOGPROBS, TOKEN_ADVANTAGE)
from grpo_core.pipeline.distillation import with_teacher_signal
from grpo_core.rewards.teacher import TeacherInput
from grpo_core.rewards.teacher.causal_lm import (
    CausalLMTeacher, TeacherError, check_same_vocabulary, check_teacher_tokenizer)
from grpo_core.engine.train.batch import pack_batch

EXAMPLE = [{"role": "user", "content": "What is 52 + 7?"}, {"role": "assistant", "content": "\\boxed{59}"}]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return tiny_model, AutoTokenizer.from_pretrained(tiny_model), \
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _plain_logprobs(model, prompt: list[int], response: list[int]) -> list[float]:
    """log p(response[t] | prompt, response[:t]) by one unbatched forward, the obvious way."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return [float(logp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(response)]


def _rows(tokenizer):
    """Three responses to one question, then one to another (the teacher scores a prompt's rows together)."""
    rows = []
    questions = (("What is 12 + 3?", ("12 + 3 = 15", "\\boxed{15}", "9")), ("What is 40 + 2?", ("42",)))
    for question, answers in questions:
        prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                                tokenize=False, add_generation_prompt=True),
                                  add_special_tokens=False)
        rows += [TeacherInput(tuple(prompt), (("user", question),), tuple(tokenizer.encode(a, add_special_tokens=False)))
                 for a in answers]
    return rows


def test_the_teacher_scores_each_response_token_as_a_plain_forward_does(tiny):
    path, tokenizer, model = tiny
    rows = _rows(tokenizer)
    teacher = CausalLMTeacher(path, student_path=path, batch_size=2)  # rows of unequal length share a batch
    for row, scores in zip(rows, teacher.score(rows)):
        expected = _plain_logprobs(model, list(row.prompt_token_ids), list(row.response_token_ids))
        assert scores.logprobs == pytest.approx(expected, abs=1e-4)
        assert len(scores.top_ids) == len(row.response_token_ids)
    # with a context of its own: the prompt rendered from the row's messages with the worked example first
    own = CausalLMTeacher(path, student_path=path, context=("boxed", "Be brief.", EXAMPLE))
    chat = chat_messages([{"role": "user", "content": "What is 12 + 3?"}], "boxed", "Be brief.", EXAMPLE)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    assert own.prompt_ids(rows[0]) == prompt and prompt != list(rows[0].prompt_token_ids)
    expected = _plain_logprobs(model, prompt, list(rows[1].response_token_ids))
    assert own.score(rows[1:2])[0].logprobs == pytest.approx(expected, abs=1e-4)


def test_the_teachers_top_k_are_a_plain_forwards_most_likely_tokens(tiny):
    path, tokenizer, model = tiny
    rows = _rows(tokenizer)
    teacher = CausalLMTeacher(path, student_path=path, batch_size=2, temperature=0.7, top_k=4)
    for row, scores in zip(rows, teacher.score(rows)):
        prompt, response = list(row.prompt_token_ids), list(row.response_token_ids)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
        top = torch.log_softmax(logits.float() / 0.7, -1).topk(4, dim=-1)
        assert [list(t) for t in scores.top_k_ids] == top.indices.tolist()
        assert torch.tensor(scores.top_k_logprobs) == pytest.approx(top.values, abs=1e-4)
    assert CausalLMTeacher(path, student_path=None).score(rows[:1])[0].top_k_ids == ()  # not asked: none


def test_a_teacher_with_another_vocabulary_is_refused_naming_both_folders(tiny, tmp_path):
    """A teacher folder whose tokenizer has one token more (a family member with another vocabulary), and one
    whose tokenizer gives two of the policy's tokens each other's ids."""
    import json

    from transformers import AutoTokenizer

    path, tokenizer, _ = tiny
    larger = AutoTokenizer.from_pretrained(path)
    larger.add_tokens(["<|teacher_only|>"], special_tokens=True)
    larger.save_pretrained(tmp_path / "larger")
    n = len(tokenizer.get_vocab())
    with pytest.raises(TeacherError, match=rf"distill.teacher {tmp_path / 'larger'}: its tokenizer differs from the "
                                           rf"policy's \({path}\): {n + 1} tokens against the policy's {n}\. "):
        check_teacher_tokenizer(str(tmp_path / "larger"), path)
    tokenizer.save_pretrained(tmp_path / "swapped")
    spec = json.loads((tmp_path / "swapped" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (tmp_path / "swapped" / "tokenizer.json").write_text(json.dumps(spec))
    first = "a" if vocab["a"] > vocab["b"] else "b"  # the policy's lower id of the two is named
    with pytest.raises(TeacherError, match=rf"token '{first}' is id {vocab[first]} there and "):
        check_teacher_tokenizer(str(tmp_path / "swapped"), path)
    check_same_vocabulary(AutoTokenizer.from_pretrained(path), tokenizer, path, path)  # the same: no error


class _FixedTeacher:
    """A teacher whose answers are given: the score stage's arithmetic checked by hand."""

    def __init__(self, logprobs, top, top_k=None):
        self.logprobs, self.top, self.top_k = logprobs, top, top_k

    def score(self, rows):
        from grpo_core.rewards.teacher import TeacherScores

        top_k = self.top_k or [((), ())] * len(self.logprobs)
        return [TeacherScores(tuple(lp), tuple(t), tuple(map(tuple, ids)), tuple(map(tuple, lps)))
                for lp, t, (ids, lps) in zip(self.logprobs, self.top, top_k)]


def test_the_score_stage_writes_the_teacher_logprobs_and_per_token_advantages():
    table = pa.table({
        "prompt_token_ids": [[1, 2], [1, 2]], "response_token_ids": [[5, 6, 7], [8, 9]],
        "sampler_logprobs": [[-1.0, -2.0, -0.5], [-0.25, -3.0]], "advantage": [1.0, -1.0],
        RESPONSE_MASK: [[1, 1, 1], [1, 0]],  # the second row's last token an environment's
        "messages": [[{"role": "user", "content": "q"}]] * 2})
    teacher = _FixedTeacher([[-0.5, -2.5, -0.5], [-1.25, -9.0]], [[5, 0, 7], [0, 9]])
    out, metrics = with_teacher_signal(table, teacher, reward_weight=0.5)
    assert out.column(TEACHER_LOGPROBS).to_pylist() == [[-0.5, -2.5, -0.5], [-1.25, -9.0]]
    # teacher - student, plus 0.5 x the reward's advantage, on the policy's tokens only
    assert out.column(TOKEN_ADVANTAGE).to_pylist() == [[1.0, 0.0, 0.5], [-1.5, 0.0]]
    assert metrics["reverse_kl"] == pytest.approx((-0.5 + 0.5 + 0.0 + 1.0) / 4)
    assert metrics["teacher_agreement"] == pytest.approx(2 / 4)  # tokens 5 and 7 of row 0
    assert metrics["teacher_logprob_mean"] == pytest.approx((-0.5 - 2.5 - 0.5 - 1.25) / 4)
    assert out.column("advantage").to_pylist() == [1.0, -1.0]  # the reward's, kept for the record
    short = _FixedTeacher([[-0.5, -2.5], [-1.25, -9.0]], [[5, 0], [0, 9]])
    with pytest.raises(RuntimeError, match="row 0: the teacher gave 2 logprobs for 3 response tokens"):
        with_teacher_signal(table, short)
    assert TEACHER_TOP_IDS not in out.column_names and "teacher_top_k_mass" not in metrics

    # with its top 2 at every position: two more columns, and the mass they hold at the policy's tokens
    ids = [[[5, 1], [0, 6], [7, 2]], [[0, 8], [9, 3]]]
    lps = [[[-0.5, -1.0], [-0.25, -2.5], [-0.5, -1.5]], [[-0.5, -1.25], [-0.0625, -9.0]]]
    out, metrics = with_teacher_signal(table, _FixedTeacher(teacher.logprobs, teacher.top, list(zip(ids, lps))),
                                       reward_weight=0.5)
    assert out.column(TEACHER_TOP_IDS).to_pylist() == ids and out.column(TEACHER_TOP_LOGPROBS).to_pylist() == lps
    assert out.column(TOKEN_ADVANTAGE).to_pylist() == [[1.0, 0.0, 0.5], [-1.5, 0.0]]  # as without
    mass = [math.exp(a) + math.exp(b) for a, b in lps[0] + lps[1][:1]]  # row 1's last token is the environment's
    assert metrics["teacher_top_k_mass"] == pytest.approx(sum(mass) / 4)
    ragged = _FixedTeacher(teacher.logprobs, teacher.top, [(ids[0], lps[0]), (ids[1][:1], lps[1][:1])])
    with pytest.raises(RuntimeError, match="row 1: the teacher gave 1 top-k id lists and 1 logprob lists for 2"):
        with_teacher_signal(table, ragged)


def test_per_token_advantages_pack_in_shifted_space_beside_the_logprobs():
    batch = pack_batch([[1, 2], [3]], [[4, 5], [6, 7, 8]], [[-1.0, -2.0], [-3.0, -4.0, -5.0]], [0.0, 0.0],
                       [True, True], pad_id=0, token_advantages=[[0.5, -0.5], [1.0, 2.0, 3.0]])
    assert batch.advantages.shape == batch.response_mask.shape == (2, 3)
    assert batch.advantages.tolist() == [[0.0, 0.5, -0.5], [1.0, 2.0, 3.0]]
    assert torch.equal(batch.advantages != 0, batch.sampler_logprobs != 0)  # the same columns
    assert batch.select(torch.tensor([0])).trimmed().advantages.tolist() == [[0.0, 0.5, -0.5]]
    with pytest.raises(ValueError, match="row 1: 2 token advantages for 3 response tokens"):
        pack_batch([[1], [3]], [[4], [6, 7, 8]], None, [0.0, 0.0], [True, True], pad_id=0,
                   token_advantages=[[0.5], [1.0, 2.0]])


def test_the_teachers_top_k_pack_beside_the_logprobs():
    ids = [[[4, 1], [5, 2]], [[6, 1], [7, 2], [8, 3]]]
    lps = [[[-0.125, -2.0], [-0.25, -3.0]], [[-0.375, -1.0], [-0.5, -1.5], [-0.625, -2.5]]]
    batch = pack_batch([[1, 2], [3]], [[4, 5], [6, 7, 8]], [[-1.0, -2.0], [-3.0, -4.0, -5.0]], [0.0, 0.0],
                       [True, True], pad_id=0, teacher_top=(ids, lps))
    assert batch.teacher_top_ids.shape == batch.teacher_top_logprobs.shape == (2, 3, 2)
    assert batch.teacher_top_ids.tolist() == [[[0, 0], [4, 1], [5, 2]], [[6, 1], [7, 2], [8, 3]]]
    assert torch.equal(batch.teacher_top_logprobs[..., 0] != 0, batch.response_mask != 0)  # the same columns
    first = batch.select(torch.tensor([0])).trimmed()
    assert first.teacher_top_logprobs.tolist() == [[[0.0, 0.0], [-0.125, -2.0], [-0.25, -3.0]]]
    assert pack_batch([[1]], [[4]], None, [0.0], [True], pad_id=0).teacher_top_ids is None
    with pytest.raises(ValueError, match="row 1: 2 teacher top-k id lists for 3 response tokens"):
        pack_batch([[1, 2], [3]], [[4, 5], [6, 7, 8]], None, [0.0, 0.0], [True, True], pad_id=0,
                   teacher_top=([ids[0], ids[1][:2]], lps))
    with pytest.raises(ValueError, match="teacher top-k ids of different lengths"):
        pack_batch([[1, 2], [3]], [[4, 5], [6, 7, 8]], None, [0.0, 0.0], [True, True], pad_id=0,
                   teacher_top=([ids[0], [[6], [7], [8]]], lps))


def test_the_top_k_forward_kl_by_hand():
    from grpo_core.algo.distill import top_k_forward_kl

    teacher = torch.log(torch.tensor([[[0.5, 0.3], [0.6, 0.2]]]))  # [1, 2, 2]: mass 0.8 at each position
    student = torch.log(torch.tensor([[[0.4, 0.4], [0.6, 0.2]]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 0.0]])
    value, metrics = top_k_forward_kl(student, teacher, mask)
    q = [0.5 / 0.8, 0.3 / 0.8]  # renormalised top K of the first position; the second is masked
    by_hand = q[0] * (math.log(q[0]) - math.log(0.4)) + q[1] * (math.log(q[1]) - math.log(0.4))
    assert float(value.detach()) == pytest.approx(by_hand) and metrics["top_k_kl"] == pytest.approx(by_hand)
    value.backward()
    assert student.grad[0, 0].tolist() == pytest.approx([-q[0], -q[1]]) and student.grad[0, 1].tolist() == [0, 0]
    same = torch.log(torch.tensor([[[0.625, 0.375]]]))  # the student gives exactly the renormalised mass: 0
    assert float(top_k_forward_kl(same, torch.log(torch.tensor([[[0.5, 0.3]]])), torch.ones(1, 1))[0]) \
        == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(ValueError, match=r"must be \[B, T, K\]"):
        top_k_forward_kl(student[0], teacher[0], mask)


def test_the_config_derives_the_top_k_weight():
    assert GRPOConfig(**_config()).teacher_top_k_weight == 0.0
    assert GRPOConfig(**_config(top_k=8)).teacher_top_k_weight == 1.0
    assert GRPOConfig(**_config(top_k=8, top_k_weight=0.5)).teacher_top_k_weight == 0.5
    assert GRPOConfig(**_config(top_k_weight=0.5)).teacher_top_k_weight == 0.0  # top_k 0: no term
    with pytest.raises(ValueError, match="top_k"):
        GRPOConfig(**_config(top_k=65))


def _config(**distill) -> dict:
    return {"model": {"path": "m"}, "data": {"train_path": "t.jsonl"}, "distill": {"teacher": "m", **distill}}


def test_the_config_refuses_what_cannot_go_with_a_teacher():
    cfg = GRPOConfig(**_config())
    assert cfg.distill.reward_weight == 0.0 and not cfg.distill.own_context
    assert GRPOConfig(**_config(few_shot=EXAMPLE)).distill.own_context
    with pytest.raises(ValueError, match="distill and sft are both set"):
        GRPOConfig(**{**_config(), "sft": {}, "data": {"train_path": "t.jsonl", "format": "chat"}})
    with pytest.raises(ValueError, match="distill is set with algo.kl_in_reward"):
        GRPOConfig(**{**_config(), "algo": {"kl_coeff": 0.1, "kl_in_reward": True}})
    with pytest.raises(ValueError, match="distill.few_shot must be pairs of turns"):
        GRPOConfig(**_config(few_shot=EXAMPLE[:1]))
