"""Every row's length checked when a run starts, not when a batch draws it: a prompt too long for
data.max_prompt_tokens (sft.max_tokens) is skipped and listed with data.on_bad_row: skip, or refuses the run naming
file, row and field; the pass tokenises only rows its byte bound cannot clear (issue 53)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_core.data.files import merged, read_prompt_files
from grpo_core.data.precheck import check_lengths, scaffold_tokens, token_bound
from grpo_core.data.readers import DataError, read_prompts
from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer

REPO = Path(__file__).resolve().parents[1]
ARITH = REPO / "tests" / "data" / "arith-train-10.jsonl"
HUGE = "What is " + "1 + " * 262_144 + "1?"  # a 1 MB prompt, as the hostile test had
LONG = "What is " + "1 + " * 2_500 + "1?"  # 10 kB: far over the limit, quicker to tokenise
LIMIT = 96  # tests/conftest.py's tiny_config: every arith prompt fits


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _arith_rows() -> list[dict]:
    return [json.loads(line) for line in ARITH.read_text().splitlines()]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _with_long_prompt_at_line_3(path: Path, prompt: str = LONG) -> Path:
    rows = _arith_rows()
    rows.insert(2, {"messages": {"role": "user", "content": prompt}, "gt_answer": "1"})
    return _jsonl(path, rows)


class CountingTokenizer(PromptTokenizer):
    """The run's PromptTokenizer, counting the rows it renders and tokenises."""

    calls = 0

    def encode(self, row, source):
        self.calls += 1
        return super().encode(row, source)


def test_a_huge_prompt_is_skipped_when_the_run_starts_and_listed_by_its_line(tmp_path, tokenizer):
    path = _with_long_prompt_at_line_3(tmp_path / "train.jsonl", HUGE)
    read = read_prompts(str(path), on_bad_row="skip")
    assert len(read.rows) == 11 and read.skipped == []  # its fields are fine: reading alone lets it through
    encoder = PromptTokenizer(tokenizer, "boxed", None, LIMIT)
    checked = check_lengths(read, encoder, LIMIT, "skip")
    assert len(checked.rows) == 10 and all(len(r["messages"][0]["content"]) < 100 for r in checked.rows)
    (line, reason), = checked.skipped
    assert line == 3
    assert reason.startswith("field 'messages': the prompt has ") and reason.endswith(
        f"tokens, more than data.max_prompt_tokens={LIMIT}"), reason
    # every prompt a batch may draw now encodes: nothing left to fail at iteration 3
    stream = PromptStream(checked, encoder, batch_size=4, seed=0)
    assert len(stream.all()) == 10
    assert all(len(p["prompt_token_ids"]) <= LIMIT for it in range(6) for p in stream.batch(it))
    # prompt ids stay those of the file (the skipped row's id is simply absent)
    assert [r["prompt_id"] for r in checked.rows] == [0, 1, 3, 4, 5, 6, 7, 8, 9, 10]


def test_with_on_bad_row_error_the_run_refuses_to_start_naming_file_line_and_field(tmp_path, tokenizer):
    path = _with_long_prompt_at_line_3(tmp_path / "train.jsonl")
    read = read_prompts(str(path), on_bad_row="error")
    with pytest.raises(DataError, match=rf"^{path}: line 3: field 'messages': the prompt has \d+ tokens, more than "
                                        rf"data.max_prompt_tokens={LIMIT}"):
        check_lengths(read, PromptTokenizer(tokenizer, "boxed", None, LIMIT), LIMIT, "error")


def test_a_parquet_row_is_named_by_its_index(tmp_path, tokenizer):
    rows = _arith_rows()[:4]
    rows.insert(2, {"messages": {"role": "user", "content": "x" * 5000}, "gt_answer": "1"})
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    encoder = PromptTokenizer(tokenizer, "boxed", None, LIMIT)
    assert check_lengths(read_prompts(str(path), on_bad_row="skip"), encoder, LIMIT, "skip").skipped[0][0] == 2
    with pytest.raises(DataError, match=rf"{path}: row 2 \(0-based\): field 'messages'"):
        check_lengths(read_prompts(str(path)), encoder, LIMIT, "error")


