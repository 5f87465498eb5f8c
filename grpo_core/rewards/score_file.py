"""``grpo score``: score a file of responses offline with the same Scorer the training flow uses.

INPUT is jsonl or parquet with a response column; OUTPUT (jsonl or parquet, by extension) keeps every input row and
column in order and adds ``reward``, one ``reward_<name>`` column per reward component (and ``reward_<name>_raw``,
a judge's text), and ``reward_error``. ``--reward-config`` takes a run config's reward section, model rewards
included (loaded in this process). A row
whose response is missing or not a string is an error naming the file, row and field (``--on-bad-row error``), or
keeps its place unscored with the reason in ``reward_error`` (``--on-bad-row skip``). A jsonl line that is not a
JSON object (not JSON, not UTF-8) is an error too, or with skip is left out of OUTPUT (it has no columns to keep)
and listed, with its line number and reason, on stderr and in ``OUTPUT.skipped.json``: nothing is dropped silently.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from grpo_core.rewards.accuracy import REWARD_TYPES
from grpo_core.rewards.scorer import RewardResult, Scorer


class ScoreInputError(ValueError):
    """The input file or one of its rows cannot be scored; names the file, row and field."""


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``grpo score``."""
    parser.add_argument("input", help="jsonl or parquet file with one response per row")
    parser.add_argument("-o", "--output", required=True, help="output file (.jsonl or .parquet)")
    parser.add_argument("--reward-type", choices=REWARD_TYPES, default="boxed")
    parser.add_argument("--rewards", default="accuracy",
                        help="comma-separated reward names (accuracy,format,cosine,repetition) or module:function")
    parser.add_argument("--reward-weights", default=None, help="comma-separated weights, one per reward (default 1)")
    parser.add_argument("--reward-config", default=None,
                        help="a run config (YAML) whose reward section is used: type, rewards, weights, options and "
                             "model rewards (reward.models: reward models and judges, loaded in this process); "
                             "replaces --reward-type, --rewards and --reward-weights")
    parser.add_argument("--prompt-key", default="messages",
                        help="prompt column (chat messages or a string): what model rewards score with the response")
    parser.add_argument("--answer-key", default="gt_answer", help="column with the gold answer (math)")
    parser.add_argument("--response-key", default="response", help="column with the response to score")
    parser.add_argument("--workers", type=int, default=2, help="scorer worker processes")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per row and reward component")
    parser.add_argument("--on-bad-row", choices=("error", "skip"), default="error")


def run_score(args: argparse.Namespace) -> int:
    """Score ``args.input`` into ``args.output``; prints a one-line summary. Returns 0, or 2 on bad input."""
    try:
        rewards = [name.strip() for name in args.rewards.split(",") if name.strip()]
        weights = _weights(args.reward_weights)
        if "soft_overlong" in rewards:
            raise ScoreInputError("soft_overlong needs token counts, which a response file does not have")
        if not args.output.endswith((".jsonl", ".json", ".parquet")):
            raise ScoreInputError(f"{args.output}: the output must end in .jsonl or .parquet")
        section = _reward_section(args.reward_config) if args.reward_config else None
        records, table, unreadable = _read(args.input, args.on_bad_row)
        responses, rows, problems = _score_inputs(args, records)
        models = _model_rewards(section)
        if section is not None:
            scorer = Scorer(reward_type=section.type, rewards=section.rewards, weights=section.weights,
                            num_workers=args.workers, timeout_s=section.timeout_s, dedupe=section.dedupe,
                            options={"answer_key": args.answer_key, **section.options}, models=models,
                            prompt_key=args.prompt_key)
        else:
            scorer = Scorer(reward_type=args.reward_type, rewards=rewards, weights=weights,
                            num_workers=args.workers, timeout_s=args.timeout, options={"answer_key": args.answer_key})
    except (ScoreInputError, ValueError) as error:  # bad input or a bad reward configuration: say which
        print(f"grpo score: {error}", file=sys.stderr)
        return 2
    with scorer:
        clashes = [name for name in _column_names(scorer.plan.names) if records and name in records[0]]
        if clashes:
            print(f"grpo score: {args.input}: already has columns {clashes}; they would be overwritten",
                  file=sys.stderr)
            return 2
        scorable = [i for i in range(len(records)) if i not in problems]
        scored = scorer.score([responses[i] for i in scorable], [rows[i] for i in scorable])
        names = list(scorer.plan.names)
    for model in models.values():
        model.close()
    results: list[RewardResult] = [RewardResult(None, {name: None for name in names}, problems.get(i))
                                   for i in range(len(records))]
    for index, result in zip(scorable, scored):
        results[index] = result
    columns = _reward_columns(results, names)
    _write(args.output, records, table, columns)
    _list_unreadable(args.input, args.output, unreadable)
    print(_summary(results, len(problems), len(unreadable)))
    return 0


def _list_unreadable(source: str, output: str, unreadable: list[str]) -> None:
    """The lines left out (--on-bad-row skip), on stderr and in ``OUTPUT.skipped.json``."""
    path = f"{output}.skipped.json"
    if not unreadable:
        if os.path.exists(path):
            os.remove(path)  # from an earlier run of the same output: it would describe another input
        return
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({source: unreadable}, handle, indent=1)
    for reason in unreadable:
        print(f"grpo score: {source}: skipped {reason}", file=sys.stderr)
    print(f"grpo score: {len(unreadable)} unreadable line(s) of {source} left out, listed in {path}",
          file=sys.stderr)


