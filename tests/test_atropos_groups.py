"""Atropos groups as training rows: the split at the policy's first token, the mask, the endpoint's own logprobs and
versions (the ledger), and every refusal with its sequence and field. Pure Python: no engine, no server."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from grpo_core.outside.atropos.groups import MASKED, GroupLimits, GroupRefused, group_rows, policy_spans
from grpo_core.outside.endpoint.ledger import SampledLedger
from grpo_core.pipeline.inbox import validate

LIMITS = GroupLimits(group_size=2, vocab_size=100)
PROMPT = [1, 2, 3]


def _decode(ids: list[int]) -> str:
    return " ".join(map(str, ids))


def _sampled(ledger: SampledLedger, prompt: list[int], answer: list[int], version: int, finish: str = "stop",
             ) -> tuple[list[int], list[int], list[float]]:
    """An answer the endpoint gave, as ManagedServer hands it back: tokens, masks and its inference_logprobs."""
    logprobs = [-0.1 * (i + 1) for i in range(len(answer))]
    ledger.record(prompt, answer, logprobs, finish, version)
    return prompt + answer, [MASKED] * len(prompt) + answer, [1.0] * len(prompt) + logprobs


def _group(ledger: SampledLedger, versions=(3, 4), scores=(1.0, 0.0)) -> dict:
    seqs = [_sampled(ledger, PROMPT, [10 + i, 11 + i, 12], v, "stop" if i == 0 else "length")
            for i, v in enumerate(versions)]
    return {"tokens": [s[0] for s in seqs], "masks": [s[1] for s in seqs], "scores": list(scores),
            "inference_logprobs": [s[2] for s in seqs], "advantages": [], "ref_logprobs": None,
            "overrides": None, "group_overrides": {}, "env_id": 0}


def test_a_single_turn_group_becomes_rows_of_the_sampled_tokens_with_their_versions_and_logprobs():
    ledger = SampledLedger()
    table = group_rows(_group(ledger), LIMITS, ledger, _decode)
    rows = table.to_pylist()
    assert [r["prompt_token_ids"] for r in rows] == [PROMPT, PROMPT]
    assert [r["response_token_ids"] for r in rows] == [[10, 11, 12], [11, 12, 12]]
    assert [r["response_mask"] for r in rows] == [[1, 1, 1], [1, 1, 1]]
    assert rows[0]["sampler_logprobs"] == pytest.approx([-0.1, -0.2, -0.3])
    assert [r["policy_version"] for r in rows] == [3, 4]
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    assert [r["finish_reason"] for r in rows] == ["stop", "length"]
    assert [r["truncated"] for r in rows] == [False, True]
    assert [r["sample_idx"] for r in rows] == [0, 1] and rows[0]["response_text"] == "10 11 12"
    # the inbox takes it as it is (whole group, typed columns, mask of the response's length)
    assert validate(table, "atropos-item", LIMITS.group_size).num_rows == 2


def test_a_multi_turn_sequence_keeps_the_environments_tokens_out_of_the_loss_and_takes_the_oldest_version():
    ledger = SampledLedger()
    first = [10, 11]
    ledger.record(PROMPT, first, [-0.5, -0.6], "stop", 7)
    observation = [50, 51]
    second_prompt = PROMPT + first + observation
    ledger.record(second_prompt, [12, 13], [-0.7, -0.8], "stop", 8)
    tokens = second_prompt + [12, 13]
    mask = [MASKED] * 3 + first + [MASKED, MASKED] + [12, 13]
    assert policy_spans(mask) == [(3, 5), (7, 9)]
    other = _sampled(ledger, PROMPT, [20], 8)
    group = {"tokens": [tokens, other[0]], "masks": [mask, other[1]], "scores": [1, 0]}
    row = group_rows(group, LIMITS, ledger, _decode).to_pylist()[0]
    assert row["response_token_ids"] == [10, 11, 50, 51, 12, 13]
    assert row["response_mask"] == [1, 1, 0, 0, 1, 1]
    assert row["sampler_logprobs"] == pytest.approx([-0.5, -0.6, 0.0, 0.0, -0.7, -0.8])
    assert row["policy_version"] == 7


def _refusal(group: dict, ledger: SampledLedger, limits: GroupLimits = LIMITS) -> GroupRefused:
    with pytest.raises(GroupRefused) as info:
        group_rows(group, limits, ledger, _decode)
    return info.value


@pytest.mark.parametrize("change,sequence,field,words", [
    (lambda g: g["masks"][1].pop(), 1, "masks", "entries for"),
    (lambda g: g["masks"][0].__setitem__(4, 99), 0, "masks", "a mask entry is the token"),
    (lambda g: g["masks"].__setitem__(1, [MASKED] * 6), 1, "masks", "no token as the policy's"),
    (lambda g: g["scores"].__setitem__(0, math.nan), 0, "scores", "not a finite number"),
    (lambda g: g["scores"].__setitem__(1, "1.0"), 1, "scores", "not a finite number"),
    (lambda g: g["scores"].__setitem__(1, True), 1, "scores", "not a finite number"),
    (lambda g: g["tokens"][0].__setitem__(0, 100), 0, "tokens", "outside the policy's vocabulary"),
    (lambda g: g["tokens"][1].__setitem__(0, -5), 1, "tokens", "outside the policy's vocabulary"),
    (lambda g: g["tokens"][0].__setitem__(1, 1.5), 0, "tokens", "list of integers"),
    (lambda g: g["inference_logprobs"][1].__setitem__(4, -3.0), 1, "inference_logprobs", "sampled that token"),
    (lambda g: g.__setitem__("advantages", [[0.5] * 6, [0.5] * 6]), None, "advantages", "not taken"),
    (lambda g: g.__setitem__("scores", [1.0]), None, "scores", "entries for 2 sequences"),
    (lambda g: [g[k].append(g[k][0]) for k in ("tokens", "masks", "scores")], None, "tokens", "groups of 2"),
    (lambda g: g.pop("masks"), None, "masks", "missing"),
])
def test_an_unusable_group_is_refused_naming_the_sequence_and_field(change, sequence, field, words):
    ledger = SampledLedger()
    group = _group(ledger)
    change(group)
    error = _refusal(group, ledger)
    assert (error.sequence, error.field) == (sequence, field)
    assert words in error.reason
    assert error.as_dict() == {"sequence": sequence, "field": field, "error": error.reason}


def test_tokens_the_endpoint_did_not_sample_after_that_prefix_are_refused():
    ledger = SampledLedger()
    group = _group(ledger)
    group["tokens"][1][-1] = 13  # an edited answer
    group["masks"][1][-1] = 13
    assert _refusal(group, ledger).field == "tokens"
    group = _group(ledger)
    group["tokens"][0][0] = 9  # the same answer after another prompt
    error = _refusal(group, ledger)
    assert (error.sequence, error.field) == (0, "tokens") and "not an answer" in error.reason
    group = _group(ledger)
    group["masks"][0][3] = MASKED  # a span that starts inside the sampled answer
    assert _refusal(group, ledger).field == "tokens"


def test_the_ledger_forgets_its_oldest_answers_past_its_bound():
    ledger = SampledLedger(max_entries=2)
    ledger.record([1], [2], [-0.1], "stop", 0)
    ledger.record([1], [3], [-0.1], "stop", 0)
    ledger.record([1], [4], [-0.1], "stop", 1)
    assert len(ledger) == 2
    assert ledger.find([1, 2], 1, 2) is None
    assert ledger.find([1, 4], 1, 2).version == 1
    assert ledger.find([1, 4], 0, 2) is None  # the same tokens, another split: not that answer


def test_overrides_are_kept_as_json_and_a_non_object_group_is_refused():
    ledger = SampledLedger()
    group = _group(ledger)
    group["overrides"] = [{"temperature": 0.5}, {}]
    group["group_overrides"] = {"note": "x"}
    table = group_rows(group, LIMITS, ledger, _decode)
    assert table.column("atropos_overrides").to_pylist() == ['{"temperature": 0.5}', "{}"]
    assert table.column("atropos_group_overrides").to_pylist() == ['{"note": "x"}'] * 2
    assert table.schema.field("response_mask").type == pa.list_(pa.int8())
    assert _refusal([1, 2], ledger).field is None


def test_a_short_outside_batch_is_filled_with_masked_copies_of_its_groups():
    from tasks.score import masked_copies

    ledger = SampledLedger()
    one = group_rows(_group(ledger), LIMITS, ledger, _decode)
    taken = pa.concat_tables([one, one])  # two groups taken, numbered as the inbox numbers them
    taken = taken.set_column(taken.column_names.index("group_id"), "group_id", pa.array([2, 2, 3, 3], pa.int64()))
    taken = taken.append_column("kept", pa.array([True] * 4))
    filler = masked_copies(taken, 3, LIMITS.group_size)
    assert filler.num_rows == 6 and filler.column("kept").to_pylist() == [False] * 6
    assert filler.column("group_id").to_pylist() == [0, 0, 1, 1, 2, 2]
    assert filler.column("response_token_ids").to_pylist()[:2] == taken.column("response_token_ids").to_pylist()[:2]
