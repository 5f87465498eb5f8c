"""Prompt order, tokenisation limits, and the score stage's bookkeeping (no engines)."""
from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
import torch

from grpo_core.config import build_config
from grpo_core.data.readers import DataError, PromptSet
from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer
from grpo_core.algo import DynamicBatch
from grpo_core.pipeline.scoring import add_advantages, group_rewards, group_success
from tasks.score import assemble_groups


class CharTokenizer:
    """A deterministic stand-in for the chat template + tokenizer: one id per character."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    def encode(self, text, add_special_tokens):
        return [ord(c) for c in text]


def _prompts(n):
    rows = [{"prompt_id": i, "messages": [{"role": "user", "content": f"q{i}"}], "gt_answer": str(i)}
            for i in range(n)]
    return PromptSet(rows=rows, skipped=[], source="mem.jsonl")


def test_prompt_order_is_a_pure_function_of_seed_and_iteration():
    enc = PromptTokenizer(CharTokenizer(), "boxed", "", 64)
    a = PromptStream(_prompts(10), enc, batch_size=4, seed=3)
    b = PromptStream(_prompts(10), enc, batch_size=4, seed=3)
    assert [p["prompt_id"] for p in a.batch(7)] == [p["prompt_id"] for p in b.batch(7)]
    # consecutive iterations walk through an epoch permutation: the first 10 draws cover every prompt once
    first_epoch = [p["prompt_id"] for it in range(3) for p in a.batch(it)][:10]
    assert sorted(first_epoch) == list(range(10))
    other_seed = PromptStream(_prompts(10), enc, batch_size=4, seed=4)
    assert [p["prompt_id"] for p in other_seed.batch(0)] != [p["prompt_id"] for p in a.batch(0)]


def test_encoded_prompt_carries_dataset_columns_and_template():
    enc = PromptTokenizer(CharTokenizer(), "boxed", "SYS", 64)
    p = enc.encode({"prompt_id": 2, "messages": [{"role": "user", "content": "hi"}], "gt_answer": "5",
                    "level": 3}, "mem.jsonl")
    assert p["columns"]["gt_answer"] == "5" and p["columns"]["level"] == 3
    assert p["columns"]["messages"] == [{"role": "user", "content": "hi"}]  # the dataset's, for model rewards
    assert p["columns"]["prompt_text"] == "<system>SYS<user>hi<assistant>"
    assert p["prompt_token_ids"] == [ord(c) for c in p["columns"]["prompt_text"]]


def test_too_long_prompt_names_file_row_and_field():
    prompts = _prompts(6)
    prompts.rows[4]["messages"][0]["content"] = "a much longer question"
    enc = PromptTokenizer(CharTokenizer(), "boxed", "", 24)
    with pytest.raises(DataError, match=r"mem.jsonl: row 4: field 'messages': the prompt has 39 tokens, more than "
                                        r"data.max_prompt_tokens=24"):
        PromptStream(prompts, enc, batch_size=6, seed=0, shuffle=False).batch(0)


def _scored_table(rewards, acc=None, truncated=None):
    n = len(rewards)
    cols = {"reward": pa.array(rewards, pa.float64()),
            "reward_accuracy": pa.array(acc if acc is not None else rewards, pa.float64()),
            "response_length": pa.array([4] * n, pa.int32()),
            "truncated": pa.array(truncated or [False] * n, pa.bool_())}
    return pa.table(cols)


def test_unscored_rows_leave_the_group_baseline_alone_and_are_not_kept():
    table = _scored_table([1.0, 0.0, None, 1.0])
    rewards, scored = group_rewards(table, 4)
    assert rewards.tolist() == [[1.0, 0.0, 2 / 3, 1.0]]
    assert scored.tolist() == [[True, True, False, True]]
    cfg = build_config({"model": {"path": "m"}, "data": {"train_path": "t"},
                        "rollout": {"prompts_per_iteration": 1, "samples_per_prompt": 4}})
    out, metrics = add_advantages(table, cfg)
    assert out.column("kept").to_pylist() == [True, True, False, True]
    adv = torch.tensor(out.column("advantage").to_pylist())
    assert abs(float(adv.mean())) < 1e-6 and adv[0] > 0 > adv[1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e308])
def test_a_group_whose_reward_is_not_finite_or_overflows_is_left_out_whole_and_counted(bad):
    """Issue 53: four episodes finished with 1e308 (finite) made the group's advantages NaN and killed the run. A
    group holding a NaN, an infinity or a reward whose statistics overflow is left out whole (unscored, advantage
    0, counted in nonfinite_groups); the other groups train as before."""
    cfg = build_config({"model": {"path": "m"}, "data": {"train_path": "t"},
                        "rollout": {"prompts_per_iteration": 2, "samples_per_prompt": 4}})
    good = [1.0, 0.0, 1.0, 0.0]
    out, metrics = add_advantages(_scored_table(good + [bad, bad, bad, 0.0], acc=good + [1.0, 1.0, 1.0, 0.0]), cfg)
    assert out.column("kept").to_pylist() == [True] * 4 + [False] * 4
    adv = out.column("advantage").to_pylist()
    assert all(math.isfinite(a) for a in adv) and adv[4:] == [0.0] * 4
    alone, _ = add_advantages(_scored_table(good), build_config({"model": {"path": "m"}, "data": {"train_path": "t"},
                              "rollout": {"prompts_per_iteration": 1, "samples_per_prompt": 4}}))
    assert adv[:4] == alone.column("advantage").to_pylist()  # the good group as if it were alone
    assert metrics["nonfinite_groups"] == 1.0 and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("bad", [float("nan"), 1e308])
def test_with_a_critic_each_answer_keeps_its_reward_for_the_learner_and_an_unfit_one_is_left_out(bad):
    """PPO (G = 1 here): no group statistics; the learner computes per-token advantages from the shaped reward and
    the critic's values, so the advantage column is 0. A reward the learner's float32 cannot hold is left out as
    an overflowing group is."""
    cfg = build_config({"model": {"path": "m"}, "data": {"train_path": "t"}, "algo": {"preset": "ppo"},
                        "rollout": {"prompts_per_iteration": 4, "samples_per_prompt": 1}})
    out, metrics = add_advantages(_scored_table([1.0, 0.0, bad, 1.0], acc=[1.0, 0.0, 1.0, 1.0]), cfg)
    assert out.column("kept").to_pylist() == [True, True, False, True]
    assert out.column("advantage").to_pylist() == [0.0] * 4
    assert out.column("shaped_reward").to_pylist() == [1.0, 0.0, 0.0, 1.0]
    assert metrics["nonfinite_groups"] == 1.0 and metrics["reward_mean"] == 0.5  # the left-out row as 0


def test_the_learner_leaves_out_rows_whose_inputs_are_not_finite():
    """What reaches the learner with a NaN or an infinity (an advantage, a sampler logprob, a teacher's) is cleared
    from the loss mask and counted, at any depth of per-token lists; absent values are no fault."""
    from grpo_core.engine.train.batch import finite_rows

    nan, inf = float("nan"), float("inf")
    kept, cleared = finite_rows([True, True, True, False, True], [0.5, nan, 0.1, nan, 0.2],
                                [[-0.1, -0.2], [-0.3], [-inf], [-0.1], None], None,
                                [None, None, None, None, [[-0.5, nan]]])
    assert kept == [True, False, False, False, False] and cleared == 3  # row 3 was not kept: not counted


def test_overlong_filter_masks_truncated_rows():
    cfg = build_config({"model": {"path": "m"}, "data": {"train_path": "t"}, "algo": {"overlong_filter": True},
                        "rollout": {"prompts_per_iteration": 1, "samples_per_prompt": 2}})
    out, _ = add_advantages(_scored_table([1.0, 0.0], truncated=[False, True]), cfg)
    assert out.column("kept").to_pylist() == [True, False]


def test_assemble_keeps_exactly_the_mixed_groups_then_masks_filler():
    g = 2
    round1 = _scored_table([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]).append_column("kept", pa.array([True] * 6))
    round2 = _scored_table([0.0, 1.0, 0.0, 0.0]).append_column("kept", pa.array([True] * 4))
    rounds = DynamicBatch(target_groups=3, max_resample_times=1)  # what the batch source decides with
    for r, table in enumerate((round1, round2)):
        success = group_success(table, g).to(torch.float64)
        rounds.add(success, [(r, i) for i in range(success.shape[0])])
    assert rounds.exhausted and rounds.take() == [(0, 0), (1, 0)] and rounds.filtered_frac == 0.6
    batch, metrics = assemble_groups([round1, round2], g, target_groups=3, kept=rounds.take())
    # kept (mixed) groups: round1 group 0, round2 group 0; one all-wrong/right group fills the batch, masked
    assert batch.num_rows == 6
    assert batch.column("reward").to_pylist()[:4] == [1.0, 0.0, 0.0, 1.0]
    assert batch.column("kept").to_pylist() == [True, True, True, True, False, False]
    assert metrics["groups_kept"] == 2 and metrics["groups_masked"] == 1
