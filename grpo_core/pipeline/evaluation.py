"""Named eval sets: reading and tokenising each with its own reward type, scoring its responses for accuracy, and
its metrics (greedy accuracy, unbiased pass@k).

Shared by the flow's evaluate task (responses from the run's samplers) and `grpo eval` (responses from a vLLM engine
of its own), so that an offline evaluation measures exactly what training reported.

Metrics of a set NAME: ``eval/NAME/accuracy`` (greedy accuracy; without greedy, the sampled responses' mean),
``eval/NAME/pass@k`` for each configured k, ``eval/NAME/prompts``, ``eval/NAME/unscored`` (responses the scorer
could not score: they count as wrong, and are listed with their reason in the set's parquet).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch

from grpo_core.algo.pass_at_k import pass_at_k
from grpo_core.config import EvalDatasetConfig, GRPOConfig
from grpo_core.data.files import merged, read_prompt_files
from grpo_core.data.precheck import check_lengths
from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer
from grpo_core.pipeline.scoring import score_table, with_rewards
from grpo_core.rewards.scorer import Scorer

GREEDY, SAMPLED = "greedy", "sampled"


@dataclass
class EvalSet:
    """One named set, read and tokenised: ``prompts`` as the samplers take them, ``skipped`` bad rows."""

    name: str
    spec: EvalDatasetConfig  # defaults resolved (GRPOConfig.eval_sets)
    prompts: list[dict[str, Any]]
    source: str
    skipped: list[tuple[int, str]] = field(default_factory=list)
    questions: dict[int, str] = field(default_factory=dict)  # prompt_id -> its last user turn (what a reader reads)

    @property
    def file_name(self) -> str:
        """Where its scored responses go in an iteration folder (or `grpo eval`'s output folder)."""
        return f"eval-{self.name}.parquet"


def eval_files_key(name: str) -> str:
    """The key of an eval set's files in a run's data_files.json (beside "train")."""
    return f"eval:{name}"


def load_eval_sets(cfg: GRPOConfig, tokenizer, storage_options: dict | None = None,
                   files: dict[str, list[str]] | None = None) -> list[EvalSet]:
    """Every configured eval set (first set first), read with ``data.on_bad_row`` and tokenised with its system
    prompt; errors name the file, the row and the field. ``files``: the files a run recorded for each set's path
    (a folder or glob, ``grpo_core.data.files``); without it a path is read as the one file or folder it names."""
    out = []
    for name, spec in cfg.eval_sets().items():
        paths = (files or {}).get(eval_files_key(name), [spec.path])
        prompts = merged(read_prompt_files(paths, format=spec.format, prompt_key=spec.prompt_key,
                                           answer_key=spec.answer_key, on_bad_row=cfg.data.on_bad_row,
                                           storage_options=storage_options))
        encoder = PromptTokenizer(tokenizer, spec.reward_type, spec.system_prompt, cfg.data.max_prompt_tokens,
                                  [t.model_dump() for t in spec.few_shot or ()])
        prompts = check_lengths(prompts, encoder, cfg.data.max_prompt_tokens, cfg.data.on_bad_row)
        encoded = PromptStream(prompts, encoder, batch_size=1, seed=0, shuffle=False).all(spec.max_prompts)
        out.append(EvalSet(name=name, spec=spec, prompts=encoded, source=spec.path, skipped=list(prompts.skipped),
                           questions={row["prompt_id"]: _last_user_turn(row["messages"]) for row in prompts.rows}))
    return out


def _last_user_turn(messages: list[dict[str, str]]) -> str:
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


class EvalScorers:
    """An accuracy scorer per reward type of the eval sets. The run's own scorer serves its reward type (it is
    already started) unless it asks model rewards (a reward model's score is no accuracy); other types get an
    accuracy-only scorer of their own, started here and closed by ``close``."""

    def __init__(self, cfg: GRPOConfig, sets: list[EvalSet], run_scorer: Scorer | None = None):
        r = cfg.reward
        self._own: dict[str, Scorer] = {}
        self._by_type: dict[str, Scorer] = {}
        for s in sets:
            kind = s.spec.reward_type
            if kind in self._by_type:
                continue
            if run_scorer is not None and kind == r.type and not run_scorer.models:
                self._by_type[kind] = run_scorer
            else:
                sandbox = {"sandbox": r.options["sandbox"]} if "sandbox" in r.options else {}
                scorer = Scorer(reward_type=kind, rewards=["accuracy"], num_workers=r.num_workers,
                                timeout_s=r.timeout_s, options=sandbox)
                self._own[kind] = self._by_type[kind] = scorer
        self._finalizer = weakref.finalize(self, _close_all, list(self._own.values()))

    def for_type(self, reward_type: str) -> Scorer:
        return self._by_type[reward_type]

    def close(self) -> None:
        self._finalizer()


def _close_all(scorers: list[Scorer]) -> None:
    for scorer in scorers:
        scorer.close()


def score_responses(table: pa.Table, scorer: Scorer, mode: str) -> pa.Table:
    """The responses with their rewards, an ``accuracy`` column (the accuracy component when the scorer has one,
    else the reward; an unscored row counts as 0.0) and the ``eval_mode`` (greedy or sampled)."""
    results, _ = score_table(table, scorer)
    scored = with_rewards(table, results)
    column = "reward_accuracy" if "reward_accuracy" in scored.column_names else "reward"
    accuracy = [0.0 if v is None else float(v) for v in scored.column(column).to_pylist()]
    scored = scored.append_column("accuracy", pa.array(accuracy, pa.float64()))
    return scored.append_column("eval_mode", pa.array([mode] * scored.num_rows, pa.string()))


def set_metrics(eval_set: EvalSet, greedy: pa.Table | None, sampled: pa.Table | None) -> dict[str, float]:
    """``eval/<name>/...`` metrics of one set from its scored greedy and sampled responses."""
    prefix, spec = f"eval/{eval_set.name}/", eval_set.spec
    metrics: dict[str, float] = {prefix + "prompts": float(len(eval_set.prompts))}
    unscored = 0
    if greedy is not None:
        metrics[prefix + "accuracy"] = _mean(greedy.column("accuracy").to_pylist())
        unscored += greedy.column("reward").null_count
    if sampled is not None:
        if greedy is None:
            metrics[prefix + "accuracy"] = _mean(sampled.column("accuracy").to_pylist())
        unscored += sampled.column("reward").null_count
        num, correct = per_prompt_counts(sampled)
        for k in spec.ks:
            _, m = pass_at_k(num, correct, k)
            metrics[prefix + f"pass@{k}"] = m[f"pass@{k}"]
    metrics[prefix + "unscored"] = float(unscored)
    return metrics


def per_prompt_counts(sampled: pa.Table) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, c) per prompt: how many responses each prompt has and how many of them are correct (accuracy 1)."""
    counts: dict[int, list[int]] = {}
    for pid, acc in zip(sampled.column("prompt_id").to_pylist(), sampled.column("accuracy").to_pylist()):
        entry = counts.setdefault(int(pid), [0, 0])
        entry[0] += 1
        entry[1] += int(acc >= 1.0)
    values = list(counts.values())
    return torch.tensor([n for n, _ in values]), torch.tensor([c for _, c in values])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
