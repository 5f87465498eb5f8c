"""The grpo-sft flow on the real stack with the tiny model: conversations trained on their assistant turns in the
learner, run folder, checkpoints and evaluation of RL runs; a run extended from its checkpoint ends bit-identical to
one run straight through; the grpo-sft-rl flow runs SFT then RL from its policy as two subflows."""
from __future__ import annotations

from pathlib import Path

import pytest

from grpo_core.config import ConfigError
from grpo_core.data.schemas import RESPONSE_MASK
from grpo_core.run.storage import RunStore
from tests.cli_runs import learning_rows, weights_differing
from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ITERATIONS = 4
LEARNING = ("iteration", "policy_version", "loss", "nll", "grad_norm", "lr", "entropy", "response_length_mean",
            "eval_accuracy")


def sft_config(tiny_model: str, root: Path, run_name: str, iterations: int = ITERATIONS) -> dict:
    cfg = tiny_config(tiny_model, str(root), run_name=run_name, iterations=iterations,
                      data__train_path=str(REPO / "data/arith-sft/train.jsonl"), data__format="chat",
                      data__eval_path=None, sft={"conversations_per_iteration": 8, "max_tokens": 96},
                      rollout__prompts_per_iteration=4,  # not the SFT batch: sft.conversations_per_iteration is
                      eval__interval=2, eval__datasets={"arith": {"path": str(REPO / "data/arith/eval.jsonl"),
                                                                  "max_prompts": 8}},
                      train__lr=1e-3, train__micro_batch_size=4, train__mini_batch_size=4,
                      checkpoint__interval=2)
    del cfg["eval"]["max_prompts"]
    return cfg


@pytest.fixture(scope="module")
def sft_run(tiny_model, tmp_path_factory, prefect_harness):
    from flows.grpo_train import grpo_sft

    root = tmp_path_factory.mktemp("sft")
    result = grpo_sft(config=sft_config(tiny_model, root, "sft"))
    return result, root


def test_sft_trains_on_the_assistant_turns_and_its_loss_falls(sft_run, tiny_model):
    result, root = sft_run
    store = RunStore(str(root), "sft")
    rows = store.read_metrics().to_pylist()
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS + 1))
    trained = rows[:ITERATIONS]
    assert [r["policy_version"] for r in trained] == [0, 2, 4, 6]  # two optimizer steps (mini-batches) each
    assert all(r["reward_mean"] is None and r["nll"] > 0 for r in trained)
    assert trained[-1]["nll"] < trained[0]["nll"] * 0.8, [r["nll"] for r in trained]
    assert [r["eval_accuracy"] is not None for r in rows] == [True, False, True, False, True]
    for r in trained:
        assert r["sync_logprob_max_diff"] < 1e-4  # the sampler serves what the learner trained, every iteration
    batch = store.get_table(1, "scored.parquet")
    assert batch.num_rows == 8 and batch.column("advantage").to_pylist() == [1.0] * 8
    assert batch.column("sampler_logprobs").null_count == 8  # nothing was sampled
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    row = batch.slice(0, 1).to_pylist()[0]
    taught = tokenizer.decode([t for t, m in zip(row["response_token_ids"], row[RESPONSE_MASK]) if m])
    a, b = (int(x) for x in row["messages"][0]["content"][len("What is "):-1].split(" + "))
    assert taught == f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.<|im_end|>"
    assert (root / "sft" / "final" / "model.safetensors").exists()
    assert result["final_eval_accuracy"] == rows[-1]["eval_accuracy"]


# make test: test_sft_trains_on_the_assistant_turns_and_its_loss_falls (the run itself); a run extended from its
# checkpoint: tests/test_resume.py::test_more_iterations_extend_a_finished_run (make test-e2e)
@pytest.mark.long
def test_sft_extended_from_its_checkpoint_is_bit_identical_to_one_run(sft_run, tiny_model, tmp_path,
                                                                      prefect_harness):
    """Two iterations, then the same run raised to four: it resumes from iteration 1's checkpoint, takes the same
    conversations (their order is a function of seed and iteration) and ends as the run of four straight through."""
    from flows.grpo_train import grpo_sft

    _, root = sft_run
    grpo_sft(config=sft_config(tiny_model, tmp_path, "cut", iterations=2))
    resumed = grpo_sft(config=sft_config(tiny_model, tmp_path, "cut"))
    assert resumed["resumed_from"] == "iter-000001"
    assert weights_differing(tmp_path, "cut", root, "sft") == []
    assert learning_rows(tmp_path, "cut", LEARNING) == learning_rows(root, "sft", LEARNING)


def test_each_flow_refuses_the_other_kind_of_config(tiny_model, tmp_path, prefect_harness):
    from flows.grpo_train import grpo_sft, grpo_train

    with pytest.raises(ConfigError, match="run it with `grpo sft`"):
        grpo_train(config=sft_config(tiny_model, tmp_path, "wrong"))
    with pytest.raises(ConfigError, match=r"an RL config \(sft not set\): run it with `grpo train`"):
        grpo_sft(config=tiny_config(tiny_model, str(tmp_path), run_name="wrong-too"))
    state = grpo_sft(config={"run_name": "x"}, return_state=True)  # no model, no data: invalid
    assert state.is_failed() and "model" in str(state.message)

    import asyncio

    from prefect.client.orchestration import get_client

    async def names():
        async with get_client() as client:
            return {r.name for r in await client.read_flow_runs(limit=200)}

    assert "grpo-sft-invalid-config" in asyncio.run(names())  # named after its flow, not grpo-train


@pytest.mark.e2e  # make test: the two flows it runs, in the tests above (and RL's own everywhere)
def test_sft_then_rl_runs_as_two_subflows_and_rl_starts_from_the_sft_policy(tiny_model, tmp_path, prefect_harness):
    import asyncio
    import json

    import yaml
    from prefect.client.orchestration import get_client

    from flows.grpo_sft_rl import grpo_sft_rl

    sft = sft_config(tiny_model, tmp_path, "stage-sft", iterations=1)
    sft["eval"]["interval"] = 0
    rl = tiny_config(tiny_model, str(tmp_path), run_name="stage-rl", iterations=1, eval__interval=0)
    paths = {}
    for name, tree in (("sft", sft), ("rl", rl)):
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(tree))
    result = grpo_sft_rl(sft_config_path=str(paths["sft"]), rl_config_path=str(paths["rl"]))
    assert result["sft"]["run"].endswith("stage-sft") and result["rl"]["run"].endswith("stage-rl")
    init = json.loads((tmp_path / "stage-rl" / "init_from.json").read_text())
    assert init["run"] == "stage-sft" and init["folder"] == "final", init  # the lineage

    async def runs():
        async with get_client() as client:
            flow_runs = await client.read_flow_runs(limit=200)
            by_name = {r.name: r for r in flow_runs}
            parent = by_name["stage-sft-then-stage-rl"]
            children = [r for r in flow_runs if r.parent_task_run_id is not None
                        and (await client.read_task_run(r.parent_task_run_id)).flow_run_id == parent.id]
            return parent, children

    parent, children = asyncio.run(runs())
    assert parent.state.is_completed()
    assert sorted(r.name for r in children) == ["stage-rl", "stage-sft"]  # both stages are its subflows
