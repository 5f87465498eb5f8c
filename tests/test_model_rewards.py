"""Model rewards (reward.models): the classifier's score is the model's own forward, judges' verdicts parse or are
recorded as unscored with the reason, the scorer mixes them with rule rewards, config mistakes name the field."""
from __future__ import annotations

import math

import pytest
import torch

from grpo_core.config import ConfigError, build_config, check_model_folder
from grpo_core.rewards.models import RewardInput
from grpo_core.rewards.models.classifier import ClassifierReward
from grpo_core.rewards.models.verdicts import check_template, judge_prompt, parse_number, parse_yes_no
from grpo_core.rewards.scorer import Scorer, reward_input
from tests.test_config import _tree


@pytest.fixture(scope="module")
def reward_model(tiny_model, tmp_path_factory) -> str:
    """A sequence classifier with a scalar head on the tiny policy's backbone (head at its random init)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("rm")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model, num_labels=1,
                                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _row(question: str, response: str) -> RewardInput:
    return RewardInput((("user", question),), response, None)


def test_the_classifier_score_is_the_models_own_forward_on_the_rendered_chat(reward_model):
    """Batched and right-padded rows of different lengths score as each text alone through the model."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rows = [_row("What is 3 + 4?", "\\boxed{7}"), _row("What is 63 + 2?", "The sum is \\boxed{65} I think"),
            _row("What is 1 + 1?", "")]
    reward = ClassifierReward(reward_model, batch_size=2)
    verdicts = reward.score(rows)
    tok = AutoTokenizer.from_pretrained(reward_model)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model).eval()
    for row, verdict in zip(rows, verdicts):
        text = tok.apply_chat_template(row.chat(), tokenize=False)
        assert text.endswith(f"<|im_start|>assistant\n{row.response}<|im_end|>\n")
        with torch.no_grad():
            own = model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
        assert verdict.error is None and verdict.value == pytest.approx(own, abs=1e-5)
    assert len({v.value for v in verdicts}) == 3
    sig = ClassifierReward(reward_model, normalize="sigmoid").score(rows[:1])[0].value
    assert sig == pytest.approx(1 / (1 + math.exp(-verdicts[0].value)), abs=1e-6)


def test_a_row_longer_than_max_length_is_unscored_with_the_reason_not_cut(reward_model):
    reward = ClassifierReward(reward_model, max_length=24)
    short, long = reward.score([_row("What is 3 + 4?", "7"), _row("What is 3 + 4?", "seven " * 40)])
    assert short.value is not None and short.error is None
    assert long.value is None and "more than max_length=24" in long.error


def test_the_scorer_mixes_model_and_rule_rewards_and_records_why_a_row_is_unscored(reward_model):
    reward = ClassifierReward(reward_model, max_length=40)
    rows = [{"messages": [{"role": "user", "content": "What is 3 + 4?"}], "gt_answer": "7"}] * 3
    completions = ["\\boxed{7}", "\\boxed{8}", "\\boxed{7} " + "x" * 200]
    with Scorer(rewards=["rm", "accuracy"], weights=[0.5, 1.0], num_workers=1, models={"rm": reward}) as scorer:
        results = scorer.score(completions, rows)
    own = reward.score([reward_input(c, r, "messages", "gt_answer") for c, r in zip(completions, rows)])
    for result, verdict, correct in zip(results[:2], own, (1.0, 0.0)):
        assert result.components == {"rm": pytest.approx(verdict.value), "accuracy": correct}
        assert result.reward == pytest.approx(0.5 * verdict.value + correct)
    assert results[2].reward is None and results[2].components["rm"] is None
    assert results[2].error.startswith("rm: reward model:") and "max_length=40" in results[2].error


def test_prompts_reach_model_rewards_as_chat_messages_whatever_the_column_holds():
    as_list = reward_input("r", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
                                 "gt_answer": 3}, "messages", "gt_answer")
    assert as_list.messages == (("system", "s"), ("user", "q")) and as_list.question == "q" and as_list.answer == "3"
    assert reward_input("r", {"p": {"role": "user", "content": "q"}}, "p", "gt_answer").messages == (("user", "q"),)
    assert reward_input("r", {"p": "plain"}, "p", "gt_answer").messages == (("user", "plain"),)
    with pytest.raises(ValueError, match="the row's 'p' column holds int"):
        reward_input("r", {"p": 3}, "p", "gt_answer")


