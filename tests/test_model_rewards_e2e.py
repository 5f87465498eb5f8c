"""Model rewards on the real stack: a judge on its own in-process vLLM engine, a remote judge behind `grpo serve`
that stalls mid-score (rows recorded unscored with the reason, then scored again once it answers), and a training
run whose only reward is the built-in reward model in a Ray actor: the policy moves to what the model prefers."""
from __future__ import annotations

import signal
import threading

import pytest

from grpo_core.rewards.models import RewardInput
from grpo_core.rewards.models.verdicts import parse_number
from grpo_core.run.storage import RunStore
from tests.conftest import REPO, tiny_config
from tests.vllm_server import Server

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(900)]

QUESTIONS = [f"What is {a} + {b}?" for a, b in ((3, 4), (12, 7), (40, 1), (25, 9))]


def _rows() -> list[RewardInput]:
    return [RewardInput((("user", q),), "\\boxed{1}", None) for q in QUESTIONS]


def _greedy_chat_answers(judge, conversations: list[list[dict]], max_tokens: int) -> list[str]:
    """The judge model's greedy answers to the conversations rendered with the tokenizer's own chat template, asked
    of its engine as token ids (not through ``LLM.chat``, the judge's path)."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(judge.path)
    prompts = [{"prompt_token_ids": tokenizer.encode(
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True), add_special_tokens=False)}
        for c in conversations]
    outputs = judge.llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    return [out.outputs[0].text for out in outputs]


def _template() -> str:
    """The tiny arithmetic policy as a judge: asked the question itself, its boxed answer is the verdict."""
    return "{question}"


def test_a_vllm_judge_in_process_gives_parsed_verdicts_with_their_text(tiny_model):
    from grpo_core.rewards.models.judge import VLLMJudge

    judge = VLLMJudge(tiny_model, template=_template(), verdict="number", score_range=(0.0, 10000.0), max_tokens=12)
    verdicts = judge.score(_rows())
    # The verdicts are the model's own greedy answers to the chat (whatever text this CPU's build gives), parsed.
    expected = _greedy_chat_answers(judge, [judge.conversation(r) for r in _rows()], max_tokens=12)
    assert [v.raw for v in verdicts] == expected
    assert verdicts == [parse_number(text, (0.0, 10000.0)) for text in expected]
    assert all(v.value is None or 0.0 <= v.value <= 1.0 for v in verdicts), verdicts
    assert [v.raw for v in judge.score(_rows())] == expected  # greedy: the same verdicts again
    yes_no = VLLMJudge.__new__(VLLMJudge)
    yes_no.__dict__.update(judge.__dict__, verdict="yes_no")
    graded = yes_no.score(_rows()[:1])[0]  # P(yes) over the first token's top logprobs, else the text, else None
    assert graded.raw == expected[0]
    assert (graded.value is None) == (graded.error == "judge: the verdict is neither yes nor no")


def test_a_remote_judge_that_stalls_mid_score_leaves_rows_unscored_with_the_reason(tiny_model, tmp_path):
    from grpo_core.rewards.models.judge import RemoteJudge

    server = Server(tiny_model, tmp_path / "judge.log", extra=["--kv-cache-mb", "64"])
    try:
        server.wait_ready()
        judge = RemoteJudge(server.url, template=_template(), verdict="number", score_range=(0.0, 10000.0),
                            max_tokens=12, timeout_s=3.0, retries=1)
        first = judge.score(_rows())
        # the server's greedy answers parsed (whatever text this CPU's build of the model gives)
        assert all(v.raw and v == parse_number(v.raw, (0.0, 10000.0)) for v in first), first
        server.signal(signal.SIGSTOP)
        stalled = judge.score(_rows())
        assert all(v.value is None and v.error.startswith(f"judge server {server.url} did not answer after 2 "
                                                          "attempts: ReadTimeout") for v in stalled), stalled
        # Stalled again, back within the retries: the rows are scored, as before the stall.
        timer = threading.Timer(2.0, server.signal, (signal.SIGCONT,))
        judge.http.timeout = judge.http.timeout.__class__(6.0)
        server.signal(signal.SIGSTOP)
        timer.start()
        assert [v.raw for v in judge.score(_rows())] == [v.raw for v in first]
    finally:
        server.stop()


def test_grpo_with_only_a_reward_model_moves_the_policy_to_what_it_prefers(tiny_model, tmp_path):
    """configs/tiny-rm.yaml, shorter: the reward model (its own Ray actor) is the only reward; the share of even
    answers (a weight-0 plugin) rises, and scored.parquet holds the model's own scores."""
    from grpo_core.lifecycle.model.tiny_rm import TinyRMSpec, build_tiny_rm
    from grpo_core.rewards.models.classifier import ClassifierReward
    from grpo_core.rewards.scorer import reward_input
    from flows.grpo_train import grpo_train

    rm = tmp_path / "reward-model"
    built = build_tiny_rm(rm, policy_path=tiny_model, train_path=REPO / "data/arith/train.jsonl",
                          spec=TinyRMSpec(steps=40), log=lambda _: None)
    assert built["eval_pairwise_accuracy"] > 0.95
    cfg = tiny_config(tiny_model, str(tmp_path), run_name="rm", iterations=8, rollout__prompts_per_iteration=16,
                      rollout__samples_per_prompt=8, eval__interval=0, train__lr=2e-3)
    cfg["reward"] = {"type": "boxed", "num_workers": 1, "weights": [1.0, 0.0, 0.0],
                     "rewards": ["rm", "accuracy", f"{REPO / 'examples/even_answer.py'}:even_answer"],
                     "models": {"rm": {"kind": "classifier", "path": str(rm), "normalize": "sigmoid"}}}
    cfg["cluster"] = {"reward_resources": {"num_cpus": 1, "torch_threads": 1}}
    grpo_train(config=cfg)
    store = RunStore(str(tmp_path), "rm")
    rows = store.read_metrics().to_pylist()
    even = [r["reward_even_answer_mean"] for r in rows]
    assert sum(even[-2:]) / 2 > sum(even[:2]) / 2 + 0.2, even
    assert all(r["reward_rm_mean"] is not None for r in rows)
    table = store.get_table(7, "scored.parquet")
    assert table.column("reward").null_count == 0
    scored = table.slice(0, 16).to_pylist()
    own = ClassifierReward(str(rm), normalize="sigmoid").score(
        [reward_input(r["response_text"], r, "messages", "gt_answer") for r in scored])
    assert [r["reward_rm"] for r in scored] == pytest.approx([v.value for v in own], abs=1e-5)
    assert store.local_path("logs/reward-rm-0.log") is not None

    # Resuming, the score stage of a complete iteration reuses its recorded verdicts: the model is not asked again.
    from grpo_core.config import build_config
    from grpo_core.rewards.models import ModelReward
    from grpo_core.rewards.scorer import Scorer
    from tasks.context import RunContext
    from tasks.score import score

    class NotAgain(ModelReward):
        def score(self, rows):
            raise AssertionError("a resumed score stage asked the reward model again")

    r = cfg["reward"]
    with Scorer(rewards=r["rewards"], weights=r["weights"], num_workers=1, models={"rm": NotAgain()}) as scorer:
        ctx = RunContext(cfg=build_config(cfg), store=store, engines=None, scorer=scorer, train_prompts=None,
                         status=None)
        again = score.fn(ctx, 7, "rollouts.parquet")
    assert again.reused and again.metrics["reward_rm_mean"] == rows[7]["reward_rm_mean"]