def test_only_rows_the_byte_bound_cannot_clear_are_tokenised(tmp_path, tokenizer):
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}], "gt_answer": str(2 * i)}
            for i in range(500)]
    rows.insert(250, {"messages": [{"role": "user", "content": LONG}], "gt_answer": "0"})
    encoder = CountingTokenizer(tokenizer, "boxed", None, 512)
    checked = check_lengths(read_prompts(str(_jsonl(tmp_path / "t.jsonl", rows)), on_bad_row="skip"), encoder, 512,
                            "skip")
    assert len(checked.rows) == 500 and [n for n, _ in checked.skipped] == [251]
    assert encoder.calls == 2  # the scaffold of a one-user-turn row, then the huge row: no short row was tokenised


def test_the_byte_bound_holds_for_every_row_the_pass_does_not_tokenise(tokenizer):
    """The bound the pass trusts is never below the tokens the row really has (tiny's byte-level tokenizer, the
    shipped arith data, multi-byte text, several turns, a data system turn, worked examples)."""
    rows = [json.loads(line) for line in (REPO / "data" / "arith" / "train.jsonl").read_text().splitlines()]
    rows = [{"messages": [r["messages"]] if isinstance(r["messages"], dict) else r["messages"]} for r in rows]
    rows += [{"messages": [{"role": "user", "content": text}]} for text in
             ["Wie viel ist 3 + 4? Größe ÄÖÜ", "😀" * 40 + " 1 + 1", "数学问题：三加四等于多少？", " \n\t  spaced   out  ", ""]]
    rows += [{"messages": [{"role": "system", "content": "Add the numbers."}, {"role": "user", "content": "2 + 2?"},
                           {"role": "assistant", "content": "\\boxed{4}"}, {"role": "user", "content": "é + 😀?"}]}]
    few_shot = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "\\boxed{2}"}]
    for encoder in (PromptTokenizer(tokenizer, "boxed", None, 10**6),
                    PromptTokenizer(tokenizer, "think_answer_tags", "", 10**6, few_shot)):
        cache: dict = {}
        for i, row in enumerate(rows):
            row = {**row, "prompt_id": i}
            tokens = len(encoder.encode(row, "mem")["prompt_token_ids"])
            roles = tuple(t["role"] for t in row["messages"])
            assert token_bound(row, scaffold_tokens(roles, "mem", encoder, cache)) >= tokens, row


def test_a_row_at_the_limit_is_kept_and_one_over_it_is_not(tmp_path, tokenizer):
    unbounded = PromptTokenizer(tokenizer, "boxed", None, 10**6)
    sizes = {}
    for k in range(0, 200):
        n = len(unbounded.encode({"prompt_id": 0, "messages": [{"role": "user", "content": "7" * k}]}, "m")
                ["prompt_token_ids"])
        sizes.setdefault(n, k)
    limit = max(n for n in sizes if n + 1 in sizes)
    rows = [{"messages": [{"role": "user", "content": "7" * sizes[limit]}], "gt_answer": "1"},
            {"messages": [{"role": "user", "content": "7" * sizes[limit + 1]}], "gt_answer": "1"}]
    checked = check_lengths(read_prompts(str(_jsonl(tmp_path / "edge.jsonl", rows))),
                            PromptTokenizer(tokenizer, "boxed", None, limit), limit, "skip")
    assert [len(r["messages"][0]["content"]) for r in checked.rows] == [sizes[limit]]
    assert [n for n, _ in checked.skipped] == [2]