def test_judge_verdicts_parse_or_say_why_not():
    assert parse_number("8", (0, 10)).value == pytest.approx(0.8)
    assert parse_number("Score: 7.5/10", (0, 10)).value == pytest.approx(0.75)
    assert parse_number("\\boxed{57}", (0, 100)).value == pytest.approx(0.57)
    bad = parse_number("excellent answer", (0, 10))
    assert bad.value is None and bad.raw == "excellent answer" and "no number" in bad.error
    assert "outside score_range [0, 10]" in parse_number("11", (0, 10)).error
    assert parse_yes_no("Yes, it is right").value == 1.0 and parse_yes_no(" no.").value == 0.0
    assert parse_yes_no("Yes", {"Yes": math.log(0.6), " No": math.log(0.2), "Maybe": math.log(0.2)}).value == \
        pytest.approx(0.75)
    maybe = parse_yes_no("maybe", {"maybe": 0.0})
    assert maybe.value is None and "neither yes nor no" in maybe.error and maybe.raw == "maybe"


def test_judge_templates_are_checked_when_the_judge_is_built():
    row = RewardInput((("user", "What is 2 + 2?"),), "4", "4")
    assert judge_prompt("Q: {question} A: {response} gold {answer} in [{low:g}, {high:g}]", row, (0, 10)) == \
        "Q: What is 2 + 2? A: 4 gold 4 in [0, 10]"
    with pytest.raises(ValueError, match="judge template: KeyError\\('reply'\\)"):
        check_template("{question} {reply}")


def test_model_reward_config_mistakes_name_the_field(tmp_path, tiny_model, reward_model):
    def cfg(**models):
        return build_config(_tree(model={"path": tiny_model}, data={"max_prompt_tokens": 96},
                                  rollout={"max_new_tokens": 16},
                                  reward={"rewards": ["accuracy", *models], "models": models}))

    with pytest.raises(ConfigError, match="a classifier reward needs path"):
        cfg(rm={"kind": "classifier"})
    with pytest.raises(ConfigError, match="a remote judge needs url"):
        cfg(j={"kind": "remote"})
    with pytest.raises(ConfigError, match=r"reward.models \['rm'\] not used"):
        build_config(_tree(reward={"rewards": ["accuracy"], "models": {"rm": {"kind": "classifier", "path": "x"}}}))
    with pytest.raises(ConfigError, match=r"reward.models.rm.path='.*missing' is not an HF model folder \(does not "
                                          r"exist\)"):
        check_model_folder(cfg(rm={"kind": "classifier", "path": str(tmp_path / "missing")}))
    with pytest.raises(ConfigError, match="reward.models.rm.path=.* is no reward model with a scalar head"):
        check_model_folder(cfg(rm={"kind": "classifier", "path": tiny_model}))
    with pytest.raises(ConfigError, match="holds a Qwen2ForSequenceClassification, not a causal language model"):
        check_model_folder(cfg(j={"kind": "judge", "path": reward_model}))
    check_model_folder(cfg(rm={"kind": "classifier", "path": reward_model}, j={"kind": "judge", "path": tiny_model}))
    with pytest.raises(ValueError, match=r"reward.models \['accuracy'\]: a built-in reward has that name"):
        Scorer(rewards=["accuracy"], num_workers=1, models={"accuracy": ClassifierReward(reward_model)})


def test_grpo_score_takes_a_run_configs_model_rewards_offline(tmp_path, reward_model, capsys):
    """`grpo score --reward-config` loads the reward model in its own process; scores equal the model's own."""
    import json

    import yaml

    from grpo_core.rewards.score_file import run_score
    from tests.test_score_cli import parse, read_jsonl

    rows = [{"messages": [{"role": "user", "content": "What is 3 + 4?"}], "gt_answer": "7", "response": r}
            for r in ("\\boxed{7}", "\\boxed{8}")]
    source, out, config = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "run.yaml"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config.write_text(yaml.safe_dump({"run_name": "x", "reward": {
        "rewards": ["rm", "accuracy"], "weights": [1.0, 2.0],
        "models": {"rm": {"kind": "classifier", "path": reward_model}}}}))
    assert run_score(parse([str(source), "-o", str(out), "--reward-config", str(config), "--workers", "1"])) == 0
    scored = read_jsonl(out)
    own = ClassifierReward(reward_model).score([reward_input(r["response"], r, "messages", "gt_answer")
                                                for r in rows])
    assert [r["reward_rm"] for r in scored] == pytest.approx([v.value for v in own], abs=1e-6)
    assert [r["reward"] for r in scored] == pytest.approx([own[0].value + 2.0, own[1].value], abs=1e-6)
    config.write_text(yaml.safe_dump({"reward": {"rewards": ["rm"], "models": {
        "rm": {"kind": "classifier", "path": str(tmp_path / "nowhere")}}}}))
    assert run_score(parse([str(source), "-o", str(out), "--reward-config", str(config)])) == 2
    assert "reward.models.rm.path=" in capsys.readouterr().err
