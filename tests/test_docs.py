"""The docs site: generated references match the code, every config field and metrics column is described, the site
builds offline with MkDocs (--strict) and no link of the built site leads nowhere."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.reference import PAGES, missing_descriptions, stale_pages
from grpo_core.config import GRPOConfig
from grpo_core.engine.precision import LogprobGap
from tasks.metric_columns import COLUMNS, undocumented
from grpo_core.engine.results import TrainStep
from tasks.results import (EvalResult, InboxResult, IterationTimes, RolloutResult, ScoreResult, SyncResult,
                           TrainResult, IterationRecord)
from tests.conftest import REPO

DOCS = REPO / "docs"


def _docs_check():
    spec = importlib.util.spec_from_file_location("docs_check", REPO / "infra" / "docs_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_field_has_a_description():
    assert missing_descriptions(GRPOConfig) == [], "give these fields a Field(description=...)"


def test_the_generated_references_are_current():
    stale = stale_pages(DOCS / "reference")
    assert stale == [], f"docs/reference/{stale} differ from the code: run `make docs` and commit them"


def test_every_column_of_a_full_metrics_row_is_described():
    """A row with every optional part present: multi-turn, the pool, an evaluation with pass@k, model rewards, a
    checked sync on two samplers, a checkpoint."""
    rollout = RolloutResult(name="rollouts", rows=8, reused=False, seconds=1.0, policy_version=3, tokens=40,
                            response_length_mean=5.0, response_length_max=7, truncated_frac=0.0, turns_mean=2.0,
                            tool_calls_mean=1.0, tool_call_frac=0.5, tool_errors=0, episode_truncated_frac=0.0,
                            env_errors=0, pool_active=10, pool_easy=1, pool_hard=2, pool_skipped=3)
    evaluation = EvalResult(accuracy=0.5, set="gsm8k", greedy=True, rows=4, reward_mean=0.5, policy_version=3,
                            seconds=1.0, metrics={"eval/gsm8k/accuracy": 0.5, "eval/gsm8k/prompts": 4.0,
                                                  "eval/code/pass@4": 0.7, "eval/code/unscored": 0.0})
    scored = ScoreResult(name="scored", rows=8, reused=False,
                         metrics={"reward_mean": 0.5, "reward_accuracy_mean": 0.5, "reward_rm_mean": 0.4,
                                  "distinct_frac": 1.0, "kept_frac": 1.0, "filtered_group_frac": 0.0})
    train = TrainResult(TrainStep({"loss": 0.1, "grad_norm": 1.0, "lr": 1e-3, "seconds": 1.0}, policy_version=4),
                        started_at=1.0, ended_at=2.0)
    gap = LogprobGap(max_diff=2e-6, per_sampler={0: 1e-6, 1: 2e-6}, p99_diff=2e-6, mean_diff=1e-6, k3=1e-12,
                     tokens=40)
    sync = SyncResult(seconds=0.1, version=4, transport="inprocess", tensors_checked=12, gap=gap, check_seconds=0.1)
    times = IterationTimes(eval_s=1.0, rollout_s=1.0, train_s=1.0, sync_s=0.1, total_s=4.0, overhead_s=0.1,
                           stamps={"rollout_started_at": 0.0, "rollout_ended_at": 1.0, "score_started_at": 1.0,
                                   "score_ended_at": 1.1}, sync_started_at=2.0, sync_ended_at=2.1)
    row = IterationRecord(3, 0, 2, False, evaluation, [rollout], scored, InboxResult(), (0.0, 0.0), train, sync, times,
                          checkpoint_s=0.1, checkpoint_snapshot_s=0.1).row()  # an iteration with a checkpoint
    assert undocumented(row) == []
    assert "reward_rm_mean" in row and "sync_logprob_max_diff_sampler1" in row and "pool_skipped" in row
    assert row["sync_tensors_checked"] == 12 and row["sync_logprob_k3"] == 1e-12


def test_undocumented_names_what_no_entry_describes():
    assert undocumented(["loss", "reward_judge_mean", "eval/aime/pass@8", "made_up", "eval/a/b/accuracy",
                         "reward_x_meanie"]) == ["made_up", "eval/a/b/accuracy", "reward_x_meanie"]
    assert all(meaning.strip() for meaning in COLUMNS.values())


def test_the_cli_reference_holds_every_commands_help():
    page = (DOCS / "reference" / "cli.md").read_text()
    for command in ("## grpo train", "## grpo data convert", "## grpo model smollm2", "## grpo runs show"):
        assert command in page
    assert "usage: grpo train [-h] --config CONFIG [--set KEY=VALUE]" in page


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    out = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(site)], cwd=REPO, capture_output=True,
                         text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stdout}\n{out.stderr}"
    return site


def test_the_site_builds_with_every_page_and_no_broken_link(built_site):
    pages = {p.relative_to(built_site).as_posix() for p in built_site.rglob("*.html")}
    for name in PAGES:
        assert f"reference/{name.removesuffix('.md')}.html" in pages
    assert {"index.html", "guides/placement.html", "guides/kubernetes.html", "benchmarks.html"} <= pages
    assert _docs_check().broken_links(built_site) == []
    # the Kubernetes page is infra/README.md included at build time, not a copy
    assert "KubeRay" in (built_site / "guides" / "kubernetes.html").read_text()


def test_the_link_check_finds_a_missing_page_a_missing_anchor_and_an_outside_asset(tmp_path):
    (tmp_path / "a.html").write_text('<h2 id="here">x</h2><a href="b.html#nowhere">1</a><a href="c.html">2</a>'
                                     '<a href="#here">3</a><a href="https://example.org/">4</a>'
                                     '<script src="https://cdn.example.org/x.js"></script>')
    (tmp_path / "b.html").write_text('<p id="somewhere">b</p><a href="a.html#here">back</a>')
    broken = _docs_check().broken_links(tmp_path)
    assert broken == ["a.html: b.html#nowhere (no element with id 'nowhere' in b.html)",
                      "a.html: c.html (no such file)",
                      "a.html: https://cdn.example.org/x.js (loads from outside the site)"]