def _reward_section(path: str):
    """The ``reward`` section of a run config file (or a file that is only that section), checked."""
    import yaml
    from pydantic import ValidationError

    from grpo_core.config import RewardConfig, check_reward_model_folders

    if not os.path.exists(path):
        raise ScoreInputError(f"--reward-config {path}: no such file")
    with open(path, encoding="utf-8") as handle:
        tree = yaml.safe_load(handle) or {}
    if not isinstance(tree, dict):
        raise ScoreInputError(f"--reward-config {path}: expected a mapping")
    try:
        section = RewardConfig(**tree.get("reward", tree))
    except ValidationError as error:
        raise ScoreInputError(f"--reward-config {path}: {error}") from None
    check_reward_model_folders(section.models)
    return section


def _model_rewards(section) -> dict[str, Any]:
    """The section's model rewards, loaded in this process (no Ray offline)."""
    from grpo_core.rewards.models import make_model_reward

    return {name: make_model_reward(model) for name, model in (section.models if section else {}).items()}


def _weights(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(value) for value in text.split(",")]
    except ValueError as error:
        raise ScoreInputError(f"--reward-weights {text!r}: {error}") from error


def _read(path: str, on_bad_row: str = "error") -> tuple[list[dict[str, Any]], Any, list[str]]:
    """Records of the input, the pyarrow table when it is parquet (to keep its column types on output), and the
    unreadable lines left out (--on-bad-row skip), each as "line N: not valid JSON ..."."""
    if not os.path.exists(path):
        raise ScoreInputError(f"{path}: no such file")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return table.to_pylist(), table, []
    if path.endswith((".jsonl", ".json")):
        records: list[dict[str, Any]] = []
        bad: list[str] = []
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                problem, record = _parse_line(raw)
                if problem is None and record is None:
                    continue  # a blank line
                if problem is not None:
                    if on_bad_row == "error":
                        raise ScoreInputError(f"{path}: line {line_number}: {problem}")
                    bad.append(f"line {line_number}: {problem}")
                    continue
                records.append(record)
        return records, None, bad
    raise ScoreInputError(f"{path}: expected a .jsonl or .parquet file")


def _parse_line(raw: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """(problem, record) of one jsonl line; (None, None) for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return f"not valid UTF-8 (byte {error.start + 1} of the line)", None
    if not line.strip():
        return None, None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not valid JSON ({error.msg} at column {error.colno})", None
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}", None
    return None, record


def _score_inputs(args: argparse.Namespace, records: list[dict[str, Any]]
                  ) -> tuple[list[str], list[dict[str, Any]], dict[int, str]]:
    """Responses and scorer rows; ``problems`` maps a row index to why it is not scored (with --on-bad-row skip)."""
    responses: list[str] = []
    rows: list[dict[str, Any]] = []
    problems: dict[int, str] = {}
    for index, record in enumerate(records):
        response = record.get(args.response_key)
        row = dict(record)
        if isinstance(row.get("test_cases"), str):  # parquet files often store test cases as JSON text
            try:
                row["test_cases"] = json.loads(row["test_cases"])
            except json.JSONDecodeError:
                pass  # left as text: accuracy reports the field as malformed
        responses.append(response if isinstance(response, str) else "")
        rows.append(row)
        if not isinstance(response, str):
            reason = (f"field {args.response_key!r} is missing" if response is None
                      else f"field {args.response_key!r} must be a string, got {type(response).__name__}")
            if args.on_bad_row == "error":
                raise ScoreInputError(f"{args.input}: row {index} (0-based, blank lines not counted): {reason}")
            problems[index] = reason
    return responses, rows, problems


def _column_names(names: tuple[str, ...]) -> list[str]:
    return ["reward", *(f"reward_{name}" for name in names), "reward_error"]


def _reward_columns(results: list[RewardResult], names: list[str]) -> dict[str, list[Any]]:
    columns: dict[str, list[Any]] = {"reward": [r.reward for r in results]}
    for name in names:
        columns[f"reward_{name}"] = [r.components.get(name) for r in results]
    for name in dict.fromkeys(name for r in results for name in r.raw):  # judges' verdict texts
        columns[f"reward_{name}_raw"] = [r.raw.get(name) for r in results]
    columns["reward_error"] = [r.error for r in results]
    return columns


def _write(path: str, records: list[dict[str, Any]], table: Any, columns: dict[str, list[Any]]) -> None:
    """Write to a temporary name, then rename: a crash never leaves a half-written output that looks complete."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.partial")
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        base = table if table is not None else pa.Table.from_pylist(records)
        for name, values in columns.items():
            kind = pa.string() if name == "reward_error" or name.endswith("_raw") else pa.float64()
            base = base.append_column(name, pa.array(values, type=kind))
        pq.write_table(base, temporary)
    elif path.endswith((".jsonl", ".json")):
        with open(temporary, "w", encoding="utf-8") as handle:
            for index, record in enumerate(records):
                out = dict(record)
                out.update({name: values[index] for name, values in columns.items()})
                handle.write(json.dumps(out, default=str) + "\n")
    else:
        raise ScoreInputError(f"{path}: the output must end in .jsonl or .parquet")
    os.replace(temporary, path)


def _summary(results: list[RewardResult], bad_rows: int, left_out: int = 0) -> str:
    scored = [r.reward for r in results if r.reward is not None]
    mean = sum(scored) / len(scored) if scored else math.nan
    unscored = len(results) - len(scored)
    notes = sum(1 for r in results if r.reward is not None and r.error is not None)
    return (f"scored {len(results)} rows: mean reward {mean:.4f} over {len(scored)} scored; "
            f"{unscored} unscored (errors, {bad_rows} of them bad input rows); {notes} scored with a note"
            + (f"; {left_out} unreadable line(s) left out" if left_out else ""))