def test_several_files_name_the_file_of_each_row(tmp_path, tokenizer):
    first = _jsonl(tmp_path / "a.jsonl", _arith_rows()[:3])
    second = _with_long_prompt_at_line_3(tmp_path / "b.jsonl")
    encoder = PromptTokenizer(tokenizer, "boxed", None, LIMIT)
    parts = [check_lengths(p, encoder, LIMIT, "skip")
             for p in read_prompt_files([str(first), str(second)], on_bad_row="skip")]
    both = merged(parts)
    assert len(both.rows) == 13 and len({r["prompt_id"] for r in both.rows}) == 13
    (line, reason), = both.skipped
    assert line == 3 and reason.startswith(f"{second}: field 'messages'")
    # checked after merging, the row is still named by its own file
    whole = merged(read_prompt_files([str(first), str(second)]))
    with pytest.raises(DataError, match=rf"^{second}: line 3: field 'messages'"):
        check_lengths(whole, encoder, LIMIT, "error")


def test_nothing_left_is_an_error_and_on_bad_row_is_checked(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "t.jsonl", [{"messages": [{"role": "user", "content": LONG}], "gt_answer": "1"}])
    encoder = PromptTokenizer(tokenizer, "boxed", None, LIMIT)
    with pytest.raises(DataError, match=r"no usable rows \(1 bad rows skipped\)"):
        check_lengths(read_prompts(str(path)), encoder, LIMIT, "skip")
    with pytest.raises(ValueError, match="on_bad_row"):
        check_lengths(read_prompts(str(path)), encoder, LIMIT, "ignore")


def test_an_sft_conversation_too_long_for_sft_max_tokens_is_skipped(tmp_path, tiny_model, tokenizer):
    from grpo_core.data.chat import ConversationTokenizer, end_of_turn_ids

    chat = [{"role": "user", "content": "What is 12 + 3?"}, {"role": "assistant", "content": "\\boxed{15}"}]
    long = [chat[0], {"role": "assistant", "content": "12 + 3 = 15. " * 2000 + "\\boxed{15}"}]
    path = _jsonl(tmp_path / "chats.jsonl", [{"messages": chat}, {"messages": long}, {"messages": chat}])
    encoder = ConversationTokenizer(tokenizer, "boxed", None, 256, end_of_turn_ids(tiny_model, tokenizer))
    checked = check_lengths(read_prompts(str(path), format="chat"), encoder, 256, "skip")
    assert len(checked.rows) == 2
    (line, reason), = checked.skipped
    assert line == 2 and "more than sft.max_tokens=256" in reason


def test_grpo_train_builds_its_prompt_stream_without_the_row_and_records_it(tmp_path, tiny_model):
    """The flow's start (the run context, before the first iteration): skip leaves the row out and lists it in
    skipped_rows.json; error refuses the run there, before any engine starts."""
    from contextlib import ExitStack

    from flows.grpo_train import _build_context
    from grpo_core.config import build_config
    from grpo_core.run.status import RunStatus
    from grpo_core.run.storage import RunStore
    from tasks.run_state import RunInputs
    from tests.conftest import tiny_config

    path = _with_long_prompt_at_line_3(tmp_path / "train.jsonl", HUGE)
    inputs = RunInputs(weights_folder=None, weights_from="model.path", data_files={"train": [str(path)]})
    tree = tiny_config(tiny_model, str(tmp_path / "runs"), data__train_path=str(path), data__on_bad_row="skip",
                       eval__interval=0)
    cfg = build_config(tree)
    store = RunStore(cfg.storage.root, cfg.run_name)
    with ExitStack() as resources:  # the scorer and engines the context started, closed as a run closes them
        ctx = _build_context(cfg, store, RunStatus(), inputs, resources)
        assert len(ctx.train_prompts.prompts.rows) == 10
        recorded = json.loads(store.get_bytes("skipped_rows.json"))
        assert [r["row"] for r in recorded[str(path)]] == [3]
        assert "data.max_prompt_tokens=96" in recorded[str(path)][0]["reason"]
    tree["data"]["on_bad_row"] = "error"
    with pytest.raises(DataError, match=rf"{path}: line 3: field 'messages'"), ExitStack() as resources:
        _build_context(build_config(tree), store, RunStatus(), inputs, resources)
